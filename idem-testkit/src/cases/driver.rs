//! Driver-level scenarios: the promises of `Idempotency::execute`, on any store.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{
    Error, Fingerprint, Heartbeat, Idempotency, IdempotencyBuilder, InFlightPolicy, Outcome, Store,
    WorkError,
};
use tokio::sync::{Barrier, oneshot};

use crate::support::{HOUR, SHORT_LEASE, key, let_time_pass};
use crate::{Capabilities, quiet};

/// A driver with `lease`, an hour's retention and no heartbeat: leases end when a case
/// says so.
pub(crate) fn builder(
    store: Arc<dyn Store>,
    lease: Duration,
) -> IdempotencyBuilder<Arc<dyn Store>> {
    Idempotency::builder(store)
        .lease(lease)
        .retention(HOUR)
        .heartbeat(Heartbeat::Off)
}

pub(crate) fn driver(store: Arc<dyn Store>, lease: Duration) -> Idempotency<Arc<dyn Store>> {
    builder(store, lease)
        .build()
        .expect("valid driver settings")
}

pub(crate) async fn steps_run_once_across_takeovers(store: Arc<dyn Store>, caps: &Capabilities) {
    let idem = driver(store, SHORT_LEASE);
    let k = key("payments", "two-steps");
    let fingerprint = Fingerprint::of_bytes("amount=500");
    let (debits, charges) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));

    // Attempt 1 debits, then stalls (a provider timeout): its outcome is unknown.
    let first = idem
        .execute(&k, fingerprint, |ctx| {
            let debits = Arc::clone(&debits);
            async move {
                let debit: u64 = ctx
                    .step("debit", || async move {
                        Ok::<_, WorkError<String>>(
                            debits.fetch_add(1, Ordering::SeqCst) as u64 + 100,
                        )
                    })
                    .await?;
                Err::<(u64, u64), _>(WorkError::Unknown(format!(
                    "charge timed out after debit {debit}"
                )))
            }
        })
        .await;
    assert!(
        matches!(first, Ok(Outcome::Unknown(_))),
        "attempt 1: {first:?}"
    );

    let_time_pass(caps, SHORT_LEASE).await;
    // Attempt 2 takes over, skips the debit and charges.
    let run = |debits: Arc<AtomicUsize>, charges: Arc<AtomicUsize>| {
        move |ctx: idem_core::Context| async move {
            let debit: u64 = ctx
                .step("debit", || async move {
                    Ok::<_, WorkError<String>>(debits.fetch_add(1, Ordering::SeqCst) as u64 + 100)
                })
                .await?;
            let charge: u64 = ctx
                .step("charge", || async move {
                    Ok::<_, WorkError<String>>(charges.fetch_add(1, Ordering::SeqCst) as u64 + 200)
                })
                .await?;
            Ok::<_, WorkError<String>>((debit, charge, ctx.resumed()))
        }
    };
    let second = idem
        .execute(
            &k,
            fingerprint,
            run(Arc::clone(&debits), Arc::clone(&charges)),
        )
        .await
        .expect("attempt 2 takes over and finishes");
    assert_eq!(
        second,
        Outcome::Completed {
            value: (100, 200, true),
            replayed: false
        },
        "the debit is the first attempt's, replayed"
    );
    for _ in 0..3 {
        let later = idem
            .execute(
                &k,
                fingerprint,
                run(Arc::clone(&debits), Arc::clone(&charges)),
            )
            .await
            .expect("later retries replay");
        assert_eq!(
            later,
            Outcome::Completed {
                value: (100, 200, true),
                replayed: true
            }
        );
    }
    assert_eq!(
        debits.load(Ordering::SeqCst),
        1,
        "the debit closure ran exactly once"
    );
    assert_eq!(
        charges.load(Ordering::SeqCst),
        1,
        "the charge closure ran exactly once"
    );
}

pub(crate) async fn a_stale_owner_cannot_store_its_result(
    store: Arc<dyn Store>,
    caps: &Capabilities,
) {
    let idem = Arc::new(driver(store, SHORT_LEASE));
    let k = key("payments", "stale");
    let fingerprint = Fingerprint::of_bytes("amount=500");
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let stale = quiet::spawn({
        let (idem, k) = (Arc::clone(&idem), k.clone());
        async move {
            idem.execute(&k, fingerprint, |_ctx| async move {
                let _ = started_tx.send(());
                let _ = finish_rx.await;
                Ok::<_, WorkError<String>>("stale".to_string())
            })
            .await
        }
    });
    started_rx.await.expect("attempt 1 started");
    let_time_pass(caps, SHORT_LEASE).await;
    let winner = idem
        .execute(&k, fingerprint, |ctx| async move {
            assert!(ctx.resumed(), "attempt 2 took over");
            Ok::<_, WorkError<String>>("winner".to_string())
        })
        .await
        .expect("attempt 2 takes over");
    assert!(!winner.replayed());
    let _ = finish_tx.send(());
    let stale = stale.await.expect("attempt 1 did not panic");
    assert!(
        matches!(stale, Err(Error::LeaseLost)),
        "attempt 1 must learn it lost the lease: {stale:?}"
    );
    let replay = idem
        .execute(&k, fingerprint, |_ctx| async {
            Ok::<_, WorkError<String>>("never".to_string())
        })
        .await
        .expect("replay");
    assert_eq!(
        replay,
        Outcome::Completed {
            value: "winner".to_string(),
            replayed: true
        }
    );
}

pub(crate) async fn waiting_duplicates_share_one_execution(store: Arc<dyn Store>) {
    const CALLERS: usize = 32;
    let idem = Arc::new(
        Idempotency::builder(store)
            .lease(HOUR)
            .in_flight(InFlightPolicy::Wait {
                timeout: Duration::from_secs(30),
            })
            .build()
            .expect("valid driver settings"),
    );
    let k = key("payments", "thundering-herd");
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(CALLERS));
    let tasks: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (idem, k, runs, barrier) = (
                Arc::clone(&idem),
                k.clone(),
                Arc::clone(&runs),
                Arc::clone(&barrier),
            );
            quiet::spawn(async move {
                barrier.wait().await;
                idem.execute(&k, Fingerprint::of_bytes("same"), |_ctx| async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst);
                    // Long enough for every other caller to find it in flight.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Ok::<_, WorkError<String>>(format!("receipt-{n}"))
                })
                .await
            })
        })
        .collect();
    let mut replays = 0;
    for task in tasks {
        let done = task
            .await
            .expect("no panic")
            .expect("every waiter gets the result");
        replays += usize::from(done.replayed());
        assert_eq!(done.value().as_deref(), Some("receipt-0"));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");
    assert_eq!(replays, CALLERS - 1);
}
