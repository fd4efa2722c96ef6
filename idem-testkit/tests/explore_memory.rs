//! The explorer on the memory store: every scenario, every single fault at every fault
//! point its fault-free run reaches, and a bounded sample of pairs (the only runs that
//! fault a takeover), with no violation. And the explorer can fail: stores broken on
//! purpose are reported, each by the check its flaw breaks.

use std::convert::Infallible;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::record::ValuePart;
use idem_core::{
    Admin, Key, MemoryStore, Record, State, Store, StoreError, key::StepName, record::Lease,
    store::ClaimOutcome, store::ClaimRequest, store::Expiry, store::Operation, store::RenewOutcome,
    store::WriteOutcome,
};
use idem_testkit::explore::{
    Broken, DEFAULT_SEED, Explorer, Fault, FaultPoint, Mode, PlacedFault, Process, Report,
    Scenario, Site, Target,
};

fn memory() -> Target {
    Target::virtual_time("memory", |clock| async move {
        Ok::<_, Infallible>(MemoryStore::with_clock(clock))
    })
}

/// Pairs sampled per scenario: enough to meet the two-fault paths (a fault in the
/// takeover after a crash) while the whole test stays within seconds.
const PAIRS: usize = 300;

#[test]
fn every_single_fault_and_sampled_pairs_on_memory() {
    let report = Explorer::new(memory())
        .mode(Mode::exhaustive_with_pairs(DEFAULT_SEED, PAIRS))
        .run()
        .expect("the exploration runs");
    println!("{report}");
    assert!(report.passed(), "{report}");
    assert!(
        report.runs() > report.fault_points() * 3,
        "{}",
        report.summary()
    );
}

/// How a store is broken on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    /// `complete` answers Applied and stores nothing.
    LosesCompletedResults,
    /// `claim` takes over any in-progress record, live lease or not (an operator release,
    /// then the claim): every claim is answered Claimed.
    ClaimsEveryKey,
    /// `checkpoint` answers Applied and stores nothing.
    ForgetsCheckpoints,
    /// `renew` answers Renewed with the lease as it was, extending nothing.
    RenewsWithoutExtending,
    /// Every checkpoint of a work's step fails before it applies.
    FailsStepCheckpoints,
    /// The undos' marks (`idem.undo:STEP`) are refused as too large: no undo ever runs,
    /// and each is reported pending.
    RefusesUndoMarks,
}

/// The memory store with one flaw.
struct Flawed {
    inner: MemoryStore,
    flaw: Flaw,
}

#[async_trait]
impl Store for Flawed {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let outcome = self.inner.claim(request).await?;
        if self.flaw == Flaw::ClaimsEveryKey && matches!(outcome, ClaimOutcome::InFlight { .. }) {
            self.inner.release_key(&request.key).await?;
            return self.inner.claim(request).await;
        }
        Ok(outcome)
    }

    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        if self.flaw == Flaw::LosesCompletedResults {
            return Ok(WriteOutcome::Applied);
        }
        self.inner.complete(lease, response).await
    }

    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.inner.fail(lease, response).await
    }

    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        self.inner.release(lease).await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        if self.flaw == Flaw::RenewsWithoutExtending {
            // Fenced exactly when a correct store would fence, so only the extension is
            // missing.
            let owned = self.inner.get(&lease.key).await?.is_some_and(|record| {
                record.state == State::InProgress
                    && record.token == lease.token
                    && record.attempt == lease.attempt
            });
            return Ok(if owned {
                RenewOutcome::Renewed(lease.clone())
            } else {
                RenewOutcome::Fenced
            });
        }
        self.inner.renew(lease, extend).await
    }

    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        let own = step.as_str().starts_with("idem.");
        match self.flaw {
            Flaw::ForgetsCheckpoints if !own => return Ok(WriteOutcome::Applied),
            Flaw::FailsStepCheckpoints if !own => {
                return Err(StoreError::Unavailable {
                    operation: Operation::Checkpoint,
                    source: "the checkpoint never reached the store".into(),
                });
            }
            Flaw::RefusesUndoMarks if step.as_str().starts_with("idem.undo") => {
                return Err(StoreError::TooLarge {
                    part: ValuePart::Step(step.as_str().to_owned()),
                    size: value.len() + step.as_str().len(),
                    limit: 0,
                });
            }
            _ => {}
        }
        self.inner.checkpoint(lease, step, value).await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }

    fn expiry(&self) -> Expiry {
        self.inner.expiry()
    }
}

fn flawed(flaw: Flaw) -> Target {
    Target::virtual_time(format!("{flaw:?}"), move |clock| async move {
        Ok::<_, Infallible>(Flawed {
            inner: MemoryStore::with_clock(clock),
            flaw,
        })
    })
}

fn explore_flawed(flaw: Flaw, scenarios: &[Scenario]) -> Report {
    Explorer::new(flawed(flaw))
        .scenarios(scenarios.iter().copied())
        .run()
        .expect("the exploration runs")
}

fn at_point(process: Process, name: &str, fault: Fault) -> PlacedFault {
    PlacedFault {
        point: FaultPoint {
            process,
            site: Site::Point {
                name: name.into(),
                occurrence: 0,
            },
        },
        fault,
    }
}

