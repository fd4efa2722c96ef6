//! # idem-demo's consumer storm
//!
//! Queue consumers on NATS JetStream, RabbitMQ, Redis Streams and SQS apply orders to a SQLite ledger, and a
//! scheduled job settles every 100 ms, while their processes are SIGKILLed and restarted.
//! Brokers deliver at least once and two schedulers fire the same slot, so without idem
//! some orders are applied twice and slots run twice; with idem-consumer each order and
//! each slot has its effect once. Then the ledgers are audited.
//!
//! ```sh
//! eval "$(scripts/services.sh start nats rabbitmq redis sqs)"
//! cargo run --release -p idem-demo --bin consumers
//! ```
//!
//! The parent publishes the orders, runs the worker and scheduler processes (this same
//! program, with hidden arguments), kills them, and audits. With idem, each effect is
//! written in the same SQLite transaction as idem's record of it
//! (`Context::prepare_completion` and `SqliteStore::complete_in`): a kill leaves both or
//! neither, and a redelivery either replays or takes over.
//!
//! ## Where things live
//!
//! - `broker.rs`: streams, queues, publishing, and the workers' deliveries through
//!   idem-consumer's adapters; `worker.rs`: a worker process; `ledger.rs`: the SQLite
//!   effects and their transaction; `report.rs`: what a child tells the parent.
//! - `fleet.rs`: spawning, killing and stopping the children; `storm.rs`: the kills and
//!   the drain; `schedule.rs`: the scheduled job, its processes and its kills;
//!   `audit.rs`: the ledgers read back, the tables, the check.

mod audit;
mod broker;
mod fleet;
mod ledger;
mod report;
mod schedule;
mod storm;
mod worker;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use idem_core::BoxError;

use crate::broker::{ACK_WAIT, Broker, Brokers, Order, PREFETCH, Urls};
use crate::storm::Queue;

/// The whole run's bound at the default size: past it the demo fails, saying how far it
/// got. Runs of over 1 500 orders a queue get [`PER_ORDER`] for each order instead.
const BOUND: Duration = Duration::from_secs(120);

/// What each order adds to the bound past the default size.
const PER_ORDER: Duration = Duration::from_millis(80);

/// The bound of a run of `orders` orders a queue.
fn bound(orders: u64) -> Duration {
    BOUND.max(PER_ORDER.saturating_mul(u32::try_from(orders).unwrap_or(u32::MAX)))
}

/// Queue consumers and a scheduled job on idem, their processes SIGKILLed mid-work.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// How many orders are published to each queue.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    orders: u64,
    /// Worker processes per queue (one queue per broker with idem, one without).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=16))]
    workers: u64,
    /// Seed for the amounts and the kills.
    #[arg(long, default_value_t = 2026)]
    seed: u64,
    /// The brokers to run on (all four by default).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "nats,rabbitmq,redis,sqs"
    )]
    brokers: Vec<Broker>,
    /// The NATS server (JetStream on); `scripts/services.sh start nats` sets the variable.
    #[arg(long, env = "IDEM_TEST_NATS_URL")]
    nats_url: Option<String>,
    /// The RabbitMQ server; `scripts/services.sh start rabbitmq` sets the variable.
    #[arg(long, env = "IDEM_TEST_RABBITMQ_URL")]
    amqp_url: Option<String>,
    /// The Redis server (for Redis Streams); `scripts/services.sh start redis` sets the
    /// variable.
    #[arg(long, env = "IDEM_TEST_REDIS_URL")]
    redis_url: Option<String>,
    /// The SQS-compatible server; `scripts/services.sh start sqs` sets the variable.
    #[arg(long, env = "IDEM_TEST_SQS_URL")]
    sqs_url: Option<String>,
    /// Keep the SQLite files in this directory to inspect them (default: a temporary
    /// directory, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,

    /// A worker process consuming from this broker.
    #[arg(long, hide = true, value_enum)]
    worker: Option<Broker>,
    /// A scheduler process.
    #[arg(long, hide = true)]
    scheduler: bool,
    /// A child's mode.
    #[arg(long, hide = true, value_enum)]
    mode: Option<Mode>,
    /// A worker's stream or queue.
    #[arg(long, hide = true)]
    source: Option<String>,
    /// A child's SQLite file.
    #[arg(long, hide = true)]
    db: Option<PathBuf>,
    /// A worker's broker URL.
    #[arg(long, hide = true)]
    url: Option<String>,
    /// A scheduler's first slot, in ms since the Unix epoch.
    #[arg(long, hide = true)]
    from_ms: Option<u64>,
}

