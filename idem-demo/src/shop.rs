//! The checkout service: a ledger in SQLite, debited by a handler with or without idem.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{
    Context, Error, Fingerprint, Idempotency, Key, Outcome, WorkError, store::WriteOutcome,
};

use crate::checkout::{self, Answer, Audit, Checkout, Counters};
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
        let ledger = crate::checkout::open_ledger(path)?;
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

    /// One request for `order`, and whether its answer was a replay. With `crash`, the
    /// worker dies after calling the provider and before the debit commits.
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

    /// What the ledger holds.
    pub(crate) fn audit(&self) -> Result<Audit, idem_sqlite::rusqlite::Error> {
        checkout::audit(
            &self
                .ledger
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

impl Checkout for Shop {
    async fn request(&self, order: &str, cents: u64, crash: bool) -> Answer {
        let (answer, replayed) = self.answer(order, cents, crash).await;
        self.counters.count(&answer, replayed);
        answer
    }

    fn counters(&self) -> &Counters {
        &self.counters
    }

    fn audit(&self) -> Result<Audit, Box<dyn std::error::Error>> {
        Ok(Shop::audit(self)?)
    }
}
