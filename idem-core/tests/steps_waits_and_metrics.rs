//! The driver for real work: heartbeats, waiting duplicates, steps, derived keys, metrics
//! and tracing. The memory store runs on a manual clock and Tokio's clock is paused, so
//! nothing here sleeps for real.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{
    Error, Fingerprint, Heartbeat, Idempotency, InFlightPolicy, Key, ManualClock, MemoryStore,
    Outcome, Store, WorkError, driver::InterruptedKind, driver::observe, store::ClaimOutcome,
    store::ClaimRequest,
};
use tokio::sync::oneshot;

const LEASE: Duration = Duration::from_secs(3);

fn key(name: &str) -> Key {
    Key::new("acct_42/payments.create", name).expect("valid")
}

fn fp() -> Fingerprint {
    Fingerprint::of_bytes("amount=500")
}

fn store() -> (MemoryStore, ManualClock) {
    let clock = ManualClock::new();
    (MemoryStore::with_clock(clock.clone()), clock)
}

#[tokio::test(start_paused = true)]
async fn the_heartbeat_keeps_a_long_run_alive() {
    let (store, clock) = store();
    let idem = Idempotency::builder(store.clone())
        .lease(LEASE)
        .build()
        .unwrap();
    let done = idem
        .execute(&key("long"), fp(), |_ctx| {
            let (store, clock) = (store.clone(), clock.clone());
            async move {
                // Five seconds of work on a three-second lease.
                for _ in 0..5 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    clock.advance(Duration::from_secs(1));
                }
                let duplicate = ClaimRequest::new(key("long"), fp(), LEASE, LEASE);
                let outcome = store.claim(&duplicate).await.unwrap();
                Ok::<_, WorkError<()>>(format!("{outcome:?}"))
            }
        })
        .await
        .unwrap();
    let done = done.value().unwrap();
    assert!(
        done.starts_with("InFlight"),
        "the lease was renewed, so a duplicate is in flight, not a takeover: {done}"
    );
}

#[tokio::test(start_paused = true)]
async fn without_a_heartbeat_a_long_run_is_taken_over() {
    let (store, clock) = store();
    let idem = Idempotency::builder(store.clone())
        .lease(LEASE)
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let err = idem
        .execute(&key("long"), fp(), |_ctx| {
            let (store, clock) = (store.clone(), clock.clone());
            async move {
                clock.advance(Duration::from_secs(5));
                let duplicate = ClaimRequest::new(key("long"), fp(), LEASE, LEASE);
                let outcome = store.claim(&duplicate).await.unwrap();
                assert!(matches!(
                    outcome,
                    ClaimOutcome::Claimed { resumed: true, .. }
                ));
                Ok::<_, WorkError<()>>(())
            }
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseLost), "{err:?}");
}

