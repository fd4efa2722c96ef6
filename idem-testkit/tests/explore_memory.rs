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
    Broken, DEFAULT_SEED, ExploreError, Explorer, Fault, FaultPoint, Mode, PlacedFault, Process,
    Report, RunReport, Scenario, Site, Target, Timing,
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

/// One run of `scenario` with `faults` on a store broken by `flaw`, printed.
fn run_flawed(flaw: Flaw, scenario: Scenario, faults: Vec<PlacedFault>) -> RunReport {
    let run = Explorer::new(flawed(flaw))
        .run_plan(scenario, faults)
        .expect("the exploration runs");
    println!("{run}");
    run
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
    /// `checkpoint`, `complete` and `fail` fence on the record's state alone: any write
    /// to a record in progress applies, whichever owner holds it now.
    FenceChecksOnlyState,
    /// A `complete` retried by the owner whose first try landed answers Fenced.
    RetriedCompleteFenced,
}

impl Flawed {
    /// `lease` as the record's current owner, when the flaw lets any owner's write
    /// through to a record in progress.
    async fn fence(&self, lease: &Lease) -> Result<Lease, StoreError> {
        if self.flaw != Flaw::FenceChecksOnlyState {
            return Ok(lease.clone());
        }
        Ok(match self.inner.get(&lease.key).await? {
            Some(record) if record.state == State::InProgress => {
                let mut current = lease.clone();
                current.token = record.token;
                current.attempt = record.attempt;
                current
            }
            _ => lease.clone(),
        })
    }
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
        if self.flaw == Flaw::RetriedCompleteFenced
            && self.inner.get(&lease.key).await?.is_some_and(|record| {
                record.state == State::Completed && record.token == lease.token
            })
        {
            return Ok(WriteOutcome::Fenced);
        }
        self.inner
            .complete(&self.fence(lease).await?, response)
            .await
    }

    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.inner.fail(&self.fence(lease).await?, response).await
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
        self.inner
            .checkpoint(&self.fence(lease).await?, step, value)
            .await
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

