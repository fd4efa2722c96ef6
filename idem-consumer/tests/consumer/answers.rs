//! The work's answers, now or replayed: a result, a permanent, retryable or unknown
//! failure, a duplicate in flight, a lease lost to a takeover.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_consumer::{Backoff, Cause, Consumer, DeadLetterReason, Settled};
use idem_core::{
    Context, Error, Idempotency, InFlightPolicy, ManualClock, MemoryStore, WorkError, done,
};

use crate::common::{Settle, TestMessage, counted};
use crate::support::{LEASE, consumer};

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
