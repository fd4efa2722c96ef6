//! Batches: each message settled on its own, within the bound, in order within its
//! ordering group.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_consumer::{Cause, DeadLetterReason, Settled};
use idem_core::{Context, Error, WorkError, done};

use crate::common::{Settle, TestMessage};
use crate::support::consumer;

#[tokio::test]
async fn a_batch_settles_each_message_on_its_own_in_order_within_its_bound() {
    let consumer = consumer().concurrency(NonZeroUsize::new(3).unwrap());
    let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let runs = Arc::new(AtomicUsize::new(0));
    // Messages 0..12: every fourth fails for good, and message 5 comes twice in a row.
    let mut batch: Vec<TestMessage> = (0..12)
        .map(|i| TestMessage::new(&format!("m-{i}"), &i.to_string()))
        .collect();
    batch.insert(6, TestMessage::new("m-5", "5").delivered(2));
    let work = |_ctx: Context, payload: Bytes| {
        let (running, most, runs) = (Arc::clone(&running), Arc::clone(&most), Arc::clone(&runs));
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
            running.fetch_sub(1, Ordering::SeqCst);
            let n: u32 = std::str::from_utf8(&payload).unwrap().parse().unwrap();
            if n % 4 == 3 {
                Err(WorkError::Permanent(n))
            } else {
                Ok(n)
            }
        }
    };
    let settled = consumer.handle_batch(&batch, work).await;
    assert_eq!(settled.len(), batch.len());
    for (position, (message, settled)) in batch.iter().zip(&settled).enumerate() {
        let settled = settled.as_ref().unwrap();
        if position == 6 {
            // The second delivery of m-5: in flight beside the first (naked), or after it
            // (a replay, acked); never run.
            match settled {
                Settled::Retried {
                    cause: Cause::Idem(Error::InFlight { .. }),
                    ..
                } => {
                    assert!(matches!(message.settlements()[..], [Settle::Nak(_)]))
                }
                Settled::Acked {
                    value: 5,
                    replayed: true,
                } => {
                    assert_eq!(message.settlements(), [Settle::Ack])
                }
                other => panic!("{other:?}"),
            }
            continue;
        }
        let i = if position > 6 { position - 1 } else { position } as u32;
        if i % 4 == 3 {
            assert!(
                matches!(
                    settled,
                    Settled::DeadLettered {
                        reason: DeadLetterReason::Failed,
                        ..
                    }
                ),
                "{i}: {settled:?}"
            );
            assert_eq!(
                message.settlements(),
                [Settle::DeadLetter(DeadLetterReason::Failed)]
            );
        } else {
            assert!(
                matches!(settled, Settled::Acked { value, .. } if *value == i),
                "{i}: {settled:?}"
            );
            assert_eq!(message.settlements(), [Settle::Ack]);
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 12, "each message once");
    assert!(
        most.load(Ordering::SeqCst) <= 3,
        "at most 3 at once: {}",
        most.load(Ordering::SeqCst)
    );
    assert!(
        most.load(Ordering::SeqCst) >= 2,
        "the batch ran concurrently"
    );
}

#[tokio::test]
async fn a_slow_message_never_keeps_the_rest_of_its_batch_from_starting() {
    let consumer = consumer().concurrency(NonZeroUsize::new(2).unwrap());
    let fast_done = Arc::new(AtomicUsize::new(0));
    let batch: Vec<TestMessage> = std::iter::once(TestMessage::new("slow", "slow"))
        .chain((0..5).map(|i| TestMessage::new(&format!("fast-{i}"), "fast")))
        .collect();
    let work = |_ctx: Context, payload: Bytes| {
        let fast_done = Arc::clone(&fast_done);
        async move {
            if &payload[..] == b"slow" {
                // Finishes only once every fast message has, so a batch that waited for
                // its head before starting more would never end (bounded below).
                while fast_done.load(Ordering::SeqCst) < 5 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            } else {
                fast_done.fetch_add(1, Ordering::SeqCst);
            }
            done(payload.len())
        }
    };
    let settled =
        tokio::time::timeout(Duration::from_secs(10), consumer.handle_batch(&batch, work))
            .await
            .expect("the fast messages ran past the slow one");
    let values: Vec<usize> = settled
        .into_iter()
        .map(|s| match s.unwrap() {
            Settled::Acked { value, .. } => value,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(values, [4, 4, 4, 4, 4, 4], "answers in the batch's order");
}

#[tokio::test]
async fn an_ordering_group_runs_in_order_and_none_overtakes_a_message_not_acked() {
    let consumer = consumer();
    let ran = Arc::new(std::sync::Mutex::new(Vec::new()));
    let work = |_ctx: Context, payload: Bytes| {
        ran.lock()
            .unwrap()
            .push(String::from_utf8(payload.to_vec()).unwrap());
        async move {
            match &payload[..] {
                b"a1" => Err(WorkError::Retryable("busy".to_owned())),
                b"b1" => {
                    // Slow: b2 still waits its turn.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok(1u8)
                }
                _ => Ok(1u8),
            }
        }
    };
    let batch = [
        TestMessage::new("a1", "a1").in_group("A"),
        TestMessage::new("b1", "b1").in_group("B"),
        TestMessage::new("a2", "a2").in_group("A"),
        TestMessage::new("b2", "b2").in_group("B"),
        TestMessage::new("c1", "c1"),
    ];
    let settled = consumer.handle_batch(&batch, work).await;
    assert!(
        matches!(
            settled[0],
            Ok(Settled::Retried {
                cause: Cause::Work(_),
                ..
            })
        ),
        "{settled:?}"
    );
    assert!(
        settled[1].as_ref().is_ok_and(Settled::is_acked),
        "{settled:?}"
    );
    assert!(
        matches!(
            settled[2],
            Ok(Settled::Retried {
                delay: Duration::ZERO,
                cause: Cause::BehindUnacked
            })
        ),
        "{settled:?}"
    );
    assert!(
        settled[3].as_ref().is_ok_and(Settled::is_acked),
        "{settled:?}"
    );
    assert!(
        settled[4].as_ref().is_ok_and(Settled::is_acked),
        "{settled:?}"
    );
    assert_eq!(batch[2].settlements(), [Settle::Nak(Duration::ZERO)]);
    let ran = ran.lock().unwrap().clone();
    assert!(!ran.contains(&"a2".to_owned()), "a2 overtook a1: {ran:?}");
    let position = |name: &str| ran.iter().position(|r| r == name).unwrap();
    assert!(position("b1") < position("b2"), "{ran:?}");
}
