//! The checks on ledgers written by hand: lifetimes, where a compensation lists each
//! undo, and which repeated effects are excused.

use idem_core::{Compensation, Timestamp};

use super::compensation::placed;
use super::*;
use crate::explore::FaultPoint;
use crate::explore::faults::Site;
use crate::explore::ledger::Effect;
/// p1 has `debit`'s effect, then (with `passed`) reaches the point after the step,
/// then crashes; r1 takes over once p1's lease ended and has the effect again.
fn crash_after_the_effect(passed: bool) -> Vec<Event> {
    let at = |millis: u64| Timestamp::from_unix_millis(1_000_000 + millis);
    let mut events = vec![
        Event::Claimed {
            process: Process::First,
            token: 1,
            lease_until: at(2_000),
            resumed: false,
        },
        Event::Effect {
            process: Process::First,
            effect: Effect::Step("debit".into()),
            at: at(500),
        },
    ];
    if passed {
        events.push(Event::Reached(FaultPoint {
            process: Process::First,
            site: Site::Point {
                name: "after-debit".into(),
                occurrence: 0,
            },
        }));
    }
    events.extend([
        Event::Ended {
            process: Process::First,
            end: End::Crashed,
        },
        Event::Claimed {
            process: Process::Retry(1),
            token: 2,
            lease_until: at(6_000),
            resumed: true,
        },
        Event::Effect {
            process: Process::Retry(1),
            effect: Effect::Step("debit".into()),
            at: at(4_500),
        },
    ]);
    events
}

/// The effects check alone over `events`, one lifetime, on virtual time.
fn effects_of(events: &[Event]) -> Verdict {
    let mut verdict = Verdict::default();
    effects(&Timing::virtual_time(), events, &[0], &mut verdict);
    verdict
}

fn claimed(process: Process, token: u64, lease_until: u64) -> Event {
    Event::Claimed {
        process,
        token,
        lease_until: Timestamp::from_unix_millis(1_000_000 + lease_until),
        resumed: token > 1,
    }
}

fn effect(process: Process, effect: Effect, at: u64) -> Event {
    Event::Effect {
        process,
        effect,
        at: Timestamp::from_unix_millis(1_000_000 + at),
    }
}

fn cut(process: Process) -> Event {
    Event::CutOff {
        process,
        paused: false,
    }
}

fn compensation(json: &str) -> Compensation {
    serde_json::from_str(json).expect("a compensation")
}

fn mark(process: Process, name: &str) -> Event {
    Event::Checkpointed {
        process,
        step: name.to_owned(),
    }
}

fn misplaced(events: &[Event], listed: &Compensation) -> Vec<(String, &'static str)> {
    let mut verdict = Verdict::default();
    placed(Scenario::SagaFailsAfterSteps, events, listed, &mut verdict);
    verdict
        .broken
        .into_iter()
        .map(|broken| match broken {
            Broken::CompensationMisplaced { step, listed, .. } => (step, listed),
            other => panic!("{other:?}"),
        })
        .collect()
}

/// A fresh grant begins a lifetime only once the record before was past its
/// retention, counted from the latest lease or result it held.
#[test]
fn a_lifetime_begins_only_after_the_record_expired() {
    let mut timing = Timing::virtual_time();
    timing.retention = timing.lease;
    let fresh = |process, token, lease_until: u64| Event::Claimed {
        process,
        token,
        lease_until: Timestamp::from_unix_millis(1_000_000 + lease_until),
        resumed: false,
    };
    let finished = |process, at: u64| Event::Finished {
        process,
        at: Timestamp::from_unix_millis(1_000_000 + at),
    };
    // p1 claims at 0 (lease to 2 s), takes a step, is taken over at 2.5 s (lease to
    // 4.5 s: kept to 6.5 s), and the racer stores its result at 3 s (kept to 5 s).
    let mut events = vec![
        fresh(Process::First, 1, 2_000),
        mark(Process::First, "reserve"),
        claimed(Process::Racer, 2, 4_500),
        finished(Process::Racer, 3_000),
    ];
    // Granted afresh at 6 s (lease to 8 s): too soon, the takeover's lease kept it.
    events.push(fresh(Process::Check, 3, 8_000));
    assert_eq!(lifetimes(&timing, &events), [0]);
    events.pop();
    // At 6.5 s: a new lifetime.
    events.push(fresh(Process::Check, 3, 8_500));
    assert_eq!(lifetimes(&timing, &events), [0, 4]);
    // The default retention (an hour) keeps it past the whole run.
    assert_eq!(lifetimes(&Timing::virtual_time(), &events), [0]);
}

