//! Driver-level compensation scenarios on any store: undos in reverse order, once each,
//! across crashes and takeovers.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use idem_core::{Compensation, Context, Fingerprint, Idempotency, Key, Outcome, Store, WorkError};
use tokio::sync::oneshot;

use crate::Capabilities;
use crate::cases::driver::driver;
use crate::support::{HOUR, SHORT_LEASE, key, let_time_pass};

/// What the saga's effects and undos did, in order.
#[derive(Clone, Default)]
struct Journal(Arc<Mutex<Vec<String>>>);

impl Journal {
    fn log(&self, entry: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(entry.to_owned());
    }

    fn entries(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// How the undo of `reserve` behaves on its first call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ReserveUndo {
    Works,
    /// Hangs until the test drops the execution (a crash mid-compensation).
    HangsOnce,
    /// Fails permanently.
    Fails,
}

type SagaRun = Pin<Box<dyn Future<Output = Result<String, WorkError<String>>> + Send>>;

/// Three steps: reserve and charge register undos, ship fails permanently.
fn saga(
    journal: Journal,
    reserve_undo: ReserveUndo,
    hung: Arc<AtomicUsize>,
    started: Arc<Mutex<Option<oneshot::Sender<()>>>>,
) -> impl FnOnce(Context) -> SagaRun {
    move |ctx: Context| {
        Box::pin(async move {
            let j = journal.clone();
            let hold: String = ctx
                .step_with_undo(
                    "reserve",
                    || async {
                        j.log("reserve");
                        Ok::<_, WorkError<String>>("hold_1".to_string())
                    },
                    {
                        let j = journal.clone();
                        move |hold: String| async move {
                            if reserve_undo == ReserveUndo::Fails {
                                return Err(WorkError::Permanent(format!(
                                    "{hold} already shipped"
                                )));
                            }
                            if reserve_undo == ReserveUndo::HangsOnce
                                && hung.fetch_add(1, Ordering::SeqCst) == 0
                            {
                                let sender = started
                                    .lock()
                                    .unwrap_or_else(PoisonError::into_inner)
                                    .take();
                                if let Some(sender) = sender {
                                    let _ = sender.send(());
                                }
                                std::future::pending::<()>().await;
                            }
                            j.log(&format!("release {hold}"));
                            Ok(())
                        }
                    },
                )
                .await?;
            let j = journal.clone();
            let charge: String = ctx
                .step_with_undo(
                    "charge",
                    || async {
                        j.log("charge");
                        Ok::<_, WorkError<String>>("ch_1".to_string())
                    },
                    {
                        let j = journal.clone();
                        move |charge: String| async move {
                            j.log(&format!("refund {charge}"));
                            Ok(())
                        }
                    },
                )
                .await?;
            let j = journal.clone();
            ctx.step("ship", || async {
                j.log("ship");
                Err::<(), _>(WorkError::Permanent("no courier".to_string()))
            })
            .await?;
            Ok(format!("{hold} {charge}"))
        })
    }
}

fn no_signal() -> Arc<Mutex<Option<oneshot::Sender<()>>>> {
    Arc::new(Mutex::new(None))
}

/// Runs the saga once on `k`, without a crash signal.
async fn execute(
    idem: &Idempotency<Arc<dyn Store>>,
    k: &Key,
    fingerprint: Fingerprint,
    journal: &Journal,
    reserve_undo: ReserveUndo,
    hung: &Arc<AtomicUsize>,
) -> Outcome<String, String> {
    let work = saga(journal.clone(), reserve_undo, Arc::clone(hung), no_signal());
    idem.execute(k, fingerprint, work)
        .await
        .unwrap_or_else(|err| panic!("a saga's failure is an answer, not {err:?}"))
}

/// The error, compensation and replay flag of a compensated outcome.
fn compensated(outcome: Outcome<String, String>, what: &str) -> (String, Compensation, bool) {
    match outcome {
        Outcome::Compensated {
            error,
            compensation,
            replayed,
        } => (error, compensation, replayed),
        other => panic!("{what}: expected a compensated failure, got {other:?}"),
    }
}

pub(crate) async fn a_failed_saga_is_undone_in_reverse_once(store: Arc<dyn Store>) {
    let idem = driver(store, HOUR);
    let k = key("orders", "saga");
    let fingerprint = Fingerprint::of_bytes("order 7");
    let (journal, hung) = (Journal::default(), Arc::new(AtomicUsize::new(0)));
    let run = || execute(&idem, &k, fingerprint, &journal, ReserveUndo::Works, &hung);
    let (error, compensation, replayed) = compensated(run().await, "step 3 failed");
    assert!(!replayed);
    assert_eq!(error, "no courier");
    assert_eq!(compensation.undone, ["charge", "reserve"], "reverse order");
    assert!(compensation.is_complete());
    for _ in 0..2 {
        let again = compensated(run().await, "a retry");
        assert_eq!(
            again,
            (error.clone(), compensation.clone(), true),
            "replayed"
        );
    }
    assert_eq!(
        journal.entries(),
        ["reserve", "charge", "ship", "refund ch_1", "release hold_1"],
        "each effect and each undo once, undos in reverse"
    );
}

pub(crate) async fn a_takeover_finishes_a_crashed_compensation(
    store: Arc<dyn Store>,
    caps: &Capabilities,
) {
    let idem = driver(store, SHORT_LEASE);
    let k = key("orders", "saga-crash");
    let fingerprint = Fingerprint::of_bytes("order 8");
    let (journal, hung) = (Journal::default(), Arc::new(AtomicUsize::new(0)));
    let (started_tx, started_rx) = oneshot::channel();
    let signal = Arc::new(Mutex::new(Some(started_tx)));
    let crashing = saga(
        journal.clone(),
        ReserveUndo::HangsOnce,
        Arc::clone(&hung),
        signal,
    );
    // Attempt 1 refunds the charge, then dies while releasing the reservation.
    tokio::select! {
        crashed = idem.execute(&k, fingerprint, crashing) => {
            panic!("the undo hangs, so attempt 1 cannot finish: {crashed:?}")
        }
        _ = started_rx => {}
    }
    assert_eq!(
        journal.entries(),
        ["reserve", "charge", "ship", "refund ch_1"]
    );
    let_time_pass(caps, SHORT_LEASE).await;
    let second = execute(
        &idem,
        &k,
        fingerprint,
        &journal,
        ReserveUndo::HangsOnce,
        &hung,
    )
    .await;
    let (error, compensation, replayed) = compensated(second, "attempt 2 takes over");
    assert!(!replayed);
    assert_eq!(error, "no courier", "the failure the first attempt met");
    // Undos run at most once: the release started and no owner saw it end, so it is
    // reported for an operator, never run a second time.
    assert_eq!(compensation.undone, ["charge"]);
    assert_eq!(compensation.interrupted, ["reserve"]);
    assert!(!compensation.is_complete());
    assert_eq!(
        journal.entries(),
        ["reserve", "charge", "ship", "refund ch_1"],
        "no step ran again, the refund was not repeated, the interrupted release not retried"
    );
    let replay = execute(&idem, &k, fingerprint, &journal, ReserveUndo::Works, &hung).await;
    assert_eq!(
        compensated(replay, "a retry"),
        (error, compensation, true),
        "replayed as stored"
    );
}

pub(crate) async fn a_failing_undo_is_stored_for_the_operator(store: Arc<dyn Store>) {
    let idem = driver(Arc::clone(&store), HOUR);
    let k = key("orders", "saga-undo-fails");
    let fingerprint = Fingerprint::of_bytes("order 9");
    let (journal, hung) = (Journal::default(), Arc::new(AtomicUsize::new(0)));
    let run = || execute(&idem, &k, fingerprint, &journal, ReserveUndo::Fails, &hung);
    let (error, compensation, _) = compensated(run().await, "an undo failed");
    assert_eq!(error, "no courier");
    assert_eq!(compensation.undone, ["charge"]);
    let failed = compensation
        .failed
        .as_ref()
        .expect("the failed undo is recorded");
    assert_eq!(failed.step, "reserve");
    assert_eq!(failed.error.as_str(), Some("hold_1 already shipped"));
    assert!(
        compensation.pending.is_empty(),
        "reserve was the first step"
    );
    assert!(!compensation.is_complete());
    let replay = compensated(run().await, "a retry");
    assert_eq!(replay, (error, compensation, true), "replayed as stored");
    // What the operator reads: the stored failure names the failed undo.
    let record = crate::support::get_some(store.as_ref(), &k).await;
    let stored = String::from_utf8(record.response.expect("stored")).expect("JSON");
    assert!(
        stored.contains("\"failed\"") && stored.contains("reserve"),
        "{stored}"
    );
    assert_eq!(
        journal.entries(),
        ["reserve", "charge", "ship", "refund ch_1"]
    );
}