fn at_call(process: Process, index: u32, operation: Operation, fault: Fault) -> PlacedFault {
    PlacedFault {
        point: FaultPoint {
            process,
            site: Site::Call { index, operation },
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
    let drop = at_call(Process::First, 1, Operation::Checkpoint, Fault::DropBefore);
    let run = run_flawed(Flaw::FailsStepCheckpoints, Scenario::Steps, vec![drop]);
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

#[test]
fn a_fence_that_checks_only_the_state_is_reported() {
    // p1 pauses after `finish`; the racer takes over and works on for three leases. p1
    // resumes, and the flawed fence lets its result land on the racer's record: p1 and
    // the racer each answer their own. No fault of the explorer before pauses found
    // this: without a process coming back while a newer owner works, a stale write
    // meets no live record.
    let report = explore_flawed(Flaw::FenceChecksOnlyState, &[Scenario::LongWork]);
    assert!(
        report
            .violations()
            .any(|v| v.broken.kind() == "results differ"
                && v.faults.iter().any(|f| f.fault == Fault::PauseAtPoint)),
        "{report}"
    );
}

#[test]
fn a_retried_complete_answered_fenced_is_reported() {
    // The first try of p1's `complete` lands and its answer is lost; the retry is answered
    // Fenced, and the driver tells its caller the lease was lost although its own result
    // is the one stored.
    let lost = at_call(Process::First, 1, Operation::Complete, Fault::LostAnswer);
    let run = run_flawed(Flaw::RetriedCompleteFenced, Scenario::Plain, vec![lost]);
    assert!(
        run.violations.iter().any(|v| matches!(
            &v.broken,
            Broken::UnexpectedAnswer { process: Process::First, answer } if answer.contains("lease")
        )),
        "{run}"
    );
}

#[test]
fn a_pause_and_a_partition_are_survived_with_a_racer_beside() {
    // p1 pauses with the effect of `debit` done and not stored; the racer takes over once
    // the lease ran out and finishes. p1 resumes: its checkpoint is fenced, and it starts
    // no new step. The effect ran twice, as the contract allows for an effect in flight.
    let target = memory();
    let run = Explorer::new(target.clone())
        .run_plan(
            Scenario::Steps,
            vec![at_point(
                Process::First,
                "debit:effect-done",
                Fault::PauseAtPoint,
            )],
        )
        .expect("the exploration runs");
    println!("{run}");
    assert!(run.violations.is_empty(), "{run}");
    assert!(
        run.at_least_once
            .iter()
            .any(|a| a.contains("`debit`") && a.contains("paused")),
        "{run}"
    );
    assert!(run.story.contains("racer: completed"), "{run}");
    // Cut off from the store after `reserve`: the step after it runs, its checkpoint
    // cannot land, p1 stops by its own clock, and the racer runs it again.
    let run = Explorer::new(target)
        .run_plan(
            Scenario::Steps,
            vec![at_point(
                Process::First,
                "after-reserve",
                Fault::PartitionAtPoint,
            )],
        )
        .expect("the exploration runs");
    println!("{run}");
    assert!(run.violations.is_empty(), "{run}");
    assert!(
        run.at_least_once
            .iter()
            .any(|a| a.contains("`debit`") && a.contains("cut off")),
        "{run}"
    );
}

#[test]
fn a_plan_replays_exactly() {
    // Every driver draws its jitter from a seed of its own process: the same plan makes
    // the same run, its every fault point, answer and repeat, so a violation's plan
    // (printed with it) replays it. With the operating system's jitter, 26 of 570 such
    // pairs of runs differed.
    let explorer = Explorer::new(memory());
    let mut compared = 0;
    for scenario in [
        Scenario::LongWork,
        Scenario::WaitDuplicate,
        Scenario::SagaUndoRetryable,
    ] {
        let clean = explorer.run_plan(scenario, Vec::new()).expect("runs");
        for point in &clean.trace {
            for &fault in Fault::for_site(&point.site) {
                let plan = vec![PlacedFault {
                    point: point.clone(),
                    fault,
                }];
                let once = explorer.run_plan(scenario, plan.clone()).expect("runs");
                let again = explorer.run_plan(scenario, plan).expect("runs");
                assert_eq!(once.trace, again.trace, "{once}\n{again}");
                assert_eq!(once.story, again.story, "{once}\n{again}");
                assert_eq!(once.at_least_once, again.at_least_once, "{once}\n{again}");
                assert_eq!(once.violations, again.violations, "{once}\n{again}");
                compared += 1;
            }
        }
    }
    println!("{compared} plans, each run twice alike");
    assert!(compared > 300, "{compared}");
}

#[test]
fn a_late_claim_copy_after_a_takeover_holds_the_key_one_lease() {
    // A limit the contract states (DESIGN.md §2.5): p1 pauses, the racer takes over and
    // releases (Retryable); a copy of p1's claim lands after that. The store no longer
    // knows p1's attempt, so the copy takes the record over for nobody: the next retry
    // is told "in flight" for one lease, then the one after finishes. Nothing runs twice.
    let copy = at_call(Process::First, 0, Operation::Claim, Fault::DuplicatedLate);
    let pause = at_point(Process::First, "reserve:effect-done", Fault::PauseAtPoint);
    let run = Explorer::new(memory())
        .run_plan(Scenario::RetryableThenDone, vec![copy, pause])
        .expect("the exploration runs");
    println!("{run}");
    assert!(run.violations.is_empty(), "{run}");
    assert!(
        run.story
            .contains("r1: error: a request with this key is in flight"),
        "{run}"
    );
    assert!(run.story.contains("r2: completed"), "{run}");
}

/// Per scenario of the exhaustive singles on memory: the runs, and how many of them
/// repeated an effect as the contract allows. Runs replay exactly, so these are exact: a
/// change that widens at-least-once (a driver that stores a checkpoint later than it did,
/// an excuse grown too wide) changes a count, and must say why here.
const SINGLES: [(&str, usize, usize); 19] = [
    ("plain", 33, 8),
    ("steps", 91, 28),
    ("saga-fails-at-step-1", 23, 0),
    ("saga-fails-at-step-2", 87, 6),
    ("saga-fails-at-step-3", 140, 13),
    ("saga-fails-after-steps", 198, 20),
    ("saga-rerun-stops-early", 140, 13),
    ("saga-undo-fails", 161, 20),
    ("prepare-completion", 76, 6),
    ("long-work", 195, 15),
    ("wait-duplicate", 148, 15),
    ("encrypted", 91, 28),
    ("encrypted-saga", 198, 20),
    ("retryable-then-done", 92, 15),
    ("saga-undo-unknown", 187, 20),
    ("saga-undo-retryable", 267, 20),
    ("saga-step-too-large", 92, 13),
    ("saga-step-unserializable", 92, 13),
    ("bytes-saga", 198, 20),
];

#[test]
fn the_singles_repeat_exactly_as_often_as_pinned() {
    let report = Explorer::new(memory())
        .mode(Mode::exhaustive())
        .run()
        .expect("the exploration runs");
    assert!(report.passed(), "{report}");
    let found: Vec<(&str, usize, usize)> = report
        .scenarios
        .iter()
        .map(|s| (s.scenario.as_str(), s.runs, s.at_least_once))
        .collect();
    assert_eq!(found, SINGLES, "{}", report.summary());
}

#[test]
fn an_owner_cut_off_mid_work_stops_by_its_own_clock() {
    // Long work: from `tick-1` on, for two leases, none of p1's calls reach the store, so
    // its heartbeats renew nothing; its work goes on. Its lease ends by its own clock
    // before the racer takes over, and when the work reaches `finish` p1 must not start
    // it: the racer runs it, once. A driver that kept starting steps on a lease it could
    // not renew runs `finish` in both (133 such repeats across the exhaustive run).
    let run = Explorer::new(memory())
        .run_plan(
            Scenario::LongWork,
            vec![at_point(Process::First, "tick-1", Fault::PartitionAtPoint)],
        )
        .expect("the exploration runs");
    println!("{run}");
    assert!(run.violations.is_empty(), "{run}");
    assert!(run.at_least_once.is_empty(), "{run}");
    assert!(run.story.contains("racer: completed"), "{run}");
    assert!(run.story.contains("p1: error"), "{run}");
}

/// The memory store shared by processes whose clocks differ: a handle per process.
fn memory_per_process() -> Target {
    Target::per_process_clocks(
        "memory, a clock per process",
        |clock| async move { Ok::<_, Infallible>(MemoryStore::with_clock(clock)) },
        |store: MemoryStore, clock| async move { Ok::<_, Infallible>(store.sharing_with_clock(clock)) },
    )
}

/// Every single fault and 50 pairs per scenario of `scenarios` on `target` under `timing`:
/// no violation.
fn assert_passes(target: Target, timing: Timing, scenarios: Vec<Scenario>) -> Report {
    let report = Explorer::new(target)
        .timing(timing)
        .scenarios(scenarios)
        .mode(Mode::exhaustive_with_pairs(DEFAULT_SEED, 50))
        .run()
        .expect("the exploration runs");
    println!("{report}");
    assert!(report.passed(), "{report}");
    report
}

#[test]
fn clocks_apart_within_the_margin_break_nothing() {
    // The first caller's clock 10 ms behind, every other process's 10 ms ahead: 20 ms
    // apart, half the driver's margin (a fiftieth of the 2 s lease).
    let mut timing = Timing::virtual_time();
    timing.skew = timing.lease / 200;
    assert_passes(memory_per_process(), timing, Scenario::all());
}

#[test]
fn clocks_apart_past_the_margin_are_reported() {
    // Two leases apart: the waiting duplicate, whose clock is ahead, sees the first
    // caller's live lease as over and takes the key while the first still works. The
    // explorer must see it (that the clocks reach the store at all).
    let mut timing = Timing::virtual_time();
    timing.skew = timing.lease;
    let report = Explorer::new(memory_per_process())
        .timing(timing)
        .scenarios([Scenario::WaitDuplicate])
        .run()
        .expect("the exploration runs");
    assert_found(&report, "effect repeated");
    assert!(
        report.violations().any(|v| matches!(
            &v.broken,
            Broken::Repeated { why, .. } if why.contains("clocks are 4000 ms apart")
        )),
        "{report}"
    );
}

#[test]
fn a_skew_the_target_cannot_apply_is_refused() {
    let mut timing = Timing::virtual_time();
    timing.skew = timing.lease / 200;
    // One store on one clock for every process: the skew would change nothing.
    let refused = Explorer::new(memory()).timing(timing).run();
    assert!(
        matches!(refused, Err(ExploreError::Skew { .. })),
        "{refused:?}"
    );
    timing.skew = timing.lease * 10;
    let refused = Explorer::new(memory_per_process()).timing(timing).run();
    assert!(
        matches!(refused, Err(ExploreError::Skew { .. })),
        "{refused:?}"
    );
}

#[test]
fn a_retention_equal_to_the_lease_breaks_nothing() {
    // Every record's lifetime edge inside the run: a record whose owner stopped (crashed,
    // cut off, unknown outcome) must stay while that owner's lease could come back, and a
    // result stored is forgotten a lease later, after which a caller runs the work again
    // in a lifetime of its own.
    let mut timing = Timing::virtual_time();
    timing.retention = timing.lease;
    assert_passes(memory(), timing, Scenario::all());
}

#[test]
fn a_result_the_work_committed_is_answered_after_its_retention_passed() {
    // The work completes the record in its own transaction, then stalls two leases: the
    // result, kept one lease, is gone by the time the work returns. The driver's
    // confirming write is fenced; it must still answer the result the work committed
    // (it did answer "lease lost", telling the caller to retry, and the retry ran the
    // work again).
    let mut timing = Timing::virtual_time();
    timing.retention = timing.lease;
    let stall = PlacedFault {
        point: FaultPoint {
            process: Process::First,
            site: Site::Point {
                name: "after-commit".into(),
                occurrence: 0,
            },
        },
        fault: Fault::StallAtPoint,
    };
    let run = Explorer::new(memory())
        .timing(timing)
        .run_plan(Scenario::PrepareCompletion, vec![stall])
        .expect("the run runs");
    assert!(run.violations.is_empty(), "{run}");
    assert!(run.story.contains("p1: completed"), "{run}");
}

#[test]
fn the_heartbeat_settings_break_nothing() {
    use idem_core::Heartbeat;
    // Renewing as seldom as the driver allows (nine tenths of the lease less its margin).
    let mut timing = Timing::virtual_time();
    timing.heartbeat = Heartbeat::Every(Duration::from_millis(1_700));
    assert_passes(memory(), timing, Scenario::all());
    // Never renewing: a work that outlasts its lease is taken over (at-least-once, as
    // `Heartbeat::Off` documents, pinned below). The long work, four leases long, never
    // finishes at all, and is left out.
    timing.heartbeat = Heartbeat::Off;
    let scenarios = Scenario::all()
        .into_iter()
        .filter(|s| *s != Scenario::LongWork);
    assert_passes(memory(), timing, scenarios.collect());
}

#[test]
fn without_heartbeats_a_stalled_step_is_run_again_and_said_so() {
    use idem_core::Heartbeat;
    // The first caller stalls two leases with `reserve`'s effect done and not stored; the
    // waiting duplicate takes the key over once the lease ran out, unrenewed, and runs
    // `reserve` again. With heartbeats, the lease never runs out and nothing repeats.
    let stall = PlacedFault {
        point: FaultPoint {
            process: Process::First,
            site: Site::Point {
                name: "reserve:effect-done".into(),
                occurrence: 0,
            },
        },
        fault: Fault::StallAtPoint,
    };
    let mut timing = Timing::virtual_time();
    timing.heartbeat = Heartbeat::Off;
    let off = Explorer::new(memory())
        .timing(timing)
        .run_plan(Scenario::WaitDuplicate, vec![stall.clone()])
        .expect("the run runs");
    assert!(off.violations.is_empty(), "{off}");
    assert!(
        off.at_least_once
            .iter()
            .any(|why| why.contains("worked past its lease with heartbeats off")),
        "{off}"
    );
    let auto = Explorer::new(memory())
        .run_plan(Scenario::WaitDuplicate, vec![stall])
        .expect("the run runs");
    assert!(auto.violations.is_empty(), "{auto}");
    assert!(auto.at_least_once.is_empty(), "{auto}");
}
