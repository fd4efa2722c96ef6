//! A caller that goes away after the work returned, a store that panics, hangs or loses
//! its answer, a store clock far behind, and the longest wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{
    Idempotency, InFlightPolicy, ManualClock, MemoryStore, Outcome, State, Store, Timestamp,
    WorkError, store::ClaimOutcome, store::ClaimRequest, store::Operation,
};

use crate::support::{Fault, LEASE, TIMEOUT, driver, fp, key, store_on};

#[tokio::test(start_paused = true)]
async fn a_result_survives_the_caller_going_away_after_the_work_returned() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    let runs = Arc::new(AtomicUsize::new(0));
    let work = |runs: Arc<AtomicUsize>| {
        move |_ctx| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, WorkError<String>>("charged".to_string())
        }
    };
    // The caller gives up while the result is on its way to a slow store.
    store.set(Operation::Complete, Fault::Slow(TIMEOUT / 2));
    let gave_up = tokio::time::timeout(
        TIMEOUT / 4,
        idem.execute(&key("dropped"), fp(), work(Arc::clone(&runs))),
    )
    .await;
    assert!(gave_up.is_err(), "the caller timed out first");
    tokio::time::sleep(Duration::from_secs(5)).await;
    store.set(Operation::Complete, Fault::None);
    let record = store.get(&key("dropped")).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        State::Completed,
        "the write went on without the caller"
    );
    clock.advance(2 * LEASE);
    let retry = idem
        .execute(&key("dropped"), fp(), work(Arc::clone(&runs)))
        .await
        .unwrap();
    assert_eq!(
        retry,
        Outcome::Completed {
            value: "charged".to_string(),
            replayed: true
        }
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");
}

/// A store that panics while the result's write waits: the caller sees that one panic, and
/// nothing goes on to poll the panicked write again (which would panic a second time, in
/// a task of its own).
#[tokio::test]
async fn a_store_that_panics_mid_write_panics_once_in_the_caller() {
    static RESUMED: AtomicUsize = AtomicUsize::new(0);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .map(|text| (*text).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        if message.contains("resumed after panicking") {
            RESUMED.fetch_add(1, Ordering::SeqCst);
        }
        previous(info);
    }));
    let store = store_on(&ManualClock::new());
    store.set(Operation::Complete, Fault::Panic);
    let idem = driver(&store);
    let caller = tokio::spawn(async move {
        idem.execute(&key("panics"), fp(), |_ctx| async {
            Ok::<_, WorkError<String>>("charged".to_owned())
        })
        .await
    });
    let err = caller
        .await
        .expect_err("the store's panic reaches the caller");
    assert!(err.is_panic());
    // Anything handed on would run now.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        RESUMED.load(Ordering::SeqCst),
        0,
        "a panicked write was polled again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_takeover_whose_answer_was_lost_still_says_it_resumed() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    // An earlier attempt claimed and then vanished.
    let abandoned = ClaimRequest::new(key("lost"), fp(), LEASE, 10 * LEASE);
    assert!(matches!(
        store.inner.claim(&abandoned).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    clock.advance(LEASE);
    // The takeover lands, but its answer is lost; the retry gets the same lease back.
    store.set(Operation::Claim, Fault::LoseAnswer);
    let idem = driver(&store);
    let outcome = idem
        .execute(&key("lost"), fp(), |ctx| async move {
            Ok::<_, WorkError<String>>((ctx.resumed(), ctx.token()))
        })
        .await
        .unwrap();
    assert_eq!(outcome.into_result(), Ok((true, 2)), "a takeover, told so");

    // A takeover in the very millisecond the record was created (a Retryable run released
    // its lease at once), its answer lost: still a takeover.
    let released = idem
        .execute(&key("same-ms"), fp(), |_ctx| async {
            Err::<bool, _>(WorkError::Retryable("down".to_string()))
        })
        .await
        .unwrap();
    assert!(matches!(released, Outcome::Retryable(_)));
    store.set(Operation::Claim, Fault::LoseAnswer);
    let outcome = idem
        .execute(&key("same-ms"), fp(), |ctx| async move {
            Ok::<_, WorkError<String>>(ctx.resumed())
        })
        .await
        .unwrap();
    assert_eq!(outcome.into_result(), Ok(true));

    // A fresh claim whose answer was lost is still a fresh one.
    store.set(Operation::Claim, Fault::LoseAnswer);
    let outcome = idem
        .execute(&key("fresh"), fp(), |ctx| async move {
            Ok::<_, WorkError<String>>(ctx.resumed())
        })
        .await
        .unwrap();
    assert_eq!(outcome.into_result(), Ok(false));
}

#[tokio::test(start_paused = true)]
async fn a_release_into_a_hung_store_is_bounded() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    store.set(Operation::Release, Fault::Hang);
    let started = tokio::time::Instant::now();
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        idem.execute(&key("release"), fp(), |_ctx| async {
            Err::<String, _>(WorkError::Retryable("provider down".to_string()))
        }),
    )
    .await
    .expect("execute returns although the release never answers");
    assert!(matches!(outcome, Ok(Outcome::Retryable(_))));
    // Three tries of one store_timeout each, and the backoff between them.
    assert!(started.elapsed() <= 3 * TIMEOUT + Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn writes_keep_trying_for_the_lease_whatever_the_stores_clock_says() {
    // The store's clock is years behind this process's: its lease_until is long past on
    // the process's clock, yet the lease is live in the store.
    let clock = ManualClock::starting_at(Timestamp::from_unix_millis(1_000_000));
    let store = store_on(&clock);
    let idem = driver(&store);
    store.set(Operation::Complete, Fault::Refuse(6));
    let runs = AtomicUsize::new(0);
    let work = |_ctx| async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, WorkError<String>>("ok".to_string())
    };
    let first = idem.execute(&key("clock"), fp(), work).await;
    assert!(
        matches!(
            first,
            Ok(Outcome::Completed {
                replayed: false,
                ..
            })
        ),
        "{first:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn the_longest_wait_does_not_panic() {
    let idem = Idempotency::builder(MemoryStore::new())
        .in_flight(InFlightPolicy::Wait {
            timeout: Duration::MAX,
        })
        .build()
        .unwrap();
    let outcome = idem
        .execute(&key("wait"), fp(), |_ctx| async {
            Ok::<_, WorkError<String>>(1)
        })
        .await
        .unwrap();
    assert_eq!(outcome.into_result(), Ok(1));
}
