//! The checks after a run, on the ledger alone: effects at most once unless the contract
//! allows more (and then classified so), undos at most once, every registered undo
//! accounted for, one result for everyone and replayed after, `resumed` right, `execute`
//! within its bound, no panic.

use std::collections::{BTreeMap, BTreeSet};

use idem_core::{Timestamp, store::Operation};

use super::faults::Process;
use super::ledger::{Answer, Effect, End, Event, compensation_text};
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

/// Checks one run's ledger; `fault_free` says the run had no fault planned, so that its
/// compensation must be exactly the scenario's documented one.
pub(crate) fn check(
    scenario: Scenario,
    timing: &Timing,
    events: &[Event],
    retries: u32,
    fault_free: bool,
) -> Verdict {
    let mut verdict = Verdict::default();
    ends(scenario, timing, events, &mut verdict);
    resumed(events, &mut verdict);
    renewals(events, &mut verdict);
    effects(timing, events, &mut verdict);
    results(scenario, events, retries, &mut verdict);
    compensation(scenario, events, fault_free, &mut verdict);
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

/// Every renewal the store granted extends the lease it was asked to renew: a store
/// that answers Renewed and keeps the old end lets the lease run out under heartbeats.
fn renewals(events: &[Event], verdict: &mut Verdict) {
    for event in events {
        if let Event::Renewed {
            process,
            asked,
            lease_until,
        } = event
            && lease_until <= asked
        {
            verdict.broken.push(Broken::LeaseNotExtended {
                process: *process,
                held_until: asked.as_unix_millis(),
                renewed_until: lease_until.as_unix_millis(),
            });
        }
    }
}

/// Why an effect may have happened again. A lease that ran out while its owner still
/// ran is none: heartbeats renew it every third of a lease, and a failed renewal costs
/// one interval, so under the explorer's faults it never runs out unless something broke
/// (every scenario runs with heartbeats on).
enum Excuse {
    Crash,
    DropMidWork,
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
/// `execute` while the work still ran and before the step's checkpoint was sent (once
/// sent, the driver's write goes on in a task of its own and lands).
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
    let Some(claim_at) = last_claim(events, again, again_at) else {
        return Err(format!("the store never granted {again} the key"));
    };
    if claim_at < first_at {
        // `again` held its lease from before `first` had the effect: it is the stale
        // owner, and `first` was granted the key while it still ran.
        return Err(stale(timing, events, (first_at, first), (claim_at, again)));
    }
    if let Some(why) = granted_while_live(timing, events, first, (claim_at, again)) {
        return Err(why);
    }
    let first_end =
        events[first_at + 1..claim_at]
            .iter()
            .enumerate()
            .find_map(|(offset, event)| match event {
                Event::Ended { process, end } if *process == first => {
                    Some((first_at + 1 + offset, end))
                }
                _ => None,
            });
    match first_end {
        None => Err(format!(
            "{first} was still running when the store granted {again} the key: its lease ran \
             out under heartbeats"
        )),
        Some((_, End::Crashed)) => Ok(Excuse::Crash),
        Some((
            end_at,
            End::Dropped {
                work_returned: false,
            },
        )) => match effect {
            Effect::Step(name) if checkpoint_sent(events, first, name, first_at..end_at) => {
                Err(format!(
                    "{first}'s caller dropped execute after the checkpoint of `{name}` was \
                     sent, and it was never stored: the driver's write must survive the caller \
                     going away"
                ))
            }
            _ => Ok(Excuse::DropMidWork),
        },
        Some((
            _,
            End::Dropped {
                work_returned: true,
            },
        )) => Err(format!(
            "{first}'s caller dropped execute after the work returned, and its result was never \
             stored: the final write must survive the caller going away"
        )),
        Some((_, other)) => Err(format!("{first} ended ({other}) without storing it")),
    }
}

/// Where the store last granted `process` a lease before `before`.
fn last_claim(events: &[Event], process: Process, before: usize) -> Option<usize> {
    events[..before]
        .iter()
        .rposition(|event| matches!(event, Event::Claimed { process: p, .. } if *p == process))
}

/// When the lease granted at `claim_at` started: its end less one lease.
fn claimed_at(timing: &Timing, events: &[Event], claim_at: usize) -> Timestamp {
    let Event::Claimed { lease_until, .. } = &events[claim_at] else {
        return Timestamp::from_unix_millis(0);
    };
    Timestamp::from_unix_millis(
        lease_until
            .as_unix_millis()
            .saturating_sub(u64::try_from(timing.lease.as_millis()).unwrap_or(u64::MAX)),
    )
}

/// Why the store's grant to `owner` at `claim_at` broke `holder`'s live lease, if it did:
/// `holder`'s lease, as the store last granted or renewed it, still ran then, and
/// `holder` had not released it.
fn granted_while_live(
    timing: &Timing,
    events: &[Event],
    holder: Process,
    (claim_at, owner): (usize, Process),
) -> Option<String> {
    let granted = claimed_at(timing, events, claim_at);
    let held_until = events[..claim_at]
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
                ..
            } if *process == holder => Some(*lease_until),
            _ => None,
        })
        .max();
    let released = events[..claim_at]
        .iter()
        .any(|event| matches!(event, Event::Released { process } if *process == holder));
    (!released && held_until.is_some_and(|until| until > granted))
        .then(|| format!("the store granted {owner} the key while {holder}'s lease was live"))
}