/// With idem or without.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mode {
    /// Through idem-consumer, the effect and idem's record in one transaction.
    Protected,
    /// The effect on every delivery, every firing.
    Unprotected,
}

impl Mode {
    /// The name on the command line and in file names.
    pub(crate) fn code(self) -> &'static str {
        match self {
            Mode::Protected => "protected",
            Mode::Unprotected => "unprotected",
        }
    }

    /// "with idem" or "without idem".
    pub(crate) fn label(self) -> &'static str {
        match self {
            Mode::Protected => "with idem",
            Mode::Unprotected => "without idem",
        }
    }
}

/// SplitMix64: tiny, seedable, good enough for amounts and victims.
pub(crate) struct Random(u64);

impl Random {
    /// The next number.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (which is not zero).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = if let Some(broker) = args.worker {
        child(|| async {
            let (Some(mode), Some(url), Some(source), Some(db)) =
                (args.mode, &args.url, &args.source, &args.db)
            else {
                return Err("--worker needs --mode, --url, --source and --db".into());
            };
            worker::run(broker, mode, url, source, db).await
        })
    } else if args.scheduler {
        child(|| async {
            let (Some(mode), Some(db), Some(from_ms)) = (args.mode, &args.db, args.from_ms) else {
                return Err("--scheduler needs --mode, --db and --from-ms".into());
            };
            schedule::scheduler(mode, db, from_ms).await
        })
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(BoxError::from)
            .and_then(|runtime| runtime.block_on(demo(args)))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("consumers: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a child process's work on a runtime of one thread: a dozen children share two
/// cores with the brokers.
fn child<F: Future<Output = Result<(), BoxError>>>(
    work: impl FnOnce() -> F,
) -> Result<(), BoxError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(work())
}

/// The URL in `url`, or an error that says how to start the broker.
fn required(url: Option<String>, flag: &str, variable: &str) -> Result<String, BoxError> {
    url.filter(|url| !url.is_empty()).ok_or_else(|| {
        format!(
            "no broker URL: pass {flag} or set {variable}; \
             `eval \"$(scripts/services.sh start nats rabbitmq redis sqs)\"` starts NATS, \
             RabbitMQ, Redis and a local SQS server on 127.0.0.1 and sets the variables"
        )
        .into()
    })
}

/// The parent: brokers, storm, scheduled job, audit.
async fn demo(args: Args) -> Result<(), BoxError> {
    let urls = Urls {
        nats: required(args.nats_url.clone(), "--nats-url", "IDEM_TEST_NATS_URL")?,
        amqp: required(
            args.amqp_url.clone(),
            "--amqp-url",
            "IDEM_TEST_RABBITMQ_URL",
        )?,
        redis: required(args.redis_url.clone(), "--redis-url", "IDEM_TEST_REDIS_URL")?,
        sqs: required(args.sqs_url.clone(), "--sqs-url", "IDEM_TEST_SQS_URL")?,
    };
    let brokers = Brokers::connect(&urls).await?;
    let keep = args.dir.is_some();
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("idem-demo-consumers-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)
        .map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
    let bound = bound(args.orders);
    let outcome = tokio::time::timeout(bound, run(&args, &brokers, &dir, &urls))
        .await
        .unwrap_or_else(|_| Err(format!("the demo did not finish within {bound:?}").into()));
    // The streams and queues go, whatever happened.
    for &broker in &args.brokers {
        for mode in [Mode::Protected, Mode::Unprotected] {
            brokers
                .delete(broker, &broker.source(mode, std::process::id()))
                .await;
        }
    }
    if keep {
        println!("  databases kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let verdict = outcome?;
    if verdict.failures.is_empty() {
        Ok(())
    } else {
        Err("the ledger check failed".into())
    }
}

/// A duration in seconds, one decimal.
fn seconds(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

/// The demo proper, inside the run's bound.
async fn run(
    args: &Args,
    brokers: &Brokers,
    dir: &Path,
    urls: &Urls,
) -> Result<audit::Verdict, BoxError> {
    let started = Instant::now();
    let mut random = Random(args.seed);
    let orders: Vec<Order> = (0..args.orders)
        .map(|i| Order {
            order: format!("order-{i}"),
            cents: 500 + 100 * random.below(50),
        })
        .collect();
    println!(
        "idem demo: queue consumers on NATS JetStream, RabbitMQ, Redis Streams and SQS, {} orders per queue, {} workers per queue (seed {})",
        args.orders, args.workers, args.seed
    );
    println!(
        "  each worker holds up to {PREFETCH} messages; per message it applies the order to a SQLite ledger, waits {} ms\n  \
         on a slow downstream, then acks. Every 100-200 ms a worker holding messages is SIGKILLed and replaced:\n  \
         JetStream, Redis Streams (claim idle) and SQS (visibility) redeliver its messages after {} s,\n  RabbitMQ as soon as its connection drops.\n  \
         Then two schedulers fire a job every {} ms for {} s; one of them is SIGKILLed mid-slot, twice.",
        worker::DOWNSTREAM.as_millis(),
        ACK_WAIT.as_secs(),
        schedule::PERIOD.as_millis(),
        schedule::RUN.as_secs()
    );

    let pid = std::process::id();
    let mut queues = Vec::new();
    // Every queue is filled before any worker starts: the storm then hits all at once,
    // however slow one broker is to publish to.
    for &broker in &args.brokers {
        for mode in [Mode::Protected, Mode::Unprotected] {
            let source = broker.source(mode, pid);
            brokers.prepare(broker, &source).await?;
            brokers.publish(broker, &source, &orders).await?;
        }
    }
    for &broker in &args.brokers {
        let url = urls.of(broker);
        for mode in [Mode::Protected, Mode::Unprotected] {
            let source = broker.source(mode, pid);
            let db = dir.join(format!("{}-{}.db", broker.code(), mode.code()));
            queues.push(Queue::start(
                broker,
                mode,
                url,
                source,
                db,
                args.workers as usize,
            )?);
        }
    }
    let deadline = Instant::now() + bound(args.orders) - Duration::from_secs(20);
    let timing = storm::run(brokers, &mut queues, args.orders, &mut random, deadline).await?;

    let schedule_started = Instant::now();
    let schedules = schedule::run(dir, &mut random).await?;
    let schedule_time = schedule_started.elapsed();

    let mut verdict = audit::Verdict::default();
    for pair in queues.chunks(2) {
        let [protected, unprotected] = pair else {
            unreachable!("two queues per broker");
        };
        audit::queue_table(
            protected.broker,
            protected,
            unprotected,
            args.orders,
            &mut verdict,
        )
        .map_err(|err| format!("cannot audit the ledgers: {err}"))?;
    }
    let [protected, unprotected] = &schedules[..] else {
        unreachable!("two schedules");
    };
    audit::schedule_table(protected, unprotected, &mut verdict)
        .map_err(|err| format!("cannot audit the job's runs: {err}"))?;
    println!();
    println!(
        "  time: {} in all; the storm {} (until every order was applied), its drain {}, the job {}",
        seconds(started.elapsed()),
        seconds(timing.storm),
        seconds(timing.drain),
        seconds(schedule_time)
    );
    let left: Vec<String> = queues
        .iter()
        .filter(|queue| queue.left > 0)
        .map(|queue| format!("{} on {} {}", queue.left, queue.broker, queue.mode.label()))
        .collect();
    if !timing.drained || !left.is_empty() {
        println!(
            "  note: the brokers still held deliveries when the workers stopped ({}); they would come back later",
            if left.is_empty() {
                "in flight".to_owned()
            } else {
                left.join(", ")
            }
        );
    }
    let fleets = queues
        .iter()
        .map(|queue| &queue.fleet)
        .chain(schedules.iter().map(|schedule| &schedule.fleet));
    for fleet in fleets {
        for error in fleet.tally.errors() {
            println!("  reported by the {}: {error}", fleet.label());
        }
    }
    println!();
    if verdict.failures.is_empty() {
        let doubles: Vec<String> = verdict
            .doubles_without
            .iter()
            .map(|(broker, n)| format!("{n} on {broker}"))
            .collect();
        println!(
            "  check: with idem, every order was applied exactly once on every broker and every slot ran once;\n  \
             without it, orders applied twice or more: {}; slots run twice or more: {} of {}.",
            doubles.join(", "),
            verdict.slots_doubled_without,
            verdict.slots_without
        );
    } else {
        for failure in &verdict.failures {
            println!("  check FAILED: {failure}");
        }
    }
    Ok(verdict)
}
