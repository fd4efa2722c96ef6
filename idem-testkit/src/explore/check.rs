//! The checks after a run, on the ledger alone: effects at most once unless the contract
//! allows more (and then classified so), undos at most once, every registered undo
//! accounted for, one result for everyone and replayed after, `resumed` right, `execute`
//! within its bound, no panic.

use std::collections::{BTreeMap, BTreeSet};

use idem_core::{Operation, Timestamp};

use super::faults::Process;
use super::ledger::{Answer, Effect, End, Event};
use super::report::Broken;
use super::scenarios::{Expect, Scenario};
use super::{Timing, execute_bound};

/// What the checks found in one run.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) broken: Vec<Broken>,
    /// Each effect that happened again as the contract allows, said why.
    pub(crate) at_least_once: Vec<String>,
}

pub(crate) fn check(
    scenario: Scenario,
    timing: &Timing,
    events: &[Event],
    retries: u32,
) -> Verdict {
    let mut verdict = Verdict::default();
    ends(scenario, timing, events, &mut verdict);
    resumed(events, &mut verdict);
    effects(timing, events, &mut verdict);
    results(scenario, events, retries, &mut verdict);
    compensation(scenario, events, &mut verdict);
    verdict
}

/// Panics, executions that never returned, answers no correct driver gives, and
/// executions over their bound.
fn ends(scenario: Scenario, timing: &Timing, events: &[Event], verdict: &mut Verdict) {
    for event in events {
        let Event::Ended { process, end } = event else {
            continue;
        };
        let process = *process;
        let broken = match end {
            End::Panicked(message) => Some(Broken::Panicked {
                process,
                message: message.clone(),
            }),
            End::DidNotReturn(waited) => Some(Broken::DidNotReturn {
                process,
                waited: *waited,
            }),
            End::Setup(error) => Some(Broken::Setup {
                process,
                error: error.clone(),
            }),
            End::Returned { answer, took } => {
                let unexpected = match answer {
                    Answer::Error { fine, .. } => !fine,
                    Answer::Retryable(_) => !scenario.may_answer_retryable(),
                    Answer::Unknown(_) => !scenario.may_answer_unknown(),
                    _ => false,
                };
                let bound = bound(scenario, timing, events, process);
                if unexpected {
                    Some(Broken::UnexpectedAnswer {
                        process,
                        answer: answer.to_string(),
                    })
                } else if *took > bound + timing.slack {
                    Some(Broken::TooSlow {
                        process,
                        took: *took,
                        bound,
                    })
                } else {
                    None
                }
            }
            End::Dropped { .. } | End::Crashed => None,
        };
        verdict.broken.extend(broken);
    }
}

/// [`execute_bound`] for what `process` did: its work's own time, and its distinct writes.
fn bound(
    scenario: Scenario,
    timing: &Timing,
    events: &[Event],
    process: Process,
) -> std::time::Duration {
    let mut work = std::time::Duration::ZERO;
    let mut writes = BTreeSet::new();
    for event in events {
        match event {
            Event::WorkTime {
                process: p,
                duration,
            } if *p == process => work += *duration,
            Event::Call {
                process: p,
                operation,
                step,
                by_work: false,
            } if *p == process
                && matches!(
                    operation,
                    Operation::Checkpoint
                        | Operation::Complete
                        | Operation::Fail
                        | Operation::Release
                ) =>
            {
                writes.insert((operation.to_string(), step.clone()));
            }
            _ => {}
        }
    }
    let writes = u32::try_from(writes.len()).unwrap_or(u32::MAX);
    execute_bound(
        timing.lease,
        timing.store_timeout,
        scenario.wait(timing),
        work,
        writes,
    )
}

/// `ctx.resumed()` is true exactly after a takeover: a token above the first claim's. And
/// every new owner's token is above every earlier owner's.
fn resumed(events: &[Event], verdict: &mut Verdict) {
    let mut owners: Vec<(Process, u64)> = Vec::new();
    for event in events {
        if let Event::Claimed { process, token, .. } = event {
            if let Some((first, held)) = owners
                .iter()
                .find(|(owner, held)| owner != process && held >= token)
            {
                verdict.broken.push(Broken::TokenNotGreater {
                    first: *first,
                    again: *process,
                    token: *held,
                    then: *token,
                });
            }
            owners.push((*process, *token));
        }
    }
    for event in events {
        if let Event::WorkStarted {
            process,
            token,
            resumed,
        } = event
            && *resumed != (*token > 1)
        {
            verdict.broken.push(Broken::Resumed {
                process: *process,
                token: *token,
                resumed: *resumed,
            });
        }
    }
}