/// Why `again`, holding a lease granted (at `claim_at`) before `first` had the effect,
/// had it again: `first` was granted the key while that lease lived, or the lease ran out
/// while `again` still ran. Neither is allowed.
fn stale(
    timing: &Timing,
    events: &[Event],
    (first_at, first): (usize, Process),
    (claim_at, again): (usize, Process),
) -> String {
    let live = match last_claim(events, first, first_at) {
        // `first` was granted the key after `again`'s lease.
        Some(at) if at > claim_at => granted_while_live(timing, events, again, (at, first))
            .map(|why| format!("{why}, and {again} then ran it again under that lease")),
        // Both held leases when `first` had the effect: `again`'s is the later grant.
        Some(_) => granted_while_live(timing, events, first, (claim_at, again)),
        None => None,
    };
    match live {
        Some(why) => why,
        None => format!(
            "{again} ran it under a lease granted before {first} had it: {again}'s lease ran \
             out while it still ran, under heartbeats"
        ),
    }
}

/// True when `process` sent a checkpoint of step `name` within `range` of the ledger.
fn checkpoint_sent(
    events: &[Event],
    process: Process,
    name: &str,
    range: std::ops::Range<usize>,
) -> bool {
    events[range].iter().any(|event| {
        matches!(
            event,
            Event::Call {
                process: p,
                operation: Operation::Checkpoint,
                step: Some(step),
                ..
            } if *p == process && step == name
        )
    })
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
            | (Expect::Marked, Answer::Marked { .. })
    );
    if !kind_fits {
        verdict.broken.push(Broken::UnexpectedResult {
            expected: match scenario.expect() {
                Expect::Completed => "completed",
                Expect::Failed => "failed",
                Expect::Compensated => "compensated",
                Expect::Marked => "with a stored failure marker",
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

/// One list of a compensation: its name, its steps, and how many runs of an undo fit it.
type Listing<'a> = (&'static str, &'a [String], fn(usize) -> bool);

/// Every step that registered an undo (its checkpoint stored, or for a step whose value
/// cannot be stored, its effect) is in exactly one of undone, failed, pending,
/// interrupted; undone ones ran once, interrupted ones at most once, pending ones never.
/// The fault-free run ends with the scenario's documented compensation, and the steps the
/// scenario always reports interrupted are, whatever the faults.
fn compensation(scenario: Scenario, events: &[Event], fault_free: bool, verdict: &mut Verdict) {
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
        // A saga's result without its compensation: the answer or the record lost it.
        if let Some(expected) = documented.filter(|_| has_result) {
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
