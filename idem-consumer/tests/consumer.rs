//! The consumer's settle table, row by row, on the memory store and a message double.

mod common;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{FailingClaims, Settle, TestMessage, counted};
use idem_consumer::{Backoff, BackoffError, Cause, Consumer, DeadLetterReason, Settled};
use idem_core::{
    Context, Error, Fingerprint, Idempotency, InFlightPolicy, ManualClock, MemoryStore, WorkError,
    done,
};

const LEASE: Duration = Duration::from_secs(30);

fn consumer() -> Consumer<MemoryStore> {
    Consumer::new(
        Idempotency::builder(MemoryStore::new())
            .lease(LEASE)
            .build()
            .unwrap(),
    )
}

#[tokio::test]
async fn a_redelivery_replays_and_is_acked_without_running_again() {
    let consumer = consumer();
    let runs = Arc::new(AtomicUsize::new(0));
    let first = TestMessage::new("m-1", "2 mugs");
    let redelivery = TestMessage::new("m-1", "2 mugs").delivered(2);

    let settled = consumer.handle(&first, counted(&runs)).await.unwrap();
    assert!(matches!(
        settled,
        Settled::Acked {
            value: 6,
            replayed: false
        }
    ));
    let settled = consumer.handle(&redelivery, counted(&runs)).await.unwrap();
    assert!(matches!(
        settled,
        Settled::Acked {
            value: 6,
            replayed: true
        }
    ));

    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(first.settlements(), [Settle::Ack]);
    assert_eq!(redelivery.settlements(), [Settle::Ack]);
}

#[tokio::test]
async fn a_permanent_failure_is_dead_lettered_and_stays_so_on_redelivery() {
    let consumer = consumer();
    let runs = Arc::new(AtomicUsize::new(0));
    let fail = |runs: Arc<AtomicUsize>| {
        move |_ctx: Context, _payload: Bytes| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Err::<u8, _>(WorkError::Permanent("unknown product".to_owned())) }
        }
    };
    for delivery in 1..=2 {
        let message = TestMessage::new("m-1", "a unicorn").delivered(delivery);
        match consumer
            .handle(&message, fail(Arc::clone(&runs)))
            .await
            .unwrap()
        {
            Settled::DeadLettered {
                reason: DeadLetterReason::Failed,
                cause: Cause::Work(error),
            } => {
                assert_eq!(error, "unknown product")
            }
            other => panic!("delivery {delivery}: {other:?}"),
        }
        assert_eq!(
            message.settlements(),
            [Settle::DeadLetter(DeadLetterReason::Failed)]
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the failure is stored and replayed"
    );
}