/// Why an effect may have happened again.
enum Excuse {
    Crash,
    DropMidWork,
    LeaseRanOut,
}

/// Every effect at most once, unless the contract allows it again (and then it is
/// classified at-least-once); every undo at most once, always.
fn effects(timing: &Timing, events: &[Event], verdict: &mut Verdict) {
    let mut by_effect: BTreeMap<&Effect, Vec<(usize, Process)>> = BTreeMap::new();
    for (at, event) in events.iter().enumerate() {
        if let Event::Effect { process, effect } = event {
            by_effect.entry(effect).or_default().push((at, *process));
        }
    }
    for (effect, runs) in by_effect {
        for pair in runs.windows(2) {
            let ((first_at, first), (again_at, again)) = (pair[0], pair[1]);
            if let Effect::Undo(step) = effect {
                verdict.broken.push(Broken::UndoRepeated {
                    step: step.clone(),
                    first,
                    again,
                });
                continue;
            }
            match excuse(timing, events, effect, (first_at, first), (again_at, again)) {
                Ok(excuse) => verdict.at_least_once.push(format!(
                    "{effect} again in {again}, after {first} {}",
                    match excuse {
                        Excuse::Crash => "crashed",
                        Excuse::DropMidWork => "was dropped mid-work",
                        Excuse::LeaseRanOut => "lost its lease mid-work",
                    }
                )),
                Err(why) => verdict.broken.push(Broken::Repeated {
                    effect: effect.to_string(),
                    first,
                    again,
                    why,
                }),
            }
        }
    }
}

/// The contract's reason for `again` to repeat `first`'s effect, or why there is none.
///
/// An effect may happen again only on a takeover (the store granted the key to `again`
/// after `first`'s lease ran out), when `first` did not store it (its checkpoint, or its
/// result for the work's own effect) and `first`'s process crashed, or its caller dropped
/// `execute` while the work still ran, or it was still running when its lease ran out.
fn excuse(
    timing: &Timing,
    events: &[Event],
    effect: &Effect,
    (first_at, first): (usize, Process),
    (again_at, again): (usize, Process),
) -> Result<Excuse, String> {
    let stored = events[first_at + 1..again_at]
        .iter()
        .any(|event| match (effect, event) {
            (Effect::Step(name), Event::Checkpointed { process, step }) => {
                *process == first && step == name
            }
            (Effect::Work, Event::Finished { process }) => *process == first,
            _ => false,
        });
    if stored {
        return Err(format!("{first} had stored it before"));
    }
    if first == again {
        return Err("the same process ran it twice".into());
    }
    // The lease `again` ran it under: the last the store granted it before the effect.
    let Some((claim_at, claimed_until)) =
        events[..again_at]
            .iter()
            .enumerate()
            .rev()
            .find_map(|(at, event)| match event {
                Event::Claimed {
                    process,
                    lease_until,
                    ..
                } if *process == again => Some((at, *lease_until)),
                _ => None,
            })
    else {
        return Err(format!("the store never granted {again} the key"));
    };
    let claimed_at = Timestamp::from_unix_millis(
        claimed_until
            .as_unix_millis()
            .saturating_sub(u64::try_from(timing.lease.as_millis()).unwrap_or(u64::MAX)),
    );
    let first_until = events[..claim_at]
        .iter()
        .filter_map(|event| match event {
            Event::Claimed {
                process,
                lease_until,
                ..
            }
            | Event::Renewed {
                process,
                lease_until,
            } if *process == first => Some(*lease_until),
            _ => None,
        })
        .max();
    let released = events[..claim_at]
        .iter()
        .any(|event| matches!(event, Event::Released { process } if *process == first));
    if !released && first_until.is_some_and(|until| until > claimed_at) {
        return Err(format!(
            "the store granted {again} the key while {first}'s lease was live"
        ));
    }
    let first_end = events[first_at + 1..claim_at]
        .iter()
        .find_map(|event| match event {
            Event::Ended { process, end } if *process == first => Some(end),
            _ => None,
        });
    match first_end {
        // Still running when the store let `again` take over: its lease ran out mid-work.
        None => Ok(Excuse::LeaseRanOut),
        Some(End::Crashed) => Ok(Excuse::Crash),
        Some(End::Dropped {
            work_returned: false,
        }) => Ok(Excuse::DropMidWork),
        Some(End::Dropped {
            work_returned: true,
        }) => Err(format!(
            "{first}'s caller dropped execute after the work returned, and its result was never \
             stored: the final write must survive the caller going away"
        )),
        Some(other) => Err(format!("{first} ended ({other}) without storing it")),
    }
}

