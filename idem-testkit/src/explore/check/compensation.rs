//! The check of the compensation: every step that registered an undo is listed once,
//! each list is true to the undos that ran, and each step is where its undo's behaviour
//! and the marks that landed put it.

use std::collections::BTreeSet;

use idem_core::Compensation;

use super::Verdict;
use super::leases::token_at;
use crate::explore::ledger::{Answer, Effect, End, Event, compensation_text};
use crate::explore::report::Broken;
use crate::explore::scenarios::{Expect, Scenario, Undo};

/// One list of a compensation: its name, its steps, and how many runs of an undo fit it.
type Listing<'a> = (&'static str, &'a [String], fn(usize) -> bool);

/// In one lifetime of the record (`events`; `last` says it is the last one): every step
/// that registered an undo (its checkpoint stored, or for a step whose value
/// cannot be stored, its effect) is in exactly one of undone, failed, pending,
/// interrupted; undone ones ran once, interrupted ones at most once, pending ones never.
/// The fault-free run ends with the scenario's documented compensation, and the steps the
/// scenario always reports interrupted are, whatever the faults.
pub(super) fn compensation(
    scenario: Scenario,
    events: &[Event],
    fault_free: bool,
    last: bool,
    verdict: &mut Verdict,
) {
    let answered = events.iter().find_map(|event| match event {
        Event::Ended {
            end:
                End::Returned {
                    answer: Answer::Compensated { compensation, .. },
                    ..
                },
            ..
        } => Some(compensation),
        _ => None,
    });
    let stored = events.iter().find_map(|event| match event {
        Event::StoredCompensation(compensation) => Some(compensation),
        _ => None,
    });
    let Some(compensation) = answered.or(stored) else {
        let documented = scenario.fault_free_compensation();
        let has_result = events.iter().any(|event| {
            matches!(event, Event::Ended { end: End::Returned { answer, .. }, .. } if answer.result().is_some())
        });
        // A saga's result without its compensation: the answer or the record lost it. (A
        // marker's compensation is read from the record after the check: only the last
        // lifetime's can be.)
        let readable = last || scenario.expect() != Expect::Marked;
        if let Some(expected) = documented.filter(|_| has_result && readable) {
            verdict.broken.push(Broken::CompensationUnexpected {
                expected: expected.to_string(),
                got: "no compensation".into(),
            });
        }
        return;
    };
    let registered: BTreeSet<&str> = scenario
        .undo_steps()
        .iter()
        .copied()
        .filter(|name| {
            events.iter().any(|event| match event {
                Event::Checkpointed { step, .. } => step == name,
                Event::Effect {
                    effect: Effect::Step(step),
                    ..
                } => scenario.unstorable_step() == Some(name) && step == name,
                _ => false,
            })
        })
        .collect();
    let listed = |step: &str| -> Vec<&'static str> {
        let mut places = Vec::new();
        places.extend(
            compensation
                .undone
                .iter()
                .filter(|s| *s == step)
                .map(|_| "undone"),
        );
        if compensation.failed.as_ref().is_some_and(|f| f.step == step) {
            places.push("failed");
        }
        places.extend(
            compensation
                .pending
                .iter()
                .filter(|s| *s == step)
                .map(|_| "pending"),
        );
        places.extend(
            compensation
                .interrupted
                .iter()
                .filter(|s| *s == step)
                .map(|_| "interrupted"),
        );
        places
    };
    let mut named: BTreeSet<&str> = registered.clone();
    named.extend(compensation.undone.iter().map(String::as_str));
    named.extend(compensation.pending.iter().map(String::as_str));
    named.extend(compensation.interrupted.iter().map(String::as_str));
    named.extend(compensation.failed.iter().map(|f| f.step.as_str()));
    for step in named {
        let places = listed(step);
        if !(registered.contains(step) && places.len() == 1) {
            verdict.broken.push(Broken::CompensationIncomplete {
                step: step.to_owned(),
                listed: places,
            });
        }
    }
    let ran = |step: &str| {
        events
            .iter()
            .filter(
                |event| matches!(event, Event::Effect { effect: Effect::Undo(s), .. } if s == step),
            )
            .count()
    };
    let lists: [Listing<'_>; 3] = [
        ("undone", &compensation.undone, |ran| ran == 1),
        ("interrupted", &compensation.interrupted, |ran| ran <= 1),
        ("pending", &compensation.pending, |ran| ran == 0),
    ];
    for (listed, steps, fits) in lists {
        for step in steps {
            let ran = ran(step);
            if !fits(ran) {
                verdict.broken.push(Broken::CompensationUntrue {
                    step: step.clone(),
                    listed,
                    ran,
                });
            }
        }
    }
    placed(scenario, events, compensation, verdict);
    if let Some(step) = scenario.always_interrupted()
        && !compensation.interrupted.iter().any(|s| s == step)
    {
        verdict.broken.push(Broken::CompensationUnexpected {
            expected: format!("`{step}` interrupted, its undo's outcome unknown"),
            got: compensation_text(compensation),
        });
    }
    if let Some(expected) = scenario.fault_free_compensation().filter(|_| fault_free) {
        let matches = compensation.undone == expected.undone
            && compensation.failed.as_ref().map(|f| f.step.as_str()) == expected.failed
            && compensation.pending == expected.pending
            && compensation.interrupted == expected.interrupted;
        let complete = expected.failed.is_none()
            && expected.pending.is_empty()
            && expected.interrupted.is_empty();
        if !matches || complete != compensation.is_complete() {
            verdict.broken.push(Broken::CompensationUnexpected {
                expected: expected.to_string(),
                got: compensation_text(compensation),
            });
        }
    }
}

