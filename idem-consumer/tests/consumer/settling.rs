//! Telling the broker: a refused ack, a consumer cut off mid-work, a slow store against
//! the work's timeout, an in-progress mark landing before the settlement.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_consumer::{Consumer, DeadLetterReason, Settled};
use idem_core::{Context, Idempotency, ManualClock, MemoryStore, done};

use crate::common::{FailingClaims, Settle, TestMessage, counted};
use crate::support::{LEASE, consumer};

#[tokio::test]
async fn an_ack_the_broker_refused_loses_nothing_the_redelivery_replays() {
    let consumer = consumer();
    let runs = Arc::new(AtomicUsize::new(0));
    let refused = TestMessage::new("m-1", "x").refusing();
    let err = consumer.handle(&refused, counted(&runs)).await.unwrap_err();
    assert_eq!(err.action(), idem_consumer::Settlement::Ack);
    assert!(err.to_string().contains("delivered again"), "{err}");
    let redelivery = TestMessage::new("m-1", "x").delivered(2);
    assert!(
        consumer
            .handle(&redelivery, counted(&runs))
            .await
            .unwrap()
            .replayed()
    );
    assert_eq!(redelivery.settlements(), [Settle::Ack]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_consumer_cut_off_mid_work_settles_nothing_and_the_redelivery_takes_over() {
    let clock = ManualClock::new();
    let idem = Idempotency::builder(MemoryStore::with_clock(clock.clone()))
        .lease(LEASE)
        .build()
        .unwrap();
    let consumer = Consumer::new(idem);
    let message = TestMessage::new("m-1", "x");
    let cut = tokio::time::timeout(
        Duration::from_millis(20),
        consumer.handle(&message, |_ctx, _payload| async {
            std::future::pending::<()>().await;
            done(0u8)
        }),
    )
    .await;
    assert!(cut.is_err(), "the work never finishes");
    assert!(message.settlements().is_empty(), "a crash settles nothing");

    clock.advance(LEASE + Duration::from_millis(1));
    let redelivery = TestMessage::new("m-1", "x").delivered(2);
    let settled = consumer
        .handle(&redelivery, |ctx, _payload| async move {
            done(u8::from(ctx.resumed()))
        })
        .await
        .unwrap();
    assert!(
        matches!(
            settled,
            Settled::Acked {
                value: 1,
                replayed: false
            }
        ),
        "{settled:?}"
    );
}

#[tokio::test]
async fn a_slow_store_is_never_taken_for_a_hung_work() {
    // Each claim and completion takes 300 ms; the work takes none, against a limit of
    // 100 ms and a single attempt.
    let consumer = Consumer::new(Idempotency::new(
        FailingClaims::new(0).slow(Duration::from_millis(300)),
    ))
    .work_timeout(Duration::from_millis(100))
    .max_attempts(std::num::NonZeroU64::MIN);
    let runs = Arc::new(AtomicUsize::new(0));
    let message = TestMessage::new("m-1", "x");
    let settled = consumer.handle(&message, counted(&runs)).await.unwrap();
    assert!(
        matches!(
            settled,
            Settled::Acked {
                value: 1,
                replayed: false
            }
        ),
        "{settled:?}"
    );
    assert_eq!(message.settlements(), [Settle::Ack]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A message whose in-progress marks take a while to land, logging marks and settlements
/// in the order they landed.
struct SlowMarks {
    inner: TestMessage,
    log: std::sync::Mutex<Vec<&'static str>>,
}

#[async_trait::async_trait]
impl idem_consumer::Message for SlowMarks {
    fn id(&self) -> Option<&str> {
        self.inner.id.as_deref()
    }
    fn source(&self) -> &str {
        &self.inner.source
    }
    fn payload(&self) -> &Bytes {
        &self.inner.payload
    }
    fn progress_interval(&self) -> Option<Duration> {
        Some(Duration::from_millis(50))
    }
    async fn in_progress(&self) -> Result<(), idem_consumer::SettleError> {
        tokio::time::sleep(Duration::from_millis(80)).await;
        self.log.lock().unwrap().push("mark");
        Ok(())
    }
    async fn ack(&self) -> Result<(), idem_consumer::SettleError> {
        self.log.lock().unwrap().push("ack");
        Ok(())
    }
    async fn nak(&self, _: Duration) -> Result<(), idem_consumer::SettleError> {
        self.log.lock().unwrap().push("nak");
        Ok(())
    }
    async fn dead_letter(&self, _: DeadLetterReason) -> Result<(), idem_consumer::SettleError> {
        self.log.lock().unwrap().push("dead letter");
        Ok(())
    }
}

#[tokio::test]
async fn a_mark_on_its_way_when_the_work_ends_lands_before_the_settlement() {
    let message = SlowMarks {
        inner: TestMessage::new("m-1", "x"),
        log: std::sync::Mutex::default(),
    };
    // The mark leaves at 50 ms and lands at 130; the work ends at 100.
    let work = |_ctx: Context, _payload: Bytes| async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        done(1u8)
    };
    let settled = consumer().handle(&message, work).await.unwrap();
    assert!(settled.is_acked());
    assert_eq!(*message.log.lock().unwrap(), ["mark", "ack"]);
}