/// Listed interrupted: only with its start mark the last of its marks to land.
#[test]
fn an_undo_is_interrupted_only_after_its_start_mark() {
    let listed = compensation(r#"{"undone":["notify","debit"],"interrupted":["reserve"]}"#);
    let undone = [
        mark(Process::First, "idem.undo:notify"),
        mark(Process::First, "idem.undone:notify"),
        mark(Process::First, "idem.undo:debit"),
        mark(Process::First, "idem.undone:debit"),
    ];
    let mut events = vec![claimed(Process::First, 1, 2_000)];
    events.extend(undone);
    assert_eq!(
        misplaced(&events, &listed),
        [("reserve".into(), "interrupted")]
    );
    events.push(mark(Process::First, "idem.undo:reserve"));
    assert_eq!(misplaced(&events, &listed), []);
    events.push(mark(Process::First, "idem.undone:reserve"));
    assert_eq!(
        misplaced(&events, &listed),
        [("reserve".into(), "interrupted")]
    );
    // A late copy of the start mark, under the same grant, changes nothing.
    events.push(mark(Process::First, "idem.undo:reserve"));
    assert_eq!(
        misplaced(&events, &listed),
        [("reserve".into(), "interrupted")]
    );
    // A retried undo starts again, under its new owner's grant, after the first end.
    events.push(claimed(Process::Retry(1), 2, 6_000));
    events.push(mark(Process::Retry(1), "idem.undo:reserve"));
    assert_eq!(misplaced(&events, &listed), []);
}

/// Listed pending: only after a failed undo (or for a step that cannot be undone).
#[test]
fn an_undo_is_pending_only_behind_a_failed_one() {
    let ran = |steps: &[&str]| -> Vec<Event> {
        steps
            .iter()
            .flat_map(|step| {
                [
                    mark(Process::First, &format!("idem.undo:{step}")),
                    mark(Process::First, &format!("idem.undone:{step}")),
                ]
            })
            .collect()
    };
    let nothing_failed = compensation(r#"{"undone":["notify","debit"],"pending":["reserve"]}"#);
    assert_eq!(
        misplaced(&ran(&["notify", "debit"]), &nothing_failed),
        [("reserve".into(), "pending")]
    );
    let stopped = compensation(
        r#"{"undone":["notify"],"failed":{"step":"debit","error":"refused"},"pending":["reserve"]}"#,
    );
    // `debit`'s undo succeeds in this scenario: listing it failed is misplaced too.
    assert_eq!(
        misplaced(&ran(&["notify", "debit"]), &stopped),
        [("debit".into(), "failed")]
    );
}

/// Listed undone: only once its end mark landed after its start (an undo that never
/// marks its end would otherwise pass, listed interrupted by every takeover).
#[test]
fn an_undo_is_undone_only_after_its_end_mark() {
    let listed = compensation(r#"{"undone":["notify","debit","reserve"]}"#);
    let mut events: Vec<Event> = ["notify", "debit", "reserve"]
        .iter()
        .map(|step| mark(Process::First, &format!("idem.undo:{step}")))
        .collect();
    assert_eq!(misplaced(&events, &listed).len(), 3);
    for step in ["notify", "debit", "reserve"] {
        events.push(mark(Process::First, &format!("idem.undone:{step}")));
    }
    assert_eq!(misplaced(&events, &listed), []);
}

/// p1 (lease to 2 s) is cut off; the racer is granted the key with its lease ending at
/// `racer_until` (granted one lease, 2 s, before), has the work's effect and stores it;
/// p1 then has it too, outside any step.
fn work_after_a_cut(racer_until: u64) -> Verdict {
    let events = vec![
        claimed(Process::First, 1, 2_000),
        cut(Process::First),
        claimed(Process::Racer, 2, racer_until),
        effect(Process::Racer, Effect::Work, racer_until - 1_900),
        Event::Finished {
            process: Process::Racer,
            at: Timestamp::from_unix_millis(1_000_000 + racer_until - 1_900),
        },
        effect(Process::First, Effect::Work, racer_until - 1_800),
    ];
    effects_of(&events)
}

/// Found by the long run: p1, cut off, has the work's effect after its lease ended and
/// before the racer (which took over after the cut) has it: the same excuse.
#[test]
fn the_cut_owner_first_and_the_new_owner_after_is_at_least_once() {
    let events = vec![
        claimed(Process::First, 1, 2_000),
        cut(Process::First),
        claimed(Process::Racer, 2, 4_500),
        effect(Process::First, Effect::Work, 4_000),
        effect(Process::Racer, Effect::Work, 6_000),
    ];
    let verdict = effects_of(&events);
    assert!(verdict.broken.is_empty(), "{:?}", verdict.broken);
    assert!(
        matches!(&verdict.at_least_once[..], [why] if why.contains("p1 had been cut off")),
        "{:?}",
        verdict.at_least_once
    );
}

#[test]
fn the_work_outside_a_step_after_a_cut_is_at_least_once() {
    let verdict = work_after_a_cut(6_000);
    assert!(verdict.broken.is_empty(), "{:?}", verdict.broken);
    assert!(
        matches!(&verdict.at_least_once[..], [why] if why.contains("p1 had been cut off")),
        "{:?}",
        verdict.at_least_once
    );
}

/// The cut excuses nothing when the store granted the key while p1's lease lived.
#[test]
fn a_cut_excuses_no_grant_over_a_live_lease() {
    let verdict = work_after_a_cut(3_000);
    assert!(verdict.at_least_once.is_empty());
    assert!(
        matches!(&verdict.broken[..], [Broken::Repeated { .. }]),
        "{:?}",
        verdict.broken
    );
}

/// Cut off, p1 starts a step after its lease ended (a driver that does not stop by
/// its own clock), then the racer takes over and runs it again: never excused, though
/// p1 never stored it and was partitioned.
#[test]
fn a_step_started_after_the_lease_ended_is_never_excused() {
    let events = vec![
        claimed(Process::First, 1, 2_000),
        cut(Process::First),
        effect(Process::First, Effect::Step("debit".into()), 2_100),
        claimed(Process::Racer, 2, 4_500),
        effect(Process::Racer, Effect::Step("debit".into()), 2_600),
    ];
    let verdict = effects_of(&events);
    assert!(verdict.at_least_once.is_empty());
    assert!(
        matches!(&verdict.broken[..], [Broken::Repeated { why, .. }] if why.contains("started it 100 ms after its lease had ended")),
        "{:?}",
        verdict.broken
    );
    // Started while the lease lived, the same partition excuses it.
    let mut events = events;
    events[2] = effect(Process::First, Effect::Step("debit".into()), 1_900);
    let verdict = effects_of(&events);
    assert!(verdict.broken.is_empty(), "{:?}", verdict.broken);
    assert_eq!(verdict.at_least_once.len(), 1);
}

#[test]
fn a_crash_between_the_effect_and_its_checkpoint_is_at_least_once() {
    let verdict = effects_of(&crash_after_the_effect(false));
    assert!(verdict.broken.is_empty(), "{:?}", verdict.broken);
    assert_eq!(verdict.at_least_once.len(), 1);
}

/// A driver that lets the work past a step before its checkpoint is stored (deferred
/// checkpoints) crashes there with the step unrecorded: the repeat is its fault, not
/// the crash's, and is reported.
#[test]
fn a_crash_after_the_step_returned_excuses_nothing() {
    let verdict = effects_of(&crash_after_the_effect(true));
    assert!(verdict.at_least_once.is_empty());
    assert!(
        matches!(&verdict.broken[..], [Broken::Repeated { why, .. }] if why.contains("gone past `debit`")),
        "{:?}",
        verdict.broken
    );
}
