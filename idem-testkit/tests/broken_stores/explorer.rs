//! The fault explorer over flawed stores: each flaw found, and the unflawed store passing.

use std::sync::Arc;

use idem_testkit::Namespace;
use idem_testkit::explore::{Explorer, Fault, Report as ExploreReport, Scenario, Target, Timing};

use crate::common::{Flaw, Setup, factory};

/// The explorer over a store with `flaw`: each run a fresh namespace on the run's virtual
/// clock.
fn explore_flawed(flaw: Flaw, scenarios: &[Scenario]) -> ExploreReport {
    explore_flawed_with(flaw, scenarios, Timing::virtual_time())
}

fn explore_flawed_with(flaw: Flaw, scenarios: &[Scenario], timing: Timing) -> ExploreReport {
    let make = factory(Some(flaw), Setup::default());
    let target = Target::virtual_time(format!("{flaw:?}"), move |clock| {
        let store = make(Arc::new(clock), Namespace::fresh());
        async move { Ok::<_, std::convert::Infallible>(store.await) }
    });
    let report = Explorer::new(target)
        .timing(timing)
        .scenarios(scenarios.iter().copied())
        .run()
        .expect("the exploration runs");
    println!("{report}");
    report
}

/// The runs of `report` that broke `kind`, each with a fault of `faults` in its plan.
fn found_with(report: &ExploreReport, kind: &str, faults: &[Fault]) -> usize {
    report
        .violations()
        .filter(|v| v.broken.kind() == kind)
        .filter(|v| v.faults.iter().any(|f| faults.contains(&f.fault)))
        .count()
}

#[test]
fn the_explorer_reports_a_renewal_landing_after_the_release() {
    // The first run answers Retryable and releases; a copy of a heartbeat's renewal lands
    // after that, and this store extends the lease it ended: the key is held for nobody.
    let report = explore_flawed(Flaw::RenewsEndedLeases, &[Scenario::RetryableThenDone]);
    assert!(
        found_with(&report, "late grant", &[Fault::DuplicatedLate]) > 0,
        "{report}"
    );
}

#[test]
fn the_explorer_reports_a_late_claim_that_takes_over() {
    // A copy of the claim lands after the release: this store takes the key over for an
    // execute that is gone.
    let report = explore_flawed(Flaw::LateClaimTakesOver, &[Scenario::RetryableThenDone]);
    assert!(
        found_with(&report, "late grant", &[Fault::DuplicatedLate]) > 0,
        "{report}"
    );
}

#[test]
fn the_explorer_reports_an_undo_listed_interrupted_after_it_ended() {
    // The end marks are lost: whenever a takeover finishes the compensation, it reads an
    // undo that ended as one that started only, and lists it interrupted. No undo runs
    // twice and every step is listed once, so only the derived compensation tells.
    let report = explore_flawed(Flaw::DropsUndoEndMarks, &[Scenario::SagaFailsAfterSteps]);
    assert!(
        found_with(
            &report,
            "compensation misplaced",
            &[Fault::CrashAtPoint, Fault::CrashAfter]
        ) > 0,
        "{report}"
    );
    assert!(
        report
            .violations()
            .all(|v| v.broken.kind() == "compensation misplaced"),
        "{report}"
    );
}

#[test]
fn the_explorer_with_a_retention_equal_to_the_lease_finds_the_retention_cliff() {
    // A record whose owner crashed after a step is absent as soon as its lease lapses
    // when takeovers and checkpoints keep the expiry as it was: the retry claims afresh
    // and runs the step again. The retention must be as short as the lease for a run to
    // reach that edge; with the default hour, the same store passes.
    let mut timing = Timing::virtual_time();
    timing.retention = timing.lease;
    let short = explore_flawed_with(Flaw::ExpiryIgnoresTheLease, &[Scenario::Steps], timing);
    assert!(
        found_with(&short, "effect repeated", &[Fault::CrashAtPoint]) > 0,
        "{short}"
    );
    let long = explore_flawed(Flaw::ExpiryIgnoresTheLease, &[Scenario::Steps]);
    assert!(long.passed(), "{long}");
}

#[test]
fn the_explorer_reports_a_task_left_running() {
    // The explorer lets every task a run left finish before its check; one that never does
    // is reported, not waited for.
    let report = explore_flawed(Flaw::LeaksATaskPerClaim, &[Scenario::Plain]);
    let lingered = report
        .violations()
        .filter(|v| v.broken.kind() == "task lingers")
        .count();
    // Every run: the tasks its processes left, then the one the final check's claim left.
    assert_eq!(lingered, report.runs() * 2, "{report}");
    assert!(
        report
            .violations()
            .all(|v| v.broken.kind() == "task lingers"),
        "{report}"
    );
}

#[test]
fn the_unflawed_store_passes_the_explorer() {
    let make = factory(None, Setup::default());
    let target = Target::virtual_time("unflawed", move |clock| {
        let store = make(Arc::new(clock), Namespace::fresh());
        async move { Ok::<_, std::convert::Infallible>(store.await) }
    });
    let report = Explorer::new(target)
        .scenarios([Scenario::RetryableThenDone, Scenario::LongWork])
        .run()
        .expect("the exploration runs");
    assert!(report.passed(), "{report}");
}
