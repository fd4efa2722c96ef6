//! Compensation taken over, left by its caller, kept leased to the end, and undos
//! interrupted, of unknown outcome or never returning.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Error, Heartbeat, Idempotency, InFlightPolicy, ManualClock, Outcome, State, Store, WorkError,
};

use crate::support::{
    Faulty, LEASE, Ledger, TIMEOUT, charge_then_decline, driver, fp, key, saga_of, store_on,
    ticking,
};

#[tokio::test(start_paused = true)]
async fn a_takeover_accounts_for_every_undo_the_failed_run_registered() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    let ledger = Ledger::default();
    let k = key("saga-early");
    // First run: reserve and charge, then shipping fails for good; the charge's refund
    // is not possible yet (Retryable), so the execution stays held mid-compensation.
    let l = ledger.clone();
    let first = idem
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
            ctx.step_with_undo(
                "charge",
                || async { Ok::<_, WorkError<String>>(()) },
                |()| async { Err(WorkError::Retryable("refunds are down".to_string())) },
            )
            .await?;
            Err::<(), _>(WorkError::Permanent("no courier".to_string()))
        })
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
    // One more lease of renewals after the caller left, then the lease ends.
    tokio::time::sleep(4 * lease).await;
    let retry = idem.execute(&k, fp(), work(ledger.clone(), false)).await;
    ticks.abort();
    let Ok(Outcome::Compensated { compensation, .. }) = retry else {
        panic!("a retry takes over once the lease ends: {retry:?}")
    };
    assert_eq!(compensation.interrupted, ["charge"]);
    assert_eq!(ledger.count("refund"), 1);
}
