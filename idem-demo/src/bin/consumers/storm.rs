//! The storm: a fleet of workers per queue, one of them SIGKILLed mid-message every
//! 100-200 ms until every order is in every ledger, then the redeliveries drained.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use idem_core::BoxError;
use idem_sqlite::rusqlite::Connection;

use crate::broker::{ACK_WAIT, Broker, Brokers};
use crate::fleet::Fleet;
use crate::ledger;
use crate::{Mode, Random};

/// After the last kill, how long the queues get to drain past JetStream's ack wait.
const DRAIN: Duration = Duration::from_secs(4);

/// On RabbitMQ, a delivery put back less than this long ago may still be waiting out its
/// nak's delay in the worker (at most the lease, or the retry backoff's largest step).
const NAK_DELAY: Duration = Duration::from_millis(1200);

/// One stream or queue, its ledger, and the workers consuming it.
pub(crate) struct Queue {
    /// Its broker.
    pub(crate) broker: Broker,
    /// With idem or without.
    pub(crate) mode: Mode,
    /// The stream's or queue's name.
    pub(crate) source: String,
    /// The workers.
    pub(crate) fleet: Fleet,
    /// The parent's connection on the ledger file, to watch progress and audit.
    pub(crate) ledger: Connection,
    /// What the broker still held after the workers stopped.
    pub(crate) left: u64,
}

impl Queue {
    /// Starts `workers` worker processes on `source`, applying orders to `db`.
    pub(crate) fn start(
        broker: Broker,
        mode: Mode,
        url: &str,
        source: String,
        db: PathBuf,
        workers: usize,
    ) -> Result<Self, BoxError> {
        let ledger = ledger::create(&db, mode)?;
        let args: Vec<OsString> = vec![
            "--worker".into(),
            broker.code().into(),
            "--mode".into(),
            mode.code().into(),
            "--source".into(),
            source.clone().into(),
            "--db".into(),
            db.into_os_string(),
            "--url".into(),
            url.into(),
        ];
        let label = format!("{broker} workers {}", mode.label());
        let fleet = Fleet::spawn(label, args, workers)?;
        Ok(Self {
            broker,
            mode,
            source,
            fleet,
            ledger,
            left: 0,
        })
    }

    /// How many distinct orders the ledger holds.
    fn applied(&self) -> Result<u64, BoxError> {
        let count: i64 = self
            .ledger
            .query_row("SELECT count(DISTINCT order_id) FROM ledger", [], |row| {
                row.get(0)
            })
            .map_err(|err| format!("cannot read the ledger of {}: {err}", self.source))?;
        Ok(count as u64)
    }

    /// True when the broker has nothing left to deliver or see acked.
    async fn drained(&self, brokers: &Brokers) -> Result<bool, BoxError> {
        let pending = brokers.pending(self.broker, &self.source).await?;
        Ok(match self.broker {
            // These count what was delivered and not acked too.
            Broker::Nats | Broker::Redis | Broker::Sqs => pending == 0,
            // RabbitMQ counts only the ready messages: the workers say whether they hold
            // any, and a nak in its delay still holds one.
            Broker::Rabbitmq => {
                pending == 0
                    && self.fleet.idle()
                    && self
                        .fleet
                        .tally
                        .since_last_retry()
                        .is_none_or(|since| since > NAK_DELAY)
            }
        })
    }
}

/// How long the storm took.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// From the first worker to the last order applied, kills included.
    pub(crate) storm: Duration,
    /// Draining the redeliveries after it.
    pub(crate) drain: Duration,
    /// Whether every queue drained.
    pub(crate) drained: bool,
}

/// Runs the storm on `queues` until every ledger holds all `orders` (or `deadline`
/// passes: an error), drains the redeliveries, and stops the workers.
pub(crate) async fn run(
    brokers: &Brokers,
    queues: &mut [Queue],
    orders: u64,
    random: &mut Random,
    deadline: Instant,
) -> Result<Timing, BoxError> {
    let started = Instant::now();
    let mut next = 0;
    loop {
        for queue in queues.iter_mut() {
            queue.fleet.respawn_exited()?;
        }
        let mut remaining = Vec::new();
        for (i, queue) in queues.iter().enumerate() {
            if queue.applied()? < orders {
                remaining.push(i);
            }
        }
        if remaining.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            return Err(stuck(queues, orders));
        }
        tokio::time::sleep(Duration::from_millis(100 + random.below(101))).await;
        // A random worker holding unsettled messages, on each of the next two queues not
        // done yet in turn: every queue gets its share of the kills, however fast it
        // drains and however many queues there are.
        let turns: Vec<(usize, Vec<_>)> = (0..queues.len())
            .map(|i| (next + i) % queues.len())
            .filter(|q| remaining.contains(q))
            .filter_map(|q| {
                let busy = queues[q].fleet.busy();
                (!busy.is_empty()).then_some((q, busy))
            })
            .take(2)
            .collect();
        for (q, busy) in turns {
            queues[q]
                .fleet
                .kill(busy[random.below(busy.len() as u64) as usize])?;
            next = q + 1;
        }
    }
    let storm = started.elapsed();

    // Every order is applied: the kills stop, and the redeliveries of the last ones they
    // caused come in (a JetStream message comes back when its ack wait ends).
    let drain_started = Instant::now();
    let drain_deadline = drain_started + ACK_WAIT + DRAIN;
    let mut quiet_checks = 0;
    let drained = loop {
        for queue in queues.iter_mut() {
            queue.fleet.respawn_exited()?;
        }
        let mut all = true;
        for queue in queues.iter() {
            all &= queue.drained(brokers).await?;
        }
        // Twice in a row: a message between a broker's buffer and a worker's code is in
        // neither count for an instant.
        quiet_checks = if all { quiet_checks + 1 } else { 0 };
        if quiet_checks >= 2 {
            break true;
        }
        if Instant::now() >= drain_deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let drain = drain_started.elapsed();
    for queue in queues.iter_mut() {
        queue.fleet.kill_all();
    }
    // RabbitMQ requeues what a killed connection held: give it a moment to count them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for queue in queues.iter_mut() {
        queue.left = brokers.pending(queue.broker, &queue.source).await?;
    }
    Ok(Timing {
        storm,
        drain,
        drained,
    })
}

/// The error for a storm that did not finish in time: how far each queue got.
fn stuck(queues: &[Queue], orders: u64) -> BoxError {
    let mut message = String::from("the storm did not finish in time:");
    for queue in queues {
        let applied = queue
            .applied()
            .map_or_else(|err| err.to_string(), |n| n.to_string());
        message.push_str(&format!(
            "\n  {} {}: {applied} of {orders} orders applied, {} kills",
            queue.broker,
            queue.mode.label(),
            queue.fleet.kills
        ));
        for error in queue.fleet.tally.errors() {
            message.push_str(&format!("\n    {error}"));
        }
    }
    message.push_str("\n  Are the brokers still up? `scripts/services.sh status` says.");
    message.into()
}
