//! Compensation taken over, left by its caller, kept leased to the end, and undos
//! interrupted, of unknown outcome or never returning.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Error, Heartbeat, Idempotency, InFlightPolicy, ManualClock, Outcome, State, Store, WorkError,
};

use crate::support::{
    Faulty, LEASE, Ledger, SagaRun, TIMEOUT, charge_then_decline, driver, fp, key, saga_of,
    store_on, ticking,
};

/// Reserves (its undo logs `release`) and charges, then fails for good; the charge's
/// refund is not possible yet (Retryable), so the execution stays held mid-compensation.
fn reserve_then_a_charge_held(ledger: &Ledger) -> impl FnOnce(idem_core::Context) -> SagaRun {
    let ledger = ledger.clone();
    move |ctx: idem_core::Context| {
        Box::pin(async move {
            ctx.step_with_undo(
                "reserve",
                || async { Ok::<_, WorkError<String>>(()) },
                move |()| async move {
                    ledger.add("release");
                    Ok(())
                },
            )
            .await?;
            ctx.step_with_undo(
                "charge",
                || async { Ok::<_, WorkError<String>>(()) },
                |()| async { Err(WorkError::Retryable("refunds are down".to_string())) },
            )
            .await?;
            Err(WorkError::Permanent("no courier".to_string()))
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_takeover_accounts_for_every_undo_the_failed_run_registered() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    let ledger = Ledger::default();
    let k = key("saga-early");
    // First run: reserve and charge, then shipping fails for good; the charge's refund
    // is not possible yet (Retryable), so the execution stays held mid-compensation.
    let first = idem
        .execute(&k, fp(), reserve_then_a_charge_held(&ledger))
        .await;
    assert!(
        matches!(first, Err(Error::CompensationPending { ref step }) if step == "charge"),
        "{first:?}"
    );
    clock.advance(LEASE);
    // The takeover's run of the work stops early, before it re-registers the charge's
    // undo: a plain call that is momentarily down.
    let l = ledger.clone();
    let second = idem
        .execute(&k, fp(), move |ctx| async move {
            let l2 = l.clone();
            ctx.step_with_undo(
                "reserve",
                || async { Ok::<_, WorkError<String>>(()) },
                move |()| async move {
                    l2.add("release");
                    Ok(())
                },
            )
            .await?;
            Err::<(), _>(WorkError::Retryable("fraud check down".to_string()))
        })
        .await;
    assert!(
        matches!(second, Err(Error::CompensationPending { ref step }) if step == "charge"),
        "never stored as compensated with the charge not refunded: {second:?}"
    );
    assert_eq!(ledger.count("release"), 0, "undos run in reverse order");
    clock.advance(LEASE);
    // A run that goes all the way but whose code no longer registers the charge's undo:
    // it is reported pending, and the reservation is released.
    let l = ledger.clone();
    let third = idem
        .execute(&k, fp(), move |ctx| async move {
            let l2 = l.clone();
            ctx.step_with_undo(
                "reserve",
                || async { Ok::<_, WorkError<String>>(()) },
                move |()| async move {
                    l2.add("release");
                    Ok(())
                },
            )
            .await?;
            Ok::<(), WorkError<String>>(())
        })
        .await
        .unwrap();
    let Outcome::Compensated { compensation, .. } = third else {
        panic!("compensated: {third:?}")
    };
    assert_eq!(compensation.undone, ["reserve"]);
    assert_eq!(compensation.pending, ["charge"]);
    assert!(!compensation.is_complete());
    assert_eq!(ledger.count("release"), 1);
}

#[tokio::test(start_paused = true)]
async fn an_undo_interrupted_while_it_runs_never_runs_again() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    let ledger = Ledger::default();
    let k = key("undo-interrupted");
    let work = charge_then_decline;
    let first = tokio::time::timeout(
        Duration::from_secs(5),
        idem.execute(&k, fp(), work(ledger.clone(), true)),
    )
    .await;
    assert!(first.is_err(), "the caller gave up mid-undo");
    clock.advance(LEASE);
    let second = idem
        .execute(&k, fp(), work(ledger.clone(), false))
        .await
        .unwrap();
    let Outcome::Compensated { compensation, .. } = second else {
        panic!("compensated: {second:?}")
    };
    assert_eq!(compensation.interrupted, ["charge"]);
    assert!(compensation.undone.is_empty());
    assert_eq!(ledger.count("refund"), 1, "the refund went out once");
}

#[tokio::test(start_paused = true)]
async fn a_caller_gone_mid_compensation_stops_none_of_it() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    let ledger = Ledger::default();
    let k = key("gone-mid-saga");
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        idem.execute(
            &k,
            fp(),
            saga_of(&ledger, &["reserve", "charge"], Duration::from_secs(2)),
        ),
    )
    .await;
    assert!(gave_up.is_err(), "the caller left during the first undo");
    // Nobody retries; the compensation goes on by itself.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(ledger.count("undo:charge"), 1);
    assert_eq!(ledger.count("undo:reserve"), 1);
    let record = store.get(&k).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        State::Failed,
        "the compensated failure is stored"
    );
}

