//! The checkout service: a ledger in SQLite, debited by a handler with or without idem.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{Context, Error, Fingerprint, Idempotency, Key, Outcome, WorkError, WriteOutcome};
use idem_sqlite::SqliteStore;
use idem_sqlite::rusqlite::{Connection, TransactionBehavior, params};
use serde::{Deserialize, Serialize};

/// How long a crashed worker holds an order before a retry may take over.
const LEASE: Duration = Duration::from_millis(250);

/// What the payment returns, and what idem replays.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Receipt {
    pub(crate) order: String,
    pub(crate) cents: u64,
    pub(crate) payment: i64,
}

/// What one request got back.
#[derive(Debug)]
pub(crate) enum Answer {
    Paid,
    InFlight(Duration),
    Conflict,
    /// The worker died mid-payment; the client saw a timeout.
    Crashed,
    /// The client gave up waiting (the request may still finish on the server).
    TimedOut,
    /// The server says: try again.
    Retry,
}

/// How the requests were answered: every request sent is counted in exactly one of these.
#[derive(Default, Debug)]
pub(crate) struct Counters {
    /// Paid, by the payment this request made.
    pub(crate) paid_now: AtomicU64,
    /// Paid, by replaying the payment an earlier request made.
    pub(crate) paid_replayed: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) conflicts: AtomicU64,
    pub(crate) retry: AtomicU64,
    /// The simulated crashes: the worker died mid-payment.
    pub(crate) crashed: AtomicU64,
    /// The client's timeout ran out on a worker that had not crashed.
    pub(crate) timed_out: AtomicU64,
    /// Not an answer: how many executions took over a key an earlier request abandoned.
    pub(crate) takeovers: AtomicU64,
}

impl Counters {
    /// Every request sent: the sum of the answers.
    pub(crate) fn requests(&self) -> u64 {
        [
            &self.paid_now,
            &self.paid_replayed,
            &self.in_flight,
            &self.conflicts,
            &self.retry,
            &self.crashed,
            &self.timed_out,
        ]
        .iter()
        .map(|n| n.load(Ordering::Relaxed))
        .sum()
    }

