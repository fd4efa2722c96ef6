//! The settle table's failure rows: an unstorable result, a refused key, a spent key
//! budget, a stored answer this process cannot decrypt or decode.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_consumer::{Cause, Consumer, DeadLetterReason, Settled};
use idem_core::{Context, Error, Idempotency, MemoryStore, done};

use crate::common::{Settle, TestMessage, counted};
use crate::support::LEASE;

#[tokio::test]
async fn an_answer_this_process_cannot_decrypt_yet_is_redelivered_not_dead_lettered() {
    // One consumer already encrypts with key 2; this one only holds key 1 (a rotation
    // half rolled out). It must leave the message for a consumer that can read it.
    let store = Arc::new(MemoryStore::new());
    let with = |id: u32, secret: [u8; 32]| {
        Consumer::new(
            Idempotency::builder(Arc::clone(&store))
                .lease(LEASE)
                .codec(idem_core::Aes256GcmCodec::new(id, secret))
                .build()
                .unwrap(),
        )
    };
    let (new, old) = (with(2, [2; 32]), with(1, [1; 32]));
    let runs = Arc::new(AtomicUsize::new(0));
    assert!(
        new.handle(&TestMessage::new("m-1", "x"), counted(&runs))
            .await
            .unwrap()
            .is_acked()
    );
    let redelivery = TestMessage::new("m-1", "x").delivered(2);
    let settled = old.handle(&redelivery, counted(&runs)).await.unwrap();
    assert!(
        matches!(
            settled,
            Settled::Retried {
                delay: LEASE,
                cause: Cause::Idem(Error::Codec { .. })
            }
        ),
        "{settled:?}"
    );
    assert_eq!(redelivery.settlements(), [Settle::Nak(LEASE)]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_settle_table_s_failure_rows_each_settle_as_the_table_says() {
    let runs = Arc::new(AtomicUsize::new(0));

    // A result too large to store: the work ran once, the failure is stored, dead letter.
    let small = Consumer::new(
        Idempotency::builder(MemoryStore::new())
            .max_response_bytes(8)
            .build()
            .unwrap(),
    );
    let big = TestMessage::new("m-big", "a payload whose length is stored as a long text");
    let too_large = |_ctx: Context, payload: Bytes| {
        runs.fetch_add(1, Ordering::SeqCst);
        async move { done("x".repeat(payload.len())) }
    };
    for _ in 0..2 {
        let settled = small.handle(&big, too_large).await.unwrap();
        assert!(
            matches!(
                settled,
                Settled::DeadLettered {
                    reason: DeadLetterReason::Unstorable,
                    cause: Cause::Idem(Error::Unstorable { .. })
                }
            ),
            "{settled:?}"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "an unstorable result never runs again"
    );

    // A key the key policy refuses: dead letter, nothing run.
    let strict = Consumer::new(
        Idempotency::builder(MemoryStore::new())
            .key_policy(idem_core::KeyPolicy::uuid())
            .build()
            .unwrap(),
    );
    let settled = strict
        .handle(&TestMessage::new("not-a-uuid", "x"), counted(&runs))
        .await
        .unwrap();
    assert!(
        matches!(
            settled,
            Settled::DeadLettered {
                reason: DeadLetterReason::KeyRefused,
                cause: Cause::Idem(Error::KeyRefused(_))
            }
        ),
        "{settled:?}"
    );

    // The key budget ran out: a nak after the budget's wait, never a dead letter.
    let budgeted = Consumer::new(
        Idempotency::builder(MemoryStore::new())
            .key_budget(idem_core::driver::TokenBucket::new(
                1,
                Duration::from_secs(60),
            ))
            .build()
            .unwrap(),
    );
    let first = budgeted
        .handle(&TestMessage::new("m-1", "x"), counted(&runs))
        .await
        .unwrap();
    assert!(first.is_acked(), "{first:?}");
    let second = TestMessage::new("m-2", "x");
    let settled = budgeted.handle(&second, counted(&runs)).await.unwrap();
    let Settled::Retried {
        delay,
        cause: Cause::Idem(Error::KeyBudgetExhausted { retry_after }),
    } = settled
    else {
        panic!("{settled:?}");
    };
    assert_eq!(delay, retry_after.max(Duration::from_millis(1)));
    assert_eq!(second.settlements(), [Settle::Nak(delay)]);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the budget's refusal runs nothing"
    );
}

#[tokio::test]
async fn an_unreadable_result_on_a_broker_that_does_not_count_is_dead_lettered_on_its_redelivery() {
    let store = MemoryStore::new();
    let consumer = Consumer::new(Idempotency::new(store));
    let runs = Arc::new(AtomicUsize::new(0));
    let stored = consumer
        .handle(&TestMessage::new("m-1", "x"), counted(&runs))
        .await
        .unwrap();
    assert!(stored.is_acked());
    let reads_text = |_ctx: Context, _payload: Bytes| async { done("text".to_owned()) };
    // A first delivery: nak'd for a lease, a replica of the other release may read it.
    let first = consumer
        .handle(&TestMessage::new("m-1", "x"), reads_text)
        .await
        .unwrap();
    assert!(
        matches!(first, Settled::Retried { delay, cause: Cause::Idem(Error::Decode(_)) } if delay == consumer.idempotency().lease()),
        "{first:?}"
    );
    // A redelivery the broker does not count (a RabbitMQ classic queue): dead letter.
    let mut uncounted = TestMessage::new("m-1", "x");
    uncounted.delivered = None;
    let settled = consumer.handle(&uncounted, reads_text).await.unwrap();
    assert!(
        matches!(
            settled,
            Settled::DeadLettered {
                reason: DeadLetterReason::Unreadable,
                ..
            }
        ),
        "{settled:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
