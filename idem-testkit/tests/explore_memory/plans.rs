//! Single runs with chosen faults on the memory store: a pause or a partition survived
//! beside a racer, a plan replayed exactly, a late claim's copy, an owner cut off.

use idem_core::store::Operation;
use idem_testkit::explore::{Explorer, Fault, PlacedFault, Process, Scenario};

use crate::support::{at_call, at_point, memory};

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