/// Every caller with a result got the same one, of the scenario's kind, and the retry
/// after replayed it.
fn results(scenario: Scenario, events: &[Event], retries: u32, verdict: &mut Verdict) {
    let answers: Vec<(Process, &Answer)> = events
        .iter()
        .filter_map(|event| match event {
            Event::Ended {
                process,
                end: End::Returned { answer, .. },
            } => Some((*process, answer)),
            _ => None,
        })
        .collect();
    let with_results: Vec<(Process, &Answer, String)> = answers
        .iter()
        .filter_map(|(process, answer)| answer.result().map(|r| (*process, *answer, r)))
        .collect();
    let Some((first, first_answer, first_result)) = with_results.first() else {
        verdict.broken.push(Broken::NoResult { retries });
        return;
    };
    for (other, _, result) in &with_results[1..] {
        if result != first_result {
            verdict.broken.push(Broken::ResultsDiffer {
                first: (*first, first_result.clone()),
                other: (*other, result.clone()),
            });
        }
    }
    let kind_fits = matches!(
        (scenario.expect(), first_answer),
        (Expect::Completed, Answer::Completed { .. })
            | (Expect::Failed, Answer::Failed { .. })
            | (Expect::Compensated, Answer::Compensated { .. })
    );
    if !kind_fits {
        verdict.broken.push(Broken::UnexpectedResult {
            expected: match scenario.expect() {
                Expect::Completed => "completed",
                Expect::Failed => "failed",
                Expect::Compensated => "compensated",
            },
            got: first_result.clone(),
        });
    }
    let check = events.iter().find_map(|event| match event {
        Event::Ended {
            process: Process::Check,
            end,
        } => Some(end),
        _ => None,
    });
    let lost = match check {
        Some(End::Returned { answer, .. }) => {
            if answer.result().as_ref() != Some(first_result) {
                Some(answer.to_string())
            } else if !answer.replayed() {
                Some(format!("{answer}, run again instead of replayed"))
            } else {
                None
            }
        }
        Some(other) => Some(other.to_string()),
        None => Some("no answer: the check never ran".into()),
    };
    if let Some(then) = lost {
        verdict.broken.push(Broken::ResultLost {
            seen: first_result.clone(),
            then,
        });
    }
}

/// Every step that registered an undo (its checkpoint stored) is in exactly one of
/// undone, failed, pending, interrupted; undone ones ran once, pending ones never.
fn compensation(scenario: Scenario, events: &[Event], verdict: &mut Verdict) {
    let Some(compensation) = events.iter().find_map(|event| match event {
        Event::Ended {
            end:
                End::Returned {
                    answer: Answer::Compensated { compensation, .. },
                    ..
                },
            ..
        } => Some(compensation),
        _ => None,
    }) else {
        return;
    };
    let registered: BTreeSet<&str> = scenario
        .undo_steps()
        .iter()
        .copied()
        .filter(|name| {
            events
                .iter()
                .any(|event| matches!(event, Event::Checkpointed { step, .. } if step == name))
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
    for step in &compensation.undone {
        let ran = ran(step);
        if ran != 1 {
            verdict.broken.push(Broken::CompensationUntrue {
                step: step.clone(),
                listed: "undone",
                ran,
            });
        }
    }
    for step in &compensation.pending {
        let ran = ran(step);
        if ran != 0 {
            verdict.broken.push(Broken::CompensationUntrue {
                step: step.clone(),
                listed: "pending",
                ran,
            });
        }
    }
}