/// The report has violations of `kind`, and prints them.
fn assert_found(report: &Report, kind: &str) {
    println!("{report}");
    assert!(
        report.by_kind().contains_key(kind),
        "expected violations of kind `{kind}`:\n{report}"
    );
}

#[test]
fn a_store_that_loses_completed_results_is_reported() {
    let report = explore_flawed(Flaw::LosesCompletedResults, &[Scenario::Plain]);
    // Even the fault-free run: the retry after the result runs the work again.
    assert_found(&report, "result lost");
    assert_found(&report, "effect repeated");
}

#[test]
fn a_store_that_answers_claimed_to_every_claim_is_reported() {
    let report = explore_flawed(
        Flaw::ClaimsEveryKey,
        &[Scenario::Plain, Scenario::WaitDuplicate],
    );
    // A retry after a crash, or the waiting duplicate, is granted the key while the
    // first owner's lease lives, and runs the effect again.
    assert_found(&report, "effect repeated");
    assert!(
        report.violations().any(|v| {
            matches!(&v.broken, idem_testkit::explore::Broken::Repeated { why, .. } if why.contains("lease was live"))
        }),
        "{report}"
    );
}

#[test]
fn a_store_that_forgets_checkpoints_is_reported() {
    let report = explore_flawed(Flaw::ForgetsCheckpoints, &[Scenario::Steps]);
    // A crash after a step's checkpoint "landed": the takeover runs the step again.
    assert_found(&report, "effect repeated");
}

#[test]
fn a_stale_owner_repeating_an_effect_is_reported_not_a_panic() {
    // The duplicate is granted the key while p1 stalls, pays and is dropped; p1 then pays
    // again under its older lease: the repeat comes from the owner that claimed first.
    let run = Explorer::new(flawed(Flaw::ClaimsEveryKey))
        .run_plan(
            Scenario::WaitDuplicate,
            vec![
                at_point(Process::First, "after-reserve", Fault::StallAtPoint),
                at_point(Process::Duplicate, "after-effect", Fault::DropAtPoint),
            ],
        )
        .expect("the run is checked without a panic");
    println!("{run}");
    assert!(
        run.violations.iter().any(|v| matches!(
            &v.broken,
            Broken::Repeated {
                first: Process::Duplicate,
                again: Process::First,
                ..
            }
        )),
        "{run}"
    );
}

#[test]
fn a_store_whose_renewals_extend_nothing_is_reported() {
    let report = explore_flawed(
        Flaw::RenewsWithoutExtending,
        &[Scenario::LongWork, Scenario::WaitDuplicate],
    );
    println!("{report}");
    // Every renewal answered keeps the old end.
    for scenario in &report.scenarios {
        assert!(
            scenario
                .violations
                .iter()
                .any(|v| matches!(v.broken, Broken::LeaseNotExtended { .. })),
            "{report}"
        );
    }
    // And the duplicate takes over a stalled first caller whose lease ran out under its
    // heartbeats, and runs its step again: no excuse covers that.
    assert!(
        report.scenarios[1].violations.iter().any(|v| matches!(
            &v.broken,
            Broken::Repeated { why, .. } if why.contains("ran out under heartbeats")
        )),
        "{report}"
    );
}

#[test]
fn a_drop_after_the_checkpoint_was_sent_excuses_nothing() {
    // p1's caller goes away while the checkpoint of `reserve` is pending: the driver's
    // write goes on in its own task, so the step running again is not the drop's doing.
    let drop = PlacedFault {
        point: FaultPoint {
            process: Process::First,
            site: Site::Call {
                index: 1,
                operation: Operation::Checkpoint,
            },
        },
        fault: Fault::DropBefore,
    };
    let run = Explorer::new(flawed(Flaw::FailsStepCheckpoints))
        .run_plan(Scenario::Steps, vec![drop])
        .expect("the exploration runs");
    println!("{run}");
    assert!(
        run.violations.iter().any(|v| matches!(
            &v.broken,
            Broken::Repeated { first: Process::First, why, .. } if why.contains("checkpoint")
        )),
        "{run}"
    );
    assert!(
        !run.at_least_once.iter().any(|a| a.contains("after p1")),
        "{run}"
    );
}

#[test]
fn a_compensation_that_undoes_nothing_is_reported() {
    let report = explore_flawed(
        Flaw::RefusesUndoMarks,
        &[
            Scenario::SagaFailsAfterSteps,
            Scenario::SagaUndoUnknown,
            Scenario::SagaUndoRetryable,
            Scenario::SagaStepTooLarge,
            Scenario::BytesSaga,
        ],
    );
    // Every step reported pending is a compensation that accounts for every step and
    // runs no undo twice: only the fault-free run's documented compensation (and, for
    // the undo answering Unknown, its step always interrupted) tells it from one that
    // works. The marker's compensation is read from the record.
    println!("{report}");
    for scenario in &report.scenarios {
        assert!(
            scenario
                .violations
                .iter()
                .any(|v| v.broken.kind() == "compensation unexpected"),
            "{report}"
        );
    }
}
