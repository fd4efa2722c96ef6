//! The explorer can fail: each flawed store is reported, by the check its flaw breaks.

use idem_core::store::Operation;
use idem_testkit::explore::{Broken, Explorer, Fault, Process, Scenario};

use crate::flawed::{Flaw, explore_flawed, flawed, run_flawed};
use crate::support::{assert_found, at_call, at_point};

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
