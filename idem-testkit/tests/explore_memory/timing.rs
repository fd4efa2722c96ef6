//! The memory store under other timings: clocks apart, a retention as short as the
//! lease, heartbeats renewing seldom or never.

use std::time::Duration;

use idem_testkit::explore::{
    Broken, ExploreError, Explorer, Fault, FaultPoint, PlacedFault, Process, Scenario, Site, Timing,
};

use crate::support::{assert_found, assert_passes, memory, memory_per_process};

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
