//! Failing work and a failing store: retryable, hung and panicking work against the
//! attempt limit, a store outage that never dead-letters.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_consumer::nats::DEAD_LETTER_REASON;
use idem_consumer::{Backoff, Cause, Consumer, DeadLetterReason, Message, Settled};
use idem_core::{Context, Idempotency, MemoryStore, WorkError, done};

use crate::common::{FailingClaims, counted};
use crate::support::{assert_settled, next, publish, setup, source_of, subject};

#[tokio::test]
async fn retryable_hung_and_panicking_work_ends_in_a_dead_letter_after_its_attempts() {
    let Some((js, mut pull, mut dlq)) = setup("IDEM_ATTEMPTS").await else {
        return;
    };
    publish(&js, subject(&pull, "orders"), Some("retryable"), "r").await;
    publish(&js, subject(&pull, "orders"), Some("hung"), "h").await;
    publish(&js, subject(&pull, "orders"), Some("panics"), "p").await;
    let source = source_of(&pull);
    let lease = Duration::from_millis(400);
    let consumer = Consumer::new(
        Idempotency::builder(MemoryStore::new())
            .lease(lease)
            .build()
            .unwrap(),
    )
    .backoff(Backoff::new(Duration::from_millis(100), Duration::from_millis(100)).unwrap())
    .max_attempts(std::num::NonZeroU64::new(2).unwrap())
    .work_timeout(Duration::from_millis(200));
    let runs = Arc::new(AtomicUsize::new(0));
    let work = |_ctx: Context, payload: Bytes| {
        runs.fetch_add(1, Ordering::SeqCst);
        async move {
            match &payload[..] {
                b"r" => Err(WorkError::Retryable("warehouse busy".to_owned())),
                b"h" => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    done(0u8).map_err(|_| WorkError::Permanent(String::new()))
                }
                _ => panic!("a bug in the handler"),
            }
        }
    };
    let mut messages = pull.messages().await.expect("subscribe");
    let mut seen = Vec::new();
    while seen.len() < 6 {
        let message = source.wrap(next(&mut messages).await.into_inner());
        let id = message.id().unwrap().to_owned();
        let delivered = message.delivery_count().unwrap();
        let settled = consumer.handle(&message, work).await.unwrap();
        let what = match settled {
            Settled::Retried {
                cause: Cause::Work(_),
                ..
            } => "retried",
            Settled::Retried {
                cause: Cause::TimedOut { .. },
                delay,
            } => {
                assert_eq!(delay, lease);
                "timed out"
            }
            Settled::Retried {
                cause: Cause::Panicked,
                ..
            } => "panicked",
            Settled::DeadLettered {
                reason: DeadLetterReason::AttemptsExhausted,
                ..
            } => "exhausted",
            other => panic!("{id} #{delivered}: {other:?}"),
        };
        seen.push(format!("{id} #{delivered} {what}"));
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "hung #1 timed out",
            "hung #2 exhausted",
            "panics #1 panicked",
            "panics #2 exhausted",
            "retryable #1 retried",
            "retryable #2 exhausted",
        ]
    );
    assert_eq!(runs.load(Ordering::SeqCst), 6);
    assert_settled(&mut pull).await;
    let info = dlq.info().await.expect("dead-letter stream info");
    assert_eq!(info.state.messages, 3);
    for sequence in 1..=3 {
        let dead = dlq.get_raw_message(sequence).await.expect("a dead letter");
        assert_eq!(
            dead.headers.get(DEAD_LETTER_REASON).map(|v| v.as_str()),
            Some("attempts-exhausted")
        );
    }
}

#[tokio::test]
async fn a_store_outage_redelivers_the_message_and_never_dead_letters_it() {
    let Some((js, mut pull, dlq)) = setup("IDEM_STORE_DOWN").await else {
        return;
    };
    publish(&js, subject(&pull, "orders"), Some("order-1"), "2 mugs").await;
    let source = source_of(&pull);
    // A failover: the first two claims meet a read-only replica.
    let store = FailingClaims::new(2);
    let consumer = Consumer::new(Idempotency::new(store))
        .backoff(Backoff::new(Duration::from_millis(100), Duration::from_millis(100)).unwrap())
        .max_attempts(std::num::NonZeroU64::new(2).unwrap());
    let runs = Arc::new(AtomicUsize::new(0));
    let mut messages = pull.messages().await.expect("subscribe");
    let mut seen = Vec::new();
    loop {
        let message = source.wrap(next(&mut messages).await.into_inner());
        match consumer.handle(&message, counted(&runs)).await.unwrap() {
            Settled::Retried {
                cause: Cause::Idem(idem_core::Error::Store(_)),
                ..
            } => seen.push("retried"),
            Settled::Acked {
                replayed: false, ..
            } => break,
            other => panic!("{other:?}"),
        }
    }
    // Past the attempt limit too: the limit counts the work's failures, not the store's.
    assert_eq!(seen, ["retried", "retried"]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_settled(&mut pull).await;
    let mut dlq = dlq;
    assert_eq!(dlq.info().await.unwrap().state.messages, 0);
}