/// Every step is where its undo's behaviour and the marks that landed put it, whatever
/// the faults: the compensation is derived, not only consistent.
///
/// - The scenario's unstorable step is pending (no value to undo it with).
/// - A step after the failed one (in the order undos run, the reverse of the steps') is
///   pending: a failed undo stops the compensation.
/// - Otherwise an undo that fails is failed, one whose outcome is unknown is interrupted,
///   and one that succeeds (at once or on a later try) is undone.
/// - Any step may instead be interrupted when its start mark was the last of its marks to
///   land (a cut between the two); never without a start mark.
/// - A rerun that registers no undo reports what earlier owners registered and left
///   pending.
pub(super) fn placed(
    scenario: Scenario,
    events: &[Event],
    compensation: &Compensation,
    verdict: &mut Verdict,
) {
    // The highest token a mark was written under (its writer's grant). The store reads
    // the marks by token, not by the order they landed: a late copy of a start mark that
    // lands after its own end mark, under the same token, changes nothing.
    let landed = |mark: &str| {
        events
            .iter()
            .enumerate()
            .filter_map(|(at, event)| match event {
                Event::Checkpointed { process, step } if step == mark => {
                    Some(token_at(events, *process, at))
                }
                _ => None,
            })
            .max()
    };
    let failed = compensation.failed.as_ref().map(|f| f.step.as_str());
    // Where each registered step's undo runs: the reverse of the order the steps ran in.
    let order: Vec<&str> = scenario.undo_steps().iter().rev().copied().collect();
    let stopped_before = |step: &str| {
        let at = |name: &str| order.iter().position(|s| *s == name);
        failed.is_some_and(|failed| at(failed) < at(step))
    };
    let mut listings: Vec<(&str, &'static str)> = Vec::new();
    listings.extend(compensation.undone.iter().map(|s| (s.as_str(), "undone")));
    listings.extend(
        compensation
            .failed
            .iter()
            .map(|f| (f.step.as_str(), "failed")),
    );
    listings.extend(compensation.pending.iter().map(|s| (s.as_str(), "pending")));
    listings.extend(
        compensation
            .interrupted
            .iter()
            .map(|s| (s.as_str(), "interrupted")),
    );
    for (step, listed) in listings {
        // The undo started under a later grant than any end (a retried undo starts again
        // under its new owner's token).
        let started = landed(&format!("idem.undo:{step}")).is_some_and(|start| {
            landed(&format!("idem.undone:{step}")).is_none_or(|end| end < start)
        });
        let ever_started = landed(&format!("idem.undo:{step}")).is_some();
        let mut expected = vec![
            if scenario.unstorable_step() == Some(step) || stopped_before(step) {
                "pending"
            } else {
                match scenario.undo(step) {
                    Undo::Permanent => "failed",
                    Undo::Unknown => "interrupted",
                    Undo::Done | Undo::RetryableOnce => "undone",
                }
            },
        ];
        if started && !expected.contains(&"interrupted") {
            expected.push("interrupted");
        }
        if scenario.rerun_registers_nothing() && !ever_started && !expected.contains(&"pending") {
            expected.push("pending");
        }
        // An undo that ran to its end (undone, failed) left its end mark after its start.
        let ended = ever_started && !started;
        let unmarked_end = matches!(listed, "undone" | "failed") && !ended;
        if !expected.contains(&listed) || (listed == "interrupted" && !ever_started) || unmarked_end
        {
            verdict.broken.push(Broken::CompensationMisplaced {
                step: step.to_owned(),
                listed,
                expected,
            });
        }
    }
}
