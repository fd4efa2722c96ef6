//! The checkout service: a ledger in SQLite, debited by a handler with or without idem.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{Error, Fingerprint, Idempotency, Key, Lease, WorkError, WriteOutcome};
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
    /// The server says: try again.
    Retry,
}

/// Counters the summary prints.
#[derive(Default, Debug)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) executions: AtomicU64,
    pub(crate) replays: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) conflicts: AtomicU64,
    pub(crate) takeovers: AtomicU64,
    pub(crate) crashes: AtomicU64,
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

    /// Debits the ledger; with a lease, marks the key completed in the same transaction.
    async fn debit(
        &self,
        order: &str,
        cents: u64,
        lease: Option<Lease>,
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
            if let (Some(store), Some(lease)) = (store, lease) {
                let bytes = serde_json::to_vec(&receipt)?;
                if store.complete_in(&tx, &lease, &bytes)? == WriteOutcome::Fenced {
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
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let Some(idem) = &self.idem else {
            provider_latency().await;
            if crash {
                self.counters.crashes.fetch_add(1, Ordering::Relaxed);
                return Answer::Crashed;
            }
            return match self.debit(order, cents, None).await {
                Ok(_) => {
                    self.counters.executions.fetch_add(1, Ordering::Relaxed);
                    Answer::Paid
                }
                Err(_) => Answer::Retry,
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
            match self.debit(order, cents, Some(ctx.lease())).await {
                Ok(Some(receipt)) => {
                    self.counters.executions.fetch_add(1, Ordering::Relaxed);
                    Ok(receipt)
                }
                Ok(None) => Err(WorkError::Retryable("fenced".to_owned())),
                Err(err) => Err(WorkError::Retryable(err.to_string())),
            }
        });
        // A crashed worker never answers: the client gives up after its timeout, which
        // drops the execution mid-work, exactly as a killed process leaves it.
        let Ok(result) = tokio::time::timeout(Duration::from_millis(50), execution).await else {
            self.counters.crashes.fetch_add(1, Ordering::Relaxed);
            return Answer::Crashed;
        };
        match result {
            Ok(done) => {
                if done.replayed {
                    self.counters.replays.fetch_add(1, Ordering::Relaxed);
                }
                Answer::Paid
            }
            Err(Error::InFlight { retry_after }) => {
                self.counters.in_flight.fetch_add(1, Ordering::Relaxed);
                Answer::InFlight(retry_after)
            }
            Err(Error::Mismatch) => {
                self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                Answer::Conflict
            }
            Err(_) => Answer::Retry,
        }
    }

    /// Orders debited, orders debited more than once, and the total debited.
    pub(crate) fn audit(&self) -> Result<(u64, u64, u64), idem_sqlite::rusqlite::Error> {
        let conn = self
            .ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        conn.query_row(
            "SELECT count(*), coalesce(sum(debits > 1), 0), coalesce(sum(total), 0)
             FROM (SELECT count(*) AS debits, sum(cents) AS total FROM ledger GROUP BY order_id)",
            [],
            |row| {
                Ok((
                    row.get::<_, i64>(0)? as u64,
                    row.get::<_, i64>(1)? as u64,
                    row.get::<_, i64>(2)? as u64,
                ))
            },
        )
    }
}