#[tokio::test]
async fn a_retryable_failure_is_redelivered_after_the_backoff_and_then_runs_again() {
    let consumer = consumer()
        .backoff(Backoff::new(Duration::from_millis(100), Duration::from_secs(1)).unwrap());
    let runs = Arc::new(AtomicUsize::new(0));
    let flaky = |runs: Arc<AtomicUsize>| {
        move |_ctx: Context, _payload: Bytes| {
            let run = runs.fetch_add(1, Ordering::SeqCst);
            async move {
                if run < 3 {
                    Err(WorkError::Retryable(format!("warehouse busy ({run})")))
                } else {
                    Ok(run)
                }
            }
        }
    };
    // Deliveries 1, 2, 3 fail and back off 100, 200, 400 ms; the fourth runs and acks.
    for (delivery, delay) in [(1, 100), (2, 200), (3, 400)] {
        let message = TestMessage::new("m-1", "x").delivered(delivery);
        let settled = consumer
            .handle(&message, flaky(Arc::clone(&runs)))
            .await
            .unwrap();
        assert!(
            matches!(settled, Settled::Retried { delay: d, cause: Cause::Work(_) } if d == Duration::from_millis(delay)),
            "delivery {delivery}: {settled:?}"
        );
        assert_eq!(
            message.settlements(),
            [Settle::Nak(Duration::from_millis(delay))]
        );
    }
    let message = TestMessage::new("m-1", "x").delivered(4);
    let settled = consumer
        .handle(&message, flaky(Arc::clone(&runs)))
        .await
        .unwrap();
    assert!(
        matches!(
            settled,
            Settled::Acked {
                value: 3,
                replayed: false
            }
        ),
        "{settled:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn an_unknown_effect_waits_for_the_lease_and_the_redelivery_takes_over_resuming() {
    let clock = ManualClock::new();
    let idem = Idempotency::builder(MemoryStore::with_clock(clock.clone()))
        .lease(LEASE)
        .build()
        .unwrap();
    let consumer = Consumer::new(idem);
    let debits = Arc::new(AtomicUsize::new(0));
    let work = |timeout: bool, debits: Arc<AtomicUsize>| {
        move |ctx: Context, _payload: Bytes| async move {
            ctx.step("debit", || async {
                debits.fetch_add(1, Ordering::SeqCst);
                done(())
            })
            .await
            .map_err(|e| e.map_err(|()| String::new()))?;
            if timeout {
                return Err(WorkError::Unknown("the carrier timed out".to_owned()));
            }
            Ok(ctx.resumed())
        }
    };
    let message = TestMessage::new("m-1", "x");
    let settled = consumer
        .handle(&message, work(true, Arc::clone(&debits)))
        .await
        .unwrap();
    assert!(
        matches!(settled, Settled::Retried { delay: LEASE, .. }),
        "{settled:?}"
    );

    // Redelivered early: still held.
    let early = TestMessage::new("m-1", "x").delivered(2);
    let settled = consumer
        .handle(&early, work(false, Arc::clone(&debits)))
        .await
        .unwrap();
    assert!(
        matches!(
            settled,
            Settled::Retried {
                cause: Cause::Idem(Error::InFlight { .. }),
                ..
            }
        ),
        "{settled:?}"
    );

    clock.advance(LEASE + Duration::from_secs(1));
    let late = TestMessage::new("m-1", "x").delivered(3);
    let settled = consumer
        .handle(&late, work(false, Arc::clone(&debits)))
        .await
        .unwrap();
    assert!(
        matches!(
            settled,
            Settled::Acked {
                value: true,
                replayed: false
            }
        ),
        "{settled:?}"
    );
    assert_eq!(
        debits.load(Ordering::SeqCst),
        1,
        "the checkpointed step is not run again"
    );
}

trait MapWorkError<E> {
    fn map_err<F>(self, f: impl FnOnce(E) -> F) -> WorkError<F>;
}

impl<E> MapWorkError<E> for WorkError<E> {
    fn map_err<F>(self, f: impl FnOnce(E) -> F) -> WorkError<F> {
        match self {
            WorkError::Permanent(e) => WorkError::Permanent(f(e)),
            WorkError::Retryable(e) => WorkError::Retryable(f(e)),
            WorkError::Unknown(e) => WorkError::Unknown(f(e)),
            WorkError::Interrupted(i) => WorkError::Interrupted(i),
            _ => unreachable!("no other kind of work error exists"),
        }
    }
}

#[tokio::test]
async fn a_duplicate_in_flight_is_naked_for_the_rest_of_the_lease() {
    let consumer = consumer();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let first = TestMessage::new("m-1", "x");
    let slow = consumer.handle(&first, |_ctx, _payload| async move {
        started_tx.send(()).unwrap();
        release_rx.await.unwrap();
        done(1u8)
    });
    let duplicate = TestMessage::new("m-1", "x").delivered(2);
    let other = async {
        started_rx.await.unwrap();
        let settled = consumer
            .handle(&duplicate, |_ctx, _payload| async { done(2u8) })
            .await
            .unwrap();
        release_tx.send(()).unwrap();
        settled
    };
    let (first_settled, second_settled) = tokio::join!(slow, other);
    assert!(matches!(
        first_settled.unwrap(),
        Settled::Acked {
            value: 1,
            replayed: false
        }
    ));
    match second_settled {
        Settled::Retried {
            delay,
            cause: Cause::Idem(Error::InFlight { retry_after }),
        } => {
            assert_eq!(delay, retry_after);
            assert!(delay > Duration::ZERO && delay <= LEASE, "{delay:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(duplicate.settlements()[..], [Settle::Nak(_)]));
}

#[tokio::test]
async fn with_a_waiting_driver_a_duplicate_gets_the_first_result_and_is_acked() {
    let idem = Idempotency::builder(MemoryStore::new())
        .in_flight(InFlightPolicy::Wait {
            timeout: Duration::from_secs(10),
        })
        .build()
        .unwrap();
    let consumer = Consumer::new(idem);
    let runs = Arc::new(AtomicUsize::new(0));
    let first = TestMessage::new("m-1", "x");
    let duplicate = TestMessage::new("m-1", "x").delivered(2);
    let slow = |runs: Arc<AtomicUsize>| {
        move |_ctx: Context, _payload: Bytes| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            done(7u8)
        }
    };
    let (a, b) = tokio::join!(
        consumer.handle(&first, slow(Arc::clone(&runs))),
        consumer.handle(&duplicate, slow(Arc::clone(&runs)))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a.is_acked() && b.is_acked(), "{a:?} {b:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(u8::from(a.replayed()) + u8::from(b.replayed()), 1);
}

#[tokio::test]
async fn an_id_reused_for_another_payload_is_dead_lettered_and_the_first_result_kept() {
    let consumer = consumer();
    let runs = Arc::new(AtomicUsize::new(0));
    consumer
        .handle(&TestMessage::new("m-1", "2 mugs"), counted(&runs))
        .await
        .unwrap();
    let reused = TestMessage::new("m-1", "9 plates");
    match consumer.handle(&reused, counted(&runs)).await.unwrap() {
        Settled::DeadLettered {
            reason: DeadLetterReason::KeyReused,
            cause: Cause::Idem(Error::Mismatch),
        } => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(
        reused.settlements(),
        [Settle::DeadLetter(DeadLetterReason::KeyReused)]
    );
    let again = TestMessage::new("m-1", "2 mugs");
    assert!(
        consumer
            .handle(&again, counted(&runs))
            .await
            .unwrap()
            .replayed()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_message_without_a_usable_key_is_dead_lettered_without_running() {
    let consumer = consumer();
    let runs = Arc::new(AtomicUsize::new(0));
    let no_id = TestMessage::new("", "x").without_id();
    let settled = consumer.handle(&no_id, counted(&runs)).await.unwrap();
    assert!(matches!(
        settled,
        Settled::DeadLettered {
            reason: DeadLetterReason::NoKey,
            cause: Cause::NoKey
        }
    ));
    for bad in ["", "line\nbreak", &"x".repeat(10_000)] {
        let message = TestMessage::new(bad, "x");
        let settled = consumer.handle(&message, counted(&runs)).await.unwrap();
        assert!(
            matches!(
                settled,
                Settled::DeadLettered {
                    reason: DeadLetterReason::BadKey,
                    cause: Cause::BadKey(_)
                }
            ),
            "{bad:?}: {settled:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(
        consumer.idempotency().store().is_empty(),
        "nothing is stored for a refused key"
    );
}

#[tokio::test]
async fn a_key_from_the_payload_and_a_fingerprint_that_ignores_a_timestamp() {
    // The publisher sets no id and stamps each resend with its send time.
    let consumer = consumer()
        .key_from_payload(|payload| {
            let event: serde_json::Value = serde_json::from_slice(payload).ok()?;
            Some(event.get("event")?.as_str()?.to_owned())
        })
        .fingerprint_with(|payload| {
            let mut event: serde_json::Value = serde_json::from_slice(payload).unwrap_or_default();
            if let Some(event) = event.as_object_mut() {
                event.remove("sent_at");
            }
            Fingerprint::of_json(&event).expect("a JSON value")
        });
    let runs = Arc::new(AtomicUsize::new(0));
    let first = TestMessage::new("", r#"{"event":"evt_1","cents":500,"sent_at":1}"#).without_id();
    let resend = TestMessage::new("", r#"{"event":"evt_1","cents":500,"sent_at":2}"#).without_id();
    assert!(
        !consumer
            .handle(&first, counted(&runs))
            .await
            .unwrap()
            .replayed()
    );
    assert!(
        consumer
            .handle(&resend, counted(&runs))
            .await
            .unwrap()
            .replayed()
    );
    let changed = TestMessage::new("", r#"{"event":"evt_1","cents":900,"sent_at":3}"#).without_id();
    assert!(matches!(
        consumer.handle(&changed, counted(&runs)).await.unwrap(),
        Settled::DeadLettered {
            reason: DeadLetterReason::KeyReused,
            ..
        }
    ));
    let keyless = TestMessage::new("", r#"{"cents":1}"#).without_id();
    assert!(matches!(
        consumer.handle(&keyless, counted(&runs)).await.unwrap(),
        Settled::DeadLettered {
            reason: DeadLetterReason::NoKey,
            ..
        }
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn equal_ids_from_two_sources_are_two_messages_unless_one_scope_is_set() {
    let runs = Arc::new(AtomicUsize::new(0));
    let consumer = consumer();
    consumer
        .handle(&TestMessage::new("m-1", "x").from("eu"), counted(&runs))
        .await
        .unwrap();
    consumer
        .handle(&TestMessage::new("m-1", "x").from("us"), counted(&runs))
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let consumer = consumer.scope("orders-everywhere");
    consumer
        .handle(&TestMessage::new("m-2", "x").from("eu"), counted(&runs))
        .await
        .unwrap();
    let settled = consumer
        .handle(&TestMessage::new("m-2", "x").from("us"), counted(&runs))
        .await
        .unwrap();
    assert!(settled.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

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

#[test]
fn a_backoff_that_cannot_work_is_refused() {
    assert_eq!(
        Backoff::new(Duration::ZERO, Duration::from_secs(1)),
        Err(BackoffError::ZeroDelay)
    );
    assert!(matches!(
        Backoff::new(Duration::from_secs(2), Duration::from_secs(1)),
        Err(BackoffError::FirstOverMax { .. })
    ));
    let backoff =
        Backoff::new(Duration::from_millis(1), Duration::from_secs(u64::MAX / 2)).unwrap();
    // A huge delivery count never overflows.
    assert!(backoff.delay(Some(u64::MAX)) > Duration::ZERO);
    assert_eq!(backoff.delay(Some(0)), Duration::from_millis(1));
}

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
async fn an_invalid_scope_setting_redelivers_instead_of_dead_lettering_everything() {
    let scoped = consumer().scope("");
    let runs = Arc::new(AtomicUsize::new(0));
    let message = TestMessage::new("m-1", "x").delivered(1);
    let settled = scoped.handle(&message, counted(&runs)).await.unwrap();
    assert!(
        matches!(
            settled,
            Settled::Retried {
                cause: Cause::BadKey(_),
                ..
            }
        ),
        "{settled:?}"
    );
    assert_eq!(message.settlements(), [Settle::Nak(Duration::from_secs(1))]);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The source can be the culprit too: a queue named with a control character.
    let settled = consumer()
        .handle(
            &TestMessage::new("m-1", "x").from("bad\nqueue"),
            counted(&runs),
        )
        .await
        .unwrap();
    assert!(matches!(settled, Settled::Retried { .. }), "{settled:?}");
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

/// The futures a consumer loop spawns are `Send` for both adapters (checked when this
/// file compiles; never called).
#[allow(dead_code)]
fn consumers_futures_are_send(
    consumer: &Consumer,
    jetstream: &idem_consumer::nats::JetStreamMessage,
    rabbit: &[idem_consumer::rabbitmq::RabbitMessage],
    dyn_messages: &[Box<dyn idem_consumer::Message>],
) {
    fn send<T: Send>(_: T) {}
    send(consumer.handle(
        jetstream,
        |_ctx, payload| async move { done(payload.len()) },
    ));
    send(consumer.handle_batch(rabbit, |_ctx, payload| async move { done(payload.len()) }));
    send(consumer.handle_batch(
        dyn_messages.iter().map(Box::as_ref),
        |_ctx, payload| async move { done(payload.len()) },
    ));
}

#[test]
fn no_cap_on_the_backoff_means_the_longest_duration_idem_stores() {
    let backoff = Backoff::new(Duration::from_secs(5), Duration::MAX).unwrap();
    assert_eq!(backoff.delay(Some(1_000)), idem_core::raw::MAX_DURATION);
    assert_eq!(backoff.delay(Some(1)), Duration::from_secs(5));
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
async fn a_lease_lost_to_a_takeover_is_naked_and_the_taker_s_result_is_the_answer() {
    // No renewal: the first delivery's lease (100 ms) ends while its work runs (300 ms), and
    // a second delivery takes the key over.
    let consumer = Consumer::new(
        Idempotency::builder(MemoryStore::new())
            .lease(Duration::from_millis(100))
            .heartbeat(idem_core::Heartbeat::Off)
            .build()
            .unwrap(),
    )
    .backoff(Backoff::new(Duration::from_millis(50), Duration::from_millis(50)).unwrap());
    let runs = Arc::new(AtomicUsize::new(0));
    let slow = |_ctx: Context, _payload: Bytes| {
        let run = runs.fetch_add(1, Ordering::SeqCst);
        async move {
            if run == 0 {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            done(run)
        }
    };
    let owner = TestMessage::new("m-1", "x");
    let taker = TestMessage::new("m-1", "x").delivered(2);
    let (owned, taken) = tokio::join!(consumer.handle(&owner, slow), async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        consumer.handle(&taker, slow).await
    });
    let taken = taken.unwrap();
    assert!(
        matches!(
            taken,
            Settled::Acked {
                value: 1,
                replayed: false
            }
        ),
        "{taken:?}"
    );
    let owned = owned.unwrap();
    assert!(
        matches!(
            owned,
            Settled::Retried {
                cause: Cause::Idem(Error::LeaseLost),
                ..
            }
        ),
        "{owned:?}"
    );
    // The redelivery of the owner's copy replays the taker's result.
    let settled = consumer
        .handle(&TestMessage::new("m-1", "x").delivered(3), slow)
        .await
        .unwrap();
    assert!(
        matches!(
            settled,
            Settled::Acked {
                value: 1,
                replayed: true
            }
        ),
        "{settled:?}"
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

#[tokio::test]
async fn run_stops_when_its_stream_of_deliveries_ends() {
    let consumer = consumer();
    let runs = Arc::new(AtomicUsize::new(0));
    let deliveries = futures_util::stream::iter(
        (0..3).map(|i| Ok::<_, std::io::Error>(TestMessage::new(&format!("m-{i}"), "x"))),
    );
    let source = idem_consumer::StreamSource::new(deliveries, NonZeroUsize::MIN, Duration::ZERO);
    let report = tokio::time::timeout(
        Duration::from_secs(5),
        consumer.run(&source, counted(&runs), std::future::pending()),
    )
    .await
    .expect("run stops at the stream's end");
    assert_eq!((report.acked, report.receive_errors), (3, 1), "{report:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}