#[tokio::test(start_paused = true)]
async fn the_lease_is_renewed_for_the_whole_compensation() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let lease = Duration::from_secs(3);
    let builder = |store: &Arc<Faulty>| {
        Idempotency::builder(Arc::clone(store))
            .lease(lease)
            .heartbeat(Heartbeat::Every(Duration::from_secs(1)))
            .store_timeout(TIMEOUT)
    };
    let idem = builder(&store).build().unwrap();
    let waiting = builder(&store)
        .in_flight(InFlightPolicy::Wait {
            timeout: Duration::from_secs(60),
        })
        .build()
        .unwrap();
    // The store's clock follows the runtime's, so leases end as time passes.
    let ticking = ticking(&clock);
    let ledger = Ledger::default();
    let k = key("renewed-saga");
    const FIVE: &[&str] = &["a", "b", "c", "d", "e"];
    let first = tokio::spawn({
        let (idem, k, ledger) = (idem.clone(), k.clone(), ledger.clone());
        async move {
            idem.execute(&k, fp(), saga_of(&ledger, FIVE, Duration::from_millis(900)))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let second = waiting
        .execute(&k, fp(), saga_of(&ledger, FIVE, Duration::from_millis(900)))
        .await;
    let first = first.await.unwrap();
    ticking.abort();
    let Ok(Outcome::Compensated { compensation, .. }) = first else {
        panic!("the first owner compensates: {first:?}")
    };
    assert_eq!(compensation.undone, ["e", "d", "c", "b", "a"]);
    assert!(
        matches!(second, Ok(Outcome::Compensated { replayed: true, .. })),
        "the duplicate waited for the owner, never took over: {second:?}"
    );
    for step in FIVE {
        assert_eq!(ledger.count(&format!("undo:{step}")), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn an_undo_whose_outcome_is_unknown_is_never_run_again() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    let ledger = Ledger::default();
    let k = key("undo-unknown");
    let work = |ledger: Ledger| {
        move |ctx: idem_core::Context| async move {
            let l = ledger.clone();
            ctx.step_with_undo(
                "charge",
                || async { Ok::<_, WorkError<String>>(()) },
                move |()| async move {
                    l.add("refund");
                    Err(WorkError::Unknown("the refund timed out".to_string()))
                },
            )
            .await?;
            Err::<(), _>(WorkError::Permanent("declined".to_string()))
        }
    };
    let first = idem.execute(&k, fp(), work(ledger.clone())).await.unwrap();
    let Outcome::Compensated { compensation, .. } = first else {
        panic!("compensated: {first:?}")
    };
    assert_eq!(compensation.interrupted, ["charge"]);
    clock.advance(2 * LEASE);
    let again = idem.execute(&k, fp(), work(ledger.clone())).await.unwrap();
    assert!(again.replayed());
    assert_eq!(
        ledger.count("refund"),
        1,
        "a refund that may have gone out is not sent again"
    );
}

#[tokio::test(start_paused = true)]
async fn an_undo_that_never_returns_does_not_hold_the_key_for_ever() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let lease = Duration::from_secs(3);
    let idem = Idempotency::builder(Arc::clone(&store))
        .lease(lease)
        .heartbeat(Heartbeat::Every(Duration::from_secs(1)))
        .store_timeout(TIMEOUT)
        .build()
        .unwrap();
    let ticks = ticking(&clock);
    let ledger = Ledger::default();
    let k = key("undo-hangs");
    let work = charge_then_decline;
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        idem.execute(&k, fp(), work(ledger.clone(), true)),
    )
    .await;
    assert!(gave_up.is_err(), "the caller left; the undo hangs on");
    // One more lease of renewals after the caller left (at 1 s, renewing each second),
    // then the lease ends: the last renewal is sent at 3 s, and ends at 6 s.
    let lease_live =
        |record: &idem_core::Record| record.lease_until > idem_core::Clock::now(&clock);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let record = store.get(&k).await.unwrap().unwrap();
    assert!(
        lease_live(&record),
        "renewed after the caller left: {record:?}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let record = store.get(&k).await.unwrap().unwrap();
    assert!(
        !lease_live(&record),
        "renewed no more than a lease on: {record:?}"
    );
    tokio::time::sleep(4 * lease).await;
    let retry = idem.execute(&k, fp(), work(ledger.clone(), false)).await;
    ticks.abort();
    let Ok(Outcome::Compensated { compensation, .. }) = retry else {
        panic!("a retry takes over once the lease ends: {retry:?}")
    };
    assert_eq!(compensation.interrupted, ["charge"]);
    assert_eq!(ledger.count("refund"), 1);
}

/// Reads every value as it is, but for the `reserve` step's checkpoint, which it cannot
/// decode (a key rotated away, say).
#[derive(Debug)]
struct CannotReadReserve;

impl idem_core::Codec for CannotReadReserve {
    fn encode(
        &self,
        _: &idem_core::codec::StoredAt<'_>,
        plain: Vec<u8>,
    ) -> Result<Vec<u8>, idem_core::codec::CodecError> {
        Ok(plain)
    }

    fn decode<'a>(
        &self,
        at: &idem_core::codec::StoredAt<'_>,
        stored: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [u8]>, idem_core::codec::CodecError> {
        match &at.part {
            idem_core::record::ValuePart::Step(step) if step == "reserve" => {
                Err(idem_core::codec::CodecError::UnknownKeyId { id: 1 })
            }
            _ => Ok(std::borrow::Cow::Borrowed(stored)),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_takeover_that_cannot_read_its_steps_leaves_the_compensation_alone() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let ledger = Ledger::default();
    let k = key("saga-unreadable");
    let held = driver(&store)
        .execute(&k, fp(), reserve_then_a_charge_held(&ledger))
        .await;
    assert!(
        matches!(held, Err(Error::CompensationPending { ref step }) if step == "charge"),
        "{held:?}"
    );
    let released = ledger.count("release");
    clock.advance(LEASE);
    // The takeover compensates, but its run stops at a checkpoint it cannot decode:
    // it must answer the codec's error and undo nothing, since it does not know what
    // its steps did.
    let unreadable = Idempotency::builder(Arc::clone(&store))
        .lease(LEASE)
        .heartbeat(Heartbeat::Off)
        .store_timeout(TIMEOUT)
        .codec(CannotReadReserve)
        .build()
        .unwrap();
    let l = ledger.clone();
    let second = unreadable
        .execute(&k, fp(), move |ctx| async move {
            ctx.step_with_undo(
                "reserve",
                || async { Ok::<_, WorkError<String>>(()) },
                move |()| async move {
                    l.add("release");
                    Ok(())
                },
            )
            .await?;
            Ok::<(), WorkError<String>>(())
        })
        .await;
    assert!(matches!(second, Err(Error::Codec { .. })), "{second:?}");
    assert_eq!(ledger.count("release"), released, "nothing was undone");
    let record = store.get(&k).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        State::InProgress,
        "still held for a later owner"
    );
}

/// A charge whose undo sends `started` and then panics (`panics`) or never returns.
fn charge_with_a_bad_undo(
    started: std::sync::mpsc::Sender<()>,
    panics: bool,
) -> impl FnOnce(idem_core::Context) -> SagaRun {
    move |ctx: idem_core::Context| {
        Box::pin(async move {
            ctx.step_with_undo(
                "charge",
                || async { Ok::<_, WorkError<String>>(()) },
                move |()| async move {
                    let _ = started.send(());
                    if panics {
                        panic!("the refund client panicked");
                    }
                    std::future::pending::<Result<(), WorkError<String>>>().await
                },
            )
            .await?;
            Err(WorkError::Permanent("declined".to_string()))
        })
    }
}

#[tokio::test]
async fn an_undo_that_panics_panics_in_the_caller() {
    let idem = Idempotency::builder(idem_core::MemoryStore::new())
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let (started, _) = std::sync::mpsc::channel();
    let caller = tokio::spawn(async move {
        idem.execute(
            &key("undo-panics"),
            fp(),
            charge_with_a_bad_undo(started, true),
        )
        .await
    });
    let err = caller
        .await
        .expect_err("the undo's panic reaches the caller");
    let panic = err.into_panic();
    assert_eq!(
        panic.downcast_ref::<&str>(),
        Some(&"the refund client panicked")
    );
}

/// Polls a future with another runtime entered, so that the tasks it spawns run there.
struct Entered<F> {
    runtime: tokio::runtime::Handle,
    future: std::pin::Pin<Box<F>>,
}

impl<F: std::future::Future> std::future::Future for Entered<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let _entered = self.runtime.enter();
        self.future.as_mut().poll(cx)
    }
}

/// The runtime the compensation's task runs on shuts down under it: the caller is told
/// the compensation did not finish (a store error: a retry takes it over), not a panic.
/// The caller's own timers are on that runtime too; the memory store answers at once, so
/// none is pending when it shuts down (one would panic, failing the test loudly).
#[test]
fn a_runtime_shut_down_mid_compensation_is_an_error_not_a_panic() {
    let sagas = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let callers = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let idem = Idempotency::builder(idem_core::MemoryStore::new())
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let k = key("runtime-shut-down");
    let (started, undo_started) = std::sync::mpsc::channel();
    let runtime = sagas.handle().clone();
    let shutdown = std::thread::spawn(move || {
        undo_started
            .recv_timeout(Duration::from_secs(30))
            .expect("the undo started");
        sagas.shutdown_background();
    });
    let answer = callers.block_on(Entered {
        runtime,
        future: Box::pin(idem.execute(&k, fp(), charge_with_a_bad_undo(started, false))),
    });
    shutdown.join().unwrap();
    assert!(
        matches!(answer, Err(Error::Store(ref err)) if err.is_retryable()),
        "{answer:?}"
    );
}