#[tokio::test(start_paused = true)]
async fn a_fenced_heartbeat_tells_the_work_and_stores_nothing() {
    let (store, clock) = store();
    let idem = Arc::new(Idempotency::builder(store).lease(LEASE).build().unwrap());
    let (started_tx, started_rx) = oneshot::channel();
    let stale = tokio::spawn({
        let idem = Arc::clone(&idem);
        async move {
            idem.execute(&key("k"), fp(), |ctx| async move {
                started_tx.send(()).unwrap();
                // Cooperative: stop as soon as the driver says the lease is gone.
                ctx.lease_lost().await;
                assert!(ctx.is_lease_lost());
                Ok::<_, WorkError<()>>("stale".to_string())
            })
            .await
        }
    });
    started_rx.await.unwrap();
    clock.advance(LEASE);
    let winner = idem
        .execute(&key("k"), fp(), |_ctx| async {
            Ok::<_, WorkError<()>>("winner".to_string())
        })
        .await
        .unwrap();
    assert!(!winner.replayed());
    // Tokio's paused clock runs to the stale owner's next heartbeat, which is fenced.
    let err = stale.await.unwrap().unwrap_err();
    assert!(matches!(err, Error::LeaseLost), "{err:?}");
    let replay = idem
        .execute(&key("k"), fp(), |_ctx| async {
            Ok::<_, WorkError<()>>("never".to_string())
        })
        .await
        .unwrap();
    assert_eq!(
        replay,
        Outcome::Completed {
            value: "winner".to_string(),
            replayed: true
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gives_up_at_its_timeout_without_running_the_work() {
    let (store, _clock) = store();
    let holder = Idempotency::builder(store.clone())
        .lease(LEASE)
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let outcome = holder
        .execute(&key("k"), fp(), |_ctx| async {
            Err::<(), _>(WorkError::Unknown(()))
        })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Unknown(()));

    let waiter = Idempotency::builder(store)
        .lease(LEASE)
        .in_flight(InFlightPolicy::Wait {
            timeout: Duration::from_secs(2),
        })
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let runs = AtomicUsize::new(0);
    let err = waiter
        .execute(&key("k"), fp(), |_ctx| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, WorkError<()>>(())
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InFlight { .. }), "{err:?}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "a waiter never runs the work under a live lease"
    );
}

/// A waiter takes over once the lease expires, also when its wait is too long for the
/// clock to count (`Duration::MAX`: a wait without end, never in-flight at once).
#[tokio::test(start_paused = true)]
async fn a_waiter_takes_over_when_the_lease_expires() {
    for (name, timeout) in [("k", Duration::from_secs(60)), ("endless", Duration::MAX)] {
        let (store, clock) = store();
        let holder = Idempotency::builder(store.clone())
            .lease(LEASE)
            .heartbeat(Heartbeat::Off)
            .build()
            .unwrap();
        let _ = holder
            .execute(&key(name), fp(), |_ctx| async {
                Err::<(), _>(WorkError::Unknown(()))
            })
            .await;
        let waiter = Idempotency::builder(store)
            .lease(LEASE)
            .in_flight(InFlightPolicy::Wait { timeout })
            .build()
            .unwrap();
        let task = tokio::spawn(async move {
            waiter
                .execute(&key(name), fp(), |ctx| async move {
                    Ok::<_, WorkError<()>>(ctx.resumed())
                })
                .await
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !task.is_finished(),
            "{name}: the waiter waits while the lease is live"
        );
        clock.advance(LEASE);
        let done = task.await.unwrap().unwrap();
        assert_eq!(
            done,
            Outcome::Completed {
                value: true,
                replayed: false
            },
            "{name}: it took over and ran the work"
        );
    }
}

#[tokio::test]
async fn derived_keys_are_stable_per_key_and_label() {
    let (store, clock) = store();
    let idem = Idempotency::builder(store)
        .lease(LEASE)
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let derive = |ctx: idem_core::Context| async move {
        Err::<(), _>(WorkError::Unknown((
            ctx.derive("debit"),
            ctx.derive("charge"),
            ctx.token(),
        )))
    };
    let Ok(Outcome::Unknown((debit1, charge1, token1))) =
        idem.execute(&key("a"), fp(), derive).await
    else {
        panic!("unknown outcome expected")
    };
    clock.advance(LEASE);
    let Ok(Outcome::Unknown((debit2, charge2, token2))) =
        idem.execute(&key("a"), fp(), derive).await
    else {
        panic!("unknown outcome expected")
    };
    assert_eq!(
        (debit1.as_str(), charge1.as_str()),
        (debit2.as_str(), charge2.as_str()),
        "same for every retry"
    );
    assert!(token2 > token1, "the fencing token grows across takeovers");
    assert_ne!(debit1, charge1, "labels differ");
    assert!(
        !debit1.contains("acct_42"),
        "a derived key does not reveal the key"
    );
    let Ok(Outcome::Unknown((other, _, _))) = idem.execute(&key("b"), fp(), derive).await else {
        panic!("unknown outcome expected")
    };
    assert_ne!(other, debit1, "other keys derive other keys");
    // Another request under a reused key never shares a derived key with the first.
    let Ok(Outcome::Unknown((changed, _, _))) = idem
        .execute(
            &Key::new("acct_42/payments.create", "c").unwrap(),
            Fingerprint::of_bytes("amount=900"),
            derive,
        )
        .await
    else {
        panic!("unknown outcome expected")
    };
    let Ok(Outcome::Unknown((same_key_first, _, _))) = idem
        .execute(
            &Key::new("acct_42/payments.create", "d").unwrap(),
            fp(),
            derive,
        )
        .await
    else {
        panic!("unknown outcome expected")
    };
    assert_ne!(changed, same_key_first);
}

#[tokio::test]
async fn steps_store_typed_values_and_refuse_bad_names() {
    let (store, _clock) = store();
    let idem = Idempotency::new(store.clone());
    let value = idem
        .execute(&key("typed"), fp(), |ctx| async move {
            let first: Vec<u32> = ctx
                .step("list", || async { Ok::<_, WorkError<()>>(vec![1, 2, 3]) })
                .await?;
            // The same step again in the same run: the stored value, the closure does not run.
            let again: Vec<u32> = ctx
                .step("list", || async { Ok::<_, WorkError<()>>(vec![9]) })
                .await?;
            assert_eq!(ctx.completed_steps(), vec!["list".to_string()]);
            Ok((first, again))
        })
        .await
        .unwrap();
    assert_eq!(value.value(), Some((vec![1, 2, 3], vec![1, 2, 3])));

    let err = idem
        .execute(&key("bad"), fp(), |ctx| async move {
            ctx.step("bad\nname", || async { Ok::<_, WorkError<()>>(1) })
                .await
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Interrupted(i) if i.kind() == InterruptedKind::InvalidStepName),
        "{err:?}"
    );
    let record = store.get(&key("bad")).await.unwrap().unwrap();
    assert!(
        record.steps.is_empty() && record.response.is_none(),
        "nothing was stored"
    );
}

#[test]
fn every_metric_moves_when_its_event_happens() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let (store, clock) = store();
            let idem = Idempotency::builder(store.clone())
                .lease(LEASE)
                .heartbeat(Heartbeat::Off)
                .build()
                .unwrap();
            let ok = |_ctx| async { Ok::<_, WorkError<()>>(1) };
            idem.execute(&key("a"), fp(), ok).await.unwrap(); // claim
            idem.execute(&key("a"), fp(), ok).await.unwrap(); // replay
            let _ = idem
                .execute(&key("a"), Fingerprint::of_bytes("other"), ok)
                .await; // mismatch
            let _ = idem
                .execute(&key("b"), fp(), |_ctx| async {
                    Err::<u8, _>(WorkError::Unknown(()))
                })
                .await;
            let _ = idem.execute(&key("b"), fp(), ok).await; // in-flight rejection
            let waiter = Idempotency::builder(store.clone())
                .lease(LEASE)
                .in_flight(InFlightPolicy::Wait {
                    timeout: Duration::from_millis(50),
                })
                .build()
                .unwrap();
            let _ = waiter.execute(&key("b"), fp(), ok).await; // a wait
            clock.advance(LEASE);
            // A takeover whose own lease is then taken: fenced at completion, lease lost.
            let _ = idem
                .execute(&key("b"), fp(), |_ctx| {
                    let (store, clock) = (store.clone(), clock.clone());
                    async move {
                        clock.advance(LEASE);
                        let _ = store
                            .claim(&ClaimRequest::new(key("b"), fp(), LEASE, LEASE))
                            .await;
                        Ok::<_, WorkError<()>>(2)
                    }
                })
                .await;
            let down = Idempotency::new(Failing);
            let _ = down.execute(&key("c"), fp(), ok).await; // store errors
            // Two days on, both records are absent: the purger deletes them.
            clock.advance(Duration::from_secs(2 * 86_400));
            let purger =
                idem_core::Purger::spawn(Arc::new(store.clone()), Duration::from_millis(10), 100)
                    .expect("a store with records to purge");
            for _ in 0..100 {
                if store.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            purger.stop().await;
        });
    });

    let snapshot = snapshotter.snapshot().into_vec();
    let value = |name: &str| {
        snapshot
            .iter()
            .filter(|(k, _, _, _)| k.key().name() == name)
            .map(|(_, _, _, v)| match v {
                DebugValue::Counter(n) => *n,
                DebugValue::Histogram(samples) => samples.len() as u64,
                DebugValue::Gauge(_) => 0,
            })
            .sum::<u64>()
    };
    for (name, expected) in [
        (observe::CLAIMS, 3),
        (observe::REPLAYS, 1),
        (observe::MISMATCHES, 1),
        (observe::IN_FLIGHT_REJECTIONS, 2),
        (observe::WAITS, 1),
        (observe::TAKEOVERS, 1),
        (observe::FENCED_WRITES, 1),
        (observe::LEASE_LOSSES, 1),
        (observe::STORE_ERRORS, 3),
        (observe::WORK_DURATION, 3),
        (observe::PURGED, 2),
    ] {
        assert_eq!(value(name), expected, "{name}");
    }
}