    fn count(&self, answer: &Answer, replayed: bool) {
        let counter = match answer {
            Answer::Paid if replayed => &self.paid_replayed,
            Answer::Paid => &self.paid_now,
            Answer::InFlight(_) => &self.in_flight,
            Answer::Conflict => &self.conflicts,
            Answer::Crashed => &self.crashed,
            Answer::TimedOut => &self.timed_out,
            Answer::Retry => &self.retry,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The ledger, as the audit reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Audit {
    /// Debit rows: payments that took money.
    pub(crate) debits: u64,
    /// Orders with at least one debit.
    pub(crate) orders: u64,
    /// Orders with more than one debit.
    pub(crate) orders_debited_twice: u64,
    /// Money taken, in cents.
    pub(crate) cents: u64,
}

pub(crate) struct Shop {
    ledger: Arc<Mutex<Connection>>,
    idem: Option<Idempotency<SqliteStore>>,
    pub(crate) counters: Counters,
}

/// A payment provider's round trip.
async fn provider_latency() {
    tokio::time::sleep(Duration::from_millis(3)).await;
}

impl Shop {
    /// A shop whose handler goes through idem, on the same SQLite file as its ledger.
    pub(crate) fn protected(path: &Path) -> Result<Self, Box<dyn std::error::Error>> {
        let store = SqliteStore::open(path)?;
        let idem = Idempotency::builder(store).lease(LEASE).build()?;
        Self::open(path, Some(idem))
    }

    /// The same shop, debiting on every request.
    pub(crate) fn unprotected(path: &Path) -> Result<Self, Box<dyn std::error::Error>> {
        Self::open(path, None)
    }

    fn open(
        path: &Path,
        idem: Option<Idempotency<SqliteStore>>,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let ledger = Connection::open(path)?;
        ledger.busy_timeout(Duration::from_secs(10))?;
        ledger.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE IF NOT EXISTS ledger (
                 payment  INTEGER PRIMARY KEY,
                 order_id TEXT    NOT NULL,
                 cents    INTEGER NOT NULL
             );",
        )?;
        Ok(Self {
            ledger: Arc::new(Mutex::new(ledger)),
            idem,
            counters: Counters::default(),
        })
    }

    /// Debits the ledger; inside an execution, marks the key completed in the same
    /// transaction.
    async fn debit(
        &self,
        order: &str,
        cents: u64,
        ctx: Option<Context>,
    ) -> Result<Option<Receipt>, Box<dyn std::error::Error + Send + Sync>> {
        let ledger = Arc::clone(&self.ledger);
        let store = self.idem.as_ref().map(|idem| idem.store().clone());
        let order = order.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut conn = ledger
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT INTO ledger (order_id, cents) VALUES (?1, ?2)",
                params![order, cents as i64],
            )?;
            let receipt = Receipt {
                order,
                cents,
                payment: tx.last_insert_rowid(),
            };
            if let (Some(store), Some(ctx)) = (store, ctx) {
                let completion = ctx.prepare_completion(&receipt)?;
                if store.complete_in(&tx, &completion)? == WriteOutcome::Fenced {
                    // Another worker owns the order now: this debit must not happen.
                    return Ok(None);
                }
            }
            tx.commit()?;
            Ok(Some(receipt))
        })
        .await?
    }

    /// One request for `order`. With `crash`, the worker dies after calling the provider
    /// and before the debit commits.
    pub(crate) async fn request(&self, order: &str, cents: u64, crash: bool) -> Answer {
        let (answer, replayed) = self.answer(order, cents, crash).await;
        self.counters.count(&answer, replayed);
        answer
    }

    async fn answer(&self, order: &str, cents: u64, crash: bool) -> (Answer, bool) {
        let Some(idem) = &self.idem else {
            provider_latency().await;
            if crash {
                return (Answer::Crashed, false);
            }
            return match self.debit(order, cents, None).await {
                Ok(_) => (Answer::Paid, false),
                Err(_) => (Answer::Retry, false),
            };
        };
        let key = Key::new("shop/checkout", order).expect("order ids are valid keys");
        let fingerprint = Fingerprint::builder()
            .field(order)
            .field(cents.to_be_bytes())
            .finish();
        let execution = idem.execute(&key, fingerprint, |ctx| async move {
            if ctx.resumed() {
                self.counters.takeovers.fetch_add(1, Ordering::Relaxed);
            }
            provider_latency().await;
            if crash {
                // The process dies here: nothing after this point ever runs.
                std::future::pending::<()>().await;
            }
            match self.debit(order, cents, Some(ctx)).await {
                Ok(Some(receipt)) => Ok(receipt),
                Ok(None) => Err(WorkError::Retryable("fenced".to_owned())),
                Err(err) => Err(WorkError::Retryable(err.to_string())),
            }
        });
        // A crashed worker never answers: the client gives up after its timeout, which
        // drops the execution mid-work, exactly as a killed process leaves it.
        let Ok(result) = tokio::time::timeout(Duration::from_millis(50), execution).await else {
            return (
                if crash {
                    Answer::Crashed
                } else {
                    Answer::TimedOut
                },
                false,
            );
        };
        match result {
            Ok(Outcome::Completed { replayed, .. }) => (Answer::Paid, replayed),
            Err(Error::InFlight { retry_after }) => (Answer::InFlight(retry_after), false),
            Err(Error::Mismatch) => (Answer::Conflict, false),
            _ => (Answer::Retry, false),
        }
    }

    /// What the ledger holds, read from the ledger itself.
    pub(crate) fn audit(&self) -> Result<Audit, idem_sqlite::rusqlite::Error> {
        let conn = self
            .ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        conn.query_row(
            "SELECT coalesce(sum(debits), 0), count(*), coalesce(sum(debits > 1), 0),
                    coalesce(sum(total), 0)
             FROM (SELECT count(*) AS debits, sum(cents) AS total FROM ledger GROUP BY order_id)",
            [],
            |row| {
                Ok(Audit {
                    debits: row.get::<_, i64>(0)? as u64,
                    orders: row.get::<_, i64>(1)? as u64,
                    orders_debited_twice: row.get::<_, i64>(2)? as u64,
                    cents: row.get::<_, i64>(3)? as u64,
                })
            },
        )
    }
}
