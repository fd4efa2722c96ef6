//! A worker process: consumes one stream or queue and applies each order to its SQLite
//! ledger, through idem-consumer's [`Consumer`] or straight.

use std::path::Path;
use std::time::Duration;

use futures_util::TryStreamExt;
use idem_consumer::{Backoff, Consumer, Message, Settled};
use idem_core::{BoxError, Idempotency, WorkError};
use idem_sqlite::SqliteStore;

use crate::Mode;
use crate::broker::{self, Broker, Order, PREFETCH};
use crate::ledger::{self, Ledger, Receipt};
use crate::report::{Report, Settle};

/// The slow downstream after the effect (a notification, a call to a partner): while it
/// runs the order is applied but not acked, and a kill there makes the broker deliver it
/// again.
pub(crate) const DOWNSTREAM: Duration = Duration::from_millis(100);

/// How long a killed worker holds an order before another may take it over.
pub(crate) const LEASE: Duration = Duration::from_millis(500);

/// The wait before a failed delivery comes back: short, the demo is short.
const RETRY: Duration = Duration::from_millis(100);

/// How a worker handles a delivery: with idem when it has a consumer, straight without.
struct Handler {
    /// The ledger orders are applied to.
    ledger: Ledger,
    /// With idem: the consumer whose store shares the ledger's file.
    consumer: Option<Consumer<SqliteStore>>,
}

impl Handler {
    fn open(mode: Mode, db: &Path) -> Result<Self, BoxError> {
        Ok(match mode {
            Mode::Protected => {
                let store = SqliteStore::builder(db)
                    .busy_timeout(ledger::BUSY_TIMEOUT)
                    .build()?;
                let ledger = Ledger::open(db, Some(store.clone()))?;
                let idem = Idempotency::builder(store).lease(LEASE).build()?;
                let consumer = Consumer::new(idem).backoff(Backoff::new(RETRY, 10 * RETRY)?);
                Handler {
                    ledger,
                    consumer: Some(consumer),
                }
            }
            Mode::Unprotected => Handler {
                ledger: Ledger::open(db, None)?,
                consumer: None,
            },
        })
    }

    /// Handles one delivery and reports it to the parent.
    async fn handle(&self, message: Box<dyn Message>) {
        // A first delivery counts 1 on every broker (RabbitMQ's classic queues count no
        // further: a redelivery there is `None`).
        let redelivered = message.delivery_count() != Some(1);
        Report::Delivered { redelivered }.send();
        let settle = match &self.consumer {
            Some(consumer) => protected(consumer, &self.ledger, &*message).await,
            None => unprotected(&self.ledger, &*message).await,
        };
        Report::Settled {
            settle,
            redelivered,
        }
        .send();
    }
}

/// Through idem: a redelivery of an order applied before replays its receipt and is
/// acked; one whose worker died before the commit takes the order over once its lease
/// ends.
async fn protected(
    consumer: &Consumer<SqliteStore>,
    ledger: &Ledger,
    message: &dyn Message,
) -> Settle {
    let settled = consumer
        .handle(message, |ctx, payload| async move {
            let order: Order = serde_json::from_slice(&payload)
                .map_err(|err| WorkError::Permanent(format!("not an order: {err}")))?;
            if ctx.resumed() {
                Report::TakenOver.send();
            }
            let applied = ledger
                .commit(Some(ctx), move |tx| {
                    ledger::apply_order(tx, &order.order, order.cents)
                })
                .await;
            match applied {
                Ok(Some(receipt)) => {
                    tokio::time::sleep(DOWNSTREAM).await;
                    Ok::<Receipt, WorkError<String>>(receipt)
                }
                Ok(None) => Err(WorkError::Retryable(
                    "another worker took the order over".to_owned(),
                )),
                Err(err) => Err(WorkError::Retryable(err.to_string())),
            }
        })
        .await;
    match settled {
        Ok(Settled::Acked {
            replayed: false, ..
        }) => Settle::Applied,
        Ok(Settled::Acked { replayed: true, .. }) => Settle::Replayed,
        Ok(Settled::DeadLettered { reason, cause }) => {
            Report::Failed(format!("an order was dead-lettered ({reason}): {cause}")).send();
            Settle::DeadLettered
        }
        Ok(_) => Settle::Retried,
        Err(_) => Settle::Unsettled,
    }
}

/// Without idem: apply, call the downstream, ack. A redelivery applies the order again.
async fn unprotected(ledger: &Ledger, message: &dyn Message) -> Settle {
    let order: Order = match serde_json::from_slice(message.payload()) {
        Ok(order) => order,
        Err(err) => {
            Report::Failed(format!("not an order: {err}")).send();
            let _ = message
                .dead_letter(idem_consumer::DeadLetterReason::Failed)
                .await;
            return Settle::DeadLettered;
        }
    };
    let applied = ledger
        .commit(None, move |tx| {
            ledger::apply_order(tx, &order.order, order.cents)
        })
        .await;
    if applied.is_err() {
        return match message.nak(RETRY).await {
            Ok(()) => Settle::Retried,
            Err(_) => Settle::Unsettled,
        };
    }
    tokio::time::sleep(DOWNSTREAM).await;
    match message.ack().await {
        Ok(()) => Settle::Applied,
        Err(_) => Settle::Unsettled,
    }
}

/// The worker process: consumes `source` until the parent closes its stdin or kills it.
pub(crate) async fn run(
    broker: Broker,
    mode: Mode,
    url: &str,
    source: &str,
    db: &Path,
) -> Result<(), BoxError> {
    let mut stop = crate::report::stop_signal();
    let handler = Handler::open(mode, db)?;
    let deliveries = broker::deliveries(broker, url, source).await?;
    let consume = deliveries.try_for_each_concurrent(PREFETCH, |message| {
        let handler = &handler;
        async move {
            handler.handle(message).await;
            Ok(())
        }
    });
    tokio::select! {
        consumed = consume => match consumed {
            Ok(()) => Err(format!("{source}: the broker ended the stream of deliveries").into()),
            Err(err) => Err(format!("{source}: the stream of deliveries failed: {err}").into()),
        },
        _ = stop.wait_for(|stop| *stop) => Ok(()),
    }
}