/// A store whose backend is down.
struct Failing;

#[async_trait::async_trait]
impl Store for Failing {
    async fn claim(&self, _: &ClaimRequest) -> Result<ClaimOutcome, idem_core::StoreError> {
        Err(idem_core::StoreError::Unavailable {
            operation: idem_core::store::Operation::Claim,
            source: "down".into(),
        })
    }
    async fn complete(
        &self,
        _: &idem_core::record::Lease,
        _: &[u8],
    ) -> Result<idem_core::store::WriteOutcome, idem_core::StoreError> {
        unreachable!("never called without a claim")
    }
    async fn fail(
        &self,
        _: &idem_core::record::Lease,
        _: &[u8],
    ) -> Result<idem_core::store::WriteOutcome, idem_core::StoreError> {
        unreachable!("never called without a claim")
    }
    async fn release(
        &self,
        _: &idem_core::record::Lease,
    ) -> Result<idem_core::store::WriteOutcome, idem_core::StoreError> {
        unreachable!("never called without a claim")
    }
    async fn renew(
        &self,
        _: &idem_core::record::Lease,
        _: Duration,
    ) -> Result<idem_core::store::RenewOutcome, idem_core::StoreError> {
        unreachable!("never called without a claim")
    }
    async fn checkpoint(
        &self,
        _: &idem_core::record::Lease,
        _: &idem_core::key::StepName,
        _: &[u8],
    ) -> Result<idem_core::store::WriteOutcome, idem_core::StoreError> {
        unreachable!("never called without a claim")
    }
    async fn get(&self, _: &Key) -> Result<Option<idem_core::Record>, idem_core::StoreError> {
        Ok(None)
    }
    async fn purge_expired(&self, _: usize) -> Result<usize, idem_core::StoreError> {
        Ok(0)
    }
}
