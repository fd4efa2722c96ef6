//! The checks after a run, on the ledger alone: effects at most once unless the contract
//! allows more (and then classified so), undos at most once, every registered undo
//! accounted for, one result for everyone and replayed after, `resumed` right, `execute`
//! within its bound, no panic.

use std::collections::{BTreeMap, BTreeSet};

use idem_core::{Compensation, Heartbeat, Timestamp, store::Operation};

use super::faults::{PlacedFault, Process, Site};
use super::ledger::{Answer, Effect, End, Event, compensation_text, held_until};
use super::report::Broken;
use super::scenarios::{Expect, Scenario, Undo};
use super::{Timing, execute_bound};

/// What the checks found in one run.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) broken: Vec<Broken>,
    /// Each effect that happened again as the contract allows, said why.
    pub(crate) at_least_once: Vec<String>,
}

/// Checks one run's ledger, made under `plan`; a run with no fault planned must end with
/// exactly the scenario's documented compensation.
pub(crate) fn check(
    scenario: Scenario,
    timing: &Timing,
    events: &[Event],
    retries: u32,
    plan: &[PlacedFault],
) -> Verdict {
    let fault_free = plan.is_empty();
    let mut verdict = Verdict::default();
    // Effects, compensations and results are once per lifetime of the record: a caller
    // after the record expired runs the work again, as the contract says.
    let starts = lifetimes(timing, events);
    ends(scenario, timing, events, &starts, &mut verdict);
    resumed(events, plan, &mut verdict);
    renewals(events, &mut verdict);
    late_grants(events, &starts, &mut verdict);
    effects(timing, events, &starts, &mut verdict);
    let lifetime =
        |n: usize| &events[starts[n]..starts.get(n + 1).copied().unwrap_or(events.len())];
    for n in 0..starts.len() {
        let last = n + 1 == starts.len();
        compensation(
            scenario,
            lifetime(n),
            fault_free && n == 0,
            last,
            &mut verdict,
        );
    }
    results(scenario, events, retries, &starts, &mut verdict);
    for event in events {
        if let Event::Lingered { tasks, after } = event {
            verdict.broken.push(Broken::Lingered {
                tasks: *tasks,
                after: *after,
            });
        }
    }
    verdict
}

/// With `Heartbeat::Off`: `stale`, granted the key before `owner` was and had the work's
/// effect past its unrenewed lease, while `owner` was granted the key once that lease had
/// ended. What `Heartbeat::Off` documents: code outside a step is not guarded.
fn unrenewed(
    timing: &Timing,
    events: &[Event],
    (stale, stale_at): (Process, usize),
    (owner, owner_at): (Process, usize),
) -> Option<Process> {
    if timing.heartbeat != Heartbeat::Off {
        return None;
    }
    let granted_at = last_claim(events, owner, owner_at)?;
    (last_claim(events, stale, stale_at).is_some_and(|at| at < granted_at)
        && granted_while_live(timing, events, stale, (granted_at, owner)).is_none())
    .then_some(stale)
}

/// Whether a claim of `process` may have been tried again within one call of the driver:
/// a fault of the plan struck one of its claims, or it was cut off from the store. The
/// retry's grant says no more than "yours", and the driver then counts a token past the
/// first as a takeover (the safe side: the work finds no step done when the first try in
/// fact created the record afresh over an expired one).
fn claim_retried(events: &[Event], plan: &[PlacedFault], process: Process) -> bool {
    events.iter().any(|event| match event {
        Event::Reached(point) => {
            point.process == process
                && matches!(
                    point.site,
                    Site::Call {
                        operation: Operation::Claim,
                        ..
                    }
                )
                && plan.iter().any(|fault| {
                    fault.point.process == process
                        && matches!((&fault.point.site, &point.site),
                            (Site::Call { index: a, .. }, Site::Call { index: b, .. }) if a == b)
                })
        }
        Event::CutOff { process: p, .. } => *p == process,
        _ => false,
    })
}

/// The token `process` held at `at`: its last grant's before (zero if none).
fn token_at(events: &[Event], process: Process, at: usize) -> u64 {
    events[..at]
        .iter()
        .rev()
        .find_map(|event| match event {
            Event::Claimed {
                process: p, token, ..
            } if *p == process => Some(*token),
            _ => None,
        })
        .unwrap_or(0)
}

/// The lifetime of the record `process` acted in at `at`: the one of the grant its work
/// runs under (the token its last `WorkStarted` before `at` names: a late copy of a claim
/// of its own moves nothing), else of its last grant before, or, never granted the key,
/// the one `at` falls in.
fn grant_lifetime(events: &[Event], starts: &[usize], process: Process, at: usize) -> usize {
    let lifetime_at = |at: usize| starts.iter().rposition(|start| *start <= at).unwrap_or(0);
    let before = &events[..=at.min(events.len().saturating_sub(1))];
    let working = before.iter().rev().find_map(|event| match event {
        Event::WorkStarted {
            process: p, token, ..
        } if *p == process => Some(*token),
        _ => None,
    });
    let granted_with = |token: u64| {
        before.iter().position(|event| {
            matches!(event, Event::Claimed { process: p, token: t, .. } if *p == process && *t == token)
        })
    };
    working
        .and_then(granted_with)
        .or_else(|| {
            before.iter().rposition(
                |event| matches!(event, Event::Claimed { process: p, .. } if *p == process),
            )
        })
        .map_or_else(|| lifetime_at(at), lifetime_at)
}

/// Where each lifetime of the record starts in the ledger: at the run's start, then at
/// every fresh grant (`resumed: false`) made once the record before had expired. A
/// record's expiry only grows, to one retention past the latest of: its fresh claim, the
/// end of every lease a takeover granted or a renewal or checkpoint wrote under, and every
/// result stored (by the clocks the store read: the granting and writing process's). A
/// fresh grant sooner is no new lifetime (the store lost a record it had to keep), and the
/// checks report what that caused. A record released without a step also ends at once;
/// that grant stays in the same lifetime, as it always was.
fn lifetimes(timing: &Timing, events: &[Event]) -> Vec<usize> {
    let retention = millis(timing.retention.max(timing.lease));
    let mut starts = vec![0];
    // The latest moment the current lifetime's record is kept one retention past.
    let mut kept: Option<u64> = None;
    let mut leases: BTreeMap<Process, u64> = BTreeMap::new();
    for (at, event) in events.iter().enumerate() {
        let from = match event {
            Event::Claimed {
                process,
                resumed,
                lease_until,
                ..
            } => {
                let until = lease_until.as_unix_millis();
                leases.insert(*process, until);
                if *resumed {
                    until
                } else {
                    let granted = until.saturating_sub(millis(timing.lease));
                    if kept.is_some_and(|kept| {
                        granted + millis(timing.slack) >= kept.saturating_add(retention)
                    }) {
                        starts.push(at);
                        kept = None;
                    }
                    granted
                }
            }
            Event::Renewed {
                process,
                lease_until,
                ..
            } => {
                let until = lease_until.as_unix_millis();
                leases.insert(*process, until);
                until
            }
            Event::Checkpointed { process, .. } => match leases.get(process) {
                Some(until) => *until,
                None => continue,
            },
            Event::Finished { at, .. } => at.as_unix_millis(),
            _ => continue,
        };
        kept = Some(kept.map_or(from, |kept| kept.max(from)));
    }
    starts
}

/// Panics, executions that never returned, answers no correct driver gives, and
/// executions over their bound.
fn ends(
    scenario: Scenario,
    timing: &Timing,
    events: &[Event],
    starts: &[usize],
    verdict: &mut Verdict,
) {
    for (ended_at, event) in events.iter().enumerate() {
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
                // Its own result landed (a retried write whose first try was stored, a
                // commit in the work's transaction): the lease was not lost, and the
                // caller must get that result.
                // (Unless the record expired since, and a new lifetime began: that result is
                // gone, and a retry gets the new one's.)
                let own_result_stored = events[..ended_at]
                    .iter()
                    .rposition(|event| matches!(event, Event::Finished { process: p, .. } if *p == process))
                    .is_some_and(|stored| !starts.iter().any(|start| (stored..ended_at).contains(start)));
                let unexpected = match answer {
                    Answer::Error {
                        name: "lease lost" | "interrupted: lease lost",
                        ..
                    } if own_result_stored => true,
                    Answer::Error { fine, .. } => !fine,
                    // The completion scenario's work answers `Retryable` when its own
                    // commit is fenced: only after a pause or a partition lost its lease.
                    Answer::Retryable(_) => {
                        !(scenario.may_answer_retryable()
                            || scenario == Scenario::PrepareCompletion
                                && cut_before(events, process, ended_at))
                    }
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

/// `ctx.resumed()` is true exactly after a takeover: a token above the first claim's (or,
/// on the safe side, after a retried claim with such a token: [`claim_retried`]). And
/// every new owner's token is above every earlier owner's.
fn resumed(events: &[Event], plan: &[PlacedFault], verdict: &mut Verdict) {
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
        // What the store said when it granted this token: a takeover or not. A token
        // above 1 alone does not say it (a fresh claim over an absent record continues
        // the old record's tokens); a claim of the same attempt answered again says no
        // more than the grant it repeats.
        if let Event::WorkStarted {
            process,
            token,
            resumed,
        } = event
            && *resumed
                != events.iter().any(|granted| {
                    matches!(granted, Event::Claimed { process: p, token: t, resumed: true, .. }
                        if p == process && t == token)
                })
            && !(*resumed && *token > 1 && claim_retried(events, plan, *process))
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

/// No claim or renewal of a process is granted after that process released the key, and
/// no claim takes the key over for a process whose `execute` had ended, while the record
/// was still that process's: a copy of such a call (delayed, duplicated) must find the
/// lease over (DESIGN.md §2.1 row 7: a late claim of the same attempt takes nothing over;
/// §2.2: only a live lease is renewed). A claim answered with the same lease again,
/// unmoved, is harmless; and once another process was granted the key, the store no
/// longer knows the late claim's attempt (a limit DESIGN.md §2.5 states).
fn late_grants(events: &[Event], starts: &[usize], verdict: &mut Verdict) {
    let mut released = BTreeSet::new();
    let mut ended = BTreeSet::new();
    let mut tokens: BTreeMap<Process, u64> = BTreeMap::new();
    let mut last_owner = None;
    for (at, event) in events.iter().enumerate() {
        if at > 0 && starts.contains(&at) {
            // The record had expired: a late copy of a claim is a new request to the store,
            // which cannot tell them apart (the key is held a lease for nobody).
            (released, ended, last_owner) = (BTreeSet::new(), BTreeSet::new(), None);
            tokens.clear();
        }
        let late = match event {
            Event::Released { process } => {
                released.insert(*process);
                None
            }
            Event::Ended { process, .. } => {
                ended.insert(*process);
                None
            }
            Event::Claimed { process, token, .. } => {
                let before = tokens.insert(*process, *token);
                let still_its = last_owner.replace(*process) == Some(*process);
                if released.contains(process) && still_its {
                    Some((*process, "claim", "its release"))
                } else if ended.contains(process)
                    && still_its
                    && before.is_some_and(|held| *token > held)
                {
                    Some((*process, "claim", "its execute ended"))
                } else {
                    None
                }
            }
            Event::Renewed { process, .. } if released.contains(process) => {
                Some((*process, "renewal", "its release"))
            }
            _ => None,
        };
        if let Some((process, call, after)) = late {
            verdict.broken.push(Broken::LateGrant {
                process,
                call,
                after,
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
    /// The process paused with the effect in flight (done, not yet stored), and its lease
    /// ran out meanwhile: its heartbeats paused with it.
    Paused,
    /// The process was cut off from the store with the effect not yet stored, and its
    /// lease ran out: its checkpoint (or result) could not reach the store.
    Partitioned,
    /// The work's own effect outside any step, had by this process after a pause or a
    /// partition cost it its lease: no lease check guards code outside a step (DESIGN.md
    /// §2.5); only a fencing token downstream refuses it.
    CutOutsideStep(Process),
    /// With `Heartbeat::Off`, the process worked past its lease, which nothing renewed:
    /// another owner was granted the key once it ended, and a step in flight (or the
    /// work's own code) ran again. What `Heartbeat::Off` documents.
    Unrenewed(Process),
}

/// Every effect at most once, unless the contract allows it again (and then it is
/// classified at-least-once); every undo at most once, always.
fn effects(timing: &Timing, events: &[Event], starts: &[usize], verdict: &mut Verdict) {
    let mut by_effect: BTreeMap<&Effect, Vec<(usize, Process)>> = BTreeMap::new();
    for (at, event) in events.iter().enumerate() {
        if let Event::Effect {
            process, effect, ..
        } = event
        {
            by_effect.entry(effect).or_default().push((at, *process));
        }
    }
    for (effect, runs) in by_effect {
        for pair in runs.windows(2) {
            let ((first_at, first), (again_at, again)) = (pair[0], pair[1]);
            let (was, is) = (
                grant_lifetime(events, starts, first, first_at),
                grant_lifetime(events, starts, again, again_at),
            );
            if was != is {
                verdict.at_least_once.push(format!(
                    "{effect} again in {again}, in lifetime {} of the record (it had expired) after {first}'s in lifetime {}",
                    is + 1,
                    was + 1
                ));
                continue;
            }
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
                        Excuse::Crash => "crashed".to_owned(),
                        Excuse::DropMidWork => "was dropped mid-work".to_owned(),
                        Excuse::Paused => "paused with it in flight".to_owned(),
                        Excuse::Partitioned => "was cut off before storing it".to_owned(),
                        Excuse::CutOutsideStep(stale) =>
                            format!("ran: {stale} had been cut off and had it outside any step"),
                        Excuse::Unrenewed(stale) =>
                            format!("ran: {stale} worked past its lease with heartbeats off"),
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
    // The work's own effect outside any step, by a process that lost its lease to a cut
    // and went on, and by the owner granted the key after that cut, in either order.
    if *effect == Effect::Work {
        // The process that had it again worked on past its unrenewed lease, the other
        // having been granted the key after it ended.
        if let Some(stale) = unrenewed(timing, events, (again, again_at), (first, first_at)) {
            return Ok(Excuse::Unrenewed(stale));
        }
        if cut_then_granted(timing, events, (again_at, again), first_at, first) {
            return Ok(Excuse::CutOutsideStep(again));
        }
        if cut_then_granted(timing, events, (first_at, first), again_at, again) {
            return Ok(Excuse::CutOutsideStep(first));
        }
    }
    let stored = events[first_at + 1..again_at]
        .iter()
        .any(|event| match (effect, event) {
            (Effect::Step(name), Event::Checkpointed { process, step }) => {
                *process == first && step == name
            }
            (Effect::Work, Event::Finished { process, .. }) => *process == first,
            _ => false,
        });
    if stored {
        return Err(format!("{first} had stored it before"));
    }
    // The first had it, stored it, and then the other was granted the key: a lost
    // record, whatever the heartbeat. The other way round, see `unrenewed`.
    if *effect == Effect::Work
        && let Some(stale) = unrenewed(timing, events, (first, first_at), (again, again_at))
    {
        return Ok(Excuse::Unrenewed(stale));
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
        // owner, and `first` was granted the key while it still ran, or `again` went on
        // past the end of its lease.
        return Err(started_late(events, again, again_at)
            .or_else(|| started_late(events, first, first_at))
            .unwrap_or_else(|| stale(timing, events, (first_at, first), (claim_at, again))));
    }
    if let Some(why) = granted_while_live(timing, events, first, (claim_at, again)) {
        return Err(why);
    }
    if let Some(why) = started_late(events, first, first_at) {
        return Err(why);
    }
    if let Effect::Step(name) = effect
        && reached(events, first, &format!("after-{name}"), first_at..claim_at)
    {
        // The step returned to the work only once its checkpoint was stored: a driver
        // that let the work go on first (deferring the write) is what repeats it here.
        return Err(format!(
            "{first} had gone past `{name}` (the step returned) before {again} was granted the \
             key, and its checkpoint was never stored"
        ));
    }
    if let Some(excuse) = cut_off(events, (first_at, first), claim_at) {
        return Ok(excuse);
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
        // Nothing renewed its lease, by configuration, and the grant came after it ended.
        None if timing.heartbeat == Heartbeat::Off => Ok(Excuse::Unrenewed(first)),
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

/// True when `process` reached the await point `name` within `range` of the ledger.
fn reached(events: &[Event], process: Process, name: &str, range: std::ops::Range<usize>) -> bool {
    events[range].iter().any(|event| {
        matches!(
            event,
            Event::Reached(point) if point.process == process
                && matches!(&point.site, Site::Point { name: reached, .. } if reached == name)
        )
    })
}

/// The excuse of a process cut off from the store before the grant at `claim_at`: paused
/// after its effect (the effect in flight when everything stopped), or partitioned since
/// it held its lease (its effect's checkpoint or result could not be stored). A pause
/// before the effect excuses nothing: the effect then came after the lease was lost.
fn cut_off(
    events: &[Event],
    (first_at, first): (usize, Process),
    claim_at: usize,
) -> Option<Excuse> {
    let held_from = last_claim(events, first, first_at).unwrap_or(0);
    events[held_from..claim_at]
        .iter()
        .enumerate()
        .find_map(|(offset, event)| match event {
            Event::CutOff { process, paused } if *process == first => {
                let at = held_from + offset;
                match paused {
                    true if at > first_at => Some(Excuse::Paused),
                    true => None,
                    false => Some(Excuse::Partitioned),
                }
            }
            _ => None,
        })
}

/// True when `stale` was cut off (paused, partitioned) after its last grant before its
/// effect at `stale_at`, and `owner` (whose effect is at `owner_at`) was granted the key
/// after that cut, once `stale`'s lease had ended: `stale` came back and had the work's
/// effect outside any step under a lease it had lost.
fn cut_then_granted(
    timing: &Timing,
    events: &[Event],
    (stale_at, stale): (usize, Process),
    owner_at: usize,
    owner: Process,
) -> bool {
    let Some(cut_at) = cut_at(events, stale, stale_at) else {
        return false;
    };
    last_claim(events, owner, owner_at).is_some_and(|granted_at| {
        granted_at > cut_at
            && granted_while_live(timing, events, stale, (granted_at, owner)).is_none()
    })
}

/// Why the effect at `at` of `process` started too late, if it did: at or after the end of
/// its lease as the store last granted or renewed it. The owner must stop by its own
/// clock before that end (a fiftieth of the lease early).
fn started_late(events: &[Event], process: Process, at: usize) -> Option<String> {
    let Event::Effect { at: started, .. } = &events[at] else {
        return None;
    };
    let held_until = held_until(&events[..at], process)?;
    (*started >= held_until).then(|| {
        format!(
            "{process} started it {} ms after its lease had ended: an owner must stop by its \
             own clock",
            started
                .as_unix_millis()
                .saturating_sub(held_until.as_unix_millis())
        )
    })
}

/// True when `process` was cut off (paused or partitioned) after its last grant before
/// `at`, and before `at`.
fn cut_before(events: &[Event], process: Process, at: usize) -> bool {
    cut_at(events, process, at).is_some()
}

/// Where `process` was first cut off (paused or partitioned) after its last grant before
/// `at`, and before `at`.
fn cut_at(events: &[Event], process: Process, at: usize) -> Option<usize> {
    let held_from = last_claim(events, process, at).unwrap_or(0);
    events[held_from..at]
        .iter()
        .position(|event| matches!(event, Event::CutOff { process: p, .. } if *p == process))
        .map(|offset| held_from + offset)
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
    let held_until = held_until(&events[..claim_at], holder);
    let released = events[..claim_at]
        .iter()
        .any(|event| matches!(event, Event::Released { process } if *process == holder));
    if released {
        return None;
    }
    let until = held_until?;
    if until > granted {
        return Some(format!(
            "the store granted {owner} the key while {holder}'s lease was live"
        ));
    }
    // Each time is on its process's clock, as the store saw it. On the run's clock, a grant
    // earlier than the holder's end by more than the driver's margin is one the clocks'
    // skew made: the holder still counted its lease live.
    let margin = timing.lease / 50;
    let (until, granted) = (
        on_run_clock(timing, holder, until),
        on_run_clock(timing, owner, granted),
    );
    (until.as_unix_millis() > granted.as_unix_millis() + millis(margin)).then(|| {
        format!(
            "the store granted {owner} the key {} ms before {holder}'s lease ended on the \
             run's clock: their clocks are {} ms apart, past the driver's margin of {} ms",
            until.as_unix_millis() - granted.as_unix_millis(),
            millis(timing.skew) * 2,
            millis(margin)
        )
    })
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `at`, read on `process`'s clock, on the run's clock: undoes [`Timing::skew`] (the
/// first caller's clock runs behind, every other process's ahead, the check's exact).
fn on_run_clock(timing: &Timing, process: Process, at: Timestamp) -> Timestamp {
    match process {
        Process::First => at.saturating_add(timing.skew),
        Process::Check => at,
        _ => Timestamp::from_unix_millis(at.as_unix_millis().saturating_sub(millis(timing.skew))),
    }
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
/// One result for every caller of a lifetime of the record (`starts`), replayed to the
/// final check. A caller granted the key in a later lifetime ran the work again and agrees
/// with that lifetime's first result; a check granted the key runs it again itself.
fn results(
    scenario: Scenario,
    events: &[Event],
    retries: u32,
    starts: &[usize],
    verdict: &mut Verdict,
) {
    // A process answers for the lifetime of its last grant, or, never granted the key (a
    // replay), for the one its answer came in.
    let lifetime_of =
        |process: Process, ended_at: usize| grant_lifetime(events, starts, process, ended_at);
    let answers: Vec<(Process, &Answer, usize)> = events
        .iter()
        .enumerate()
        .filter_map(|(at, event)| match event {
            Event::Ended {
                process,
                end: End::Returned { answer, .. },
            } => Some((*process, answer, lifetime_of(*process, at))),
            _ => None,
        })
        .collect();
    let with_results: Vec<(Process, &Answer, String, usize)> = answers
        .iter()
        .filter_map(|(process, answer, n)| answer.result().map(|r| (*process, *answer, r, *n)))
        .collect();
    let Some((_, first_answer, first_result, _)) = with_results.first() else {
        verdict.broken.push(Broken::NoResult { retries });
        return;
    };
    let mut firsts: BTreeMap<usize, (Process, &String)> = BTreeMap::new();
    for (process, _, result, n) in &with_results {
        let (first, seen) = *firsts.entry(*n).or_insert((*process, result));
        if result != seen {
            verdict.broken.push(Broken::ResultsDiffer {
                first: (first, seen.clone()),
                other: (*process, result.clone()),
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
    let check = events
        .iter()
        .enumerate()
        .find_map(|(at, event)| match event {
            Event::Ended {
                process: Process::Check,
                end,
            } => Some((at, end)),
            _ => None,
        });
    // The check's claim began a lifetime: the record had expired.
    let renewed_check = events.iter().enumerate().any(|(at, event)| {
        matches!(
            event,
            Event::Claimed {
                process: Process::Check,
                ..
            }
        ) && starts[1..].contains(&at)
    });
    // The result the check must replay: the last lifetime's that has one.
    let (_, (_, last_result)) = firsts.iter().next_back().expect("a result was found above");
    let lost = match check {
        // The check ran the work again, in a lifetime of its own (its result was compared
        // with that lifetime's above).
        Some(_) if renewed_check => None,
        Some((_, End::Returned { answer, .. })) => {
            if answer.result().as_ref() != Some(*last_result) {
                Some(answer.to_string())
            } else if !answer.replayed() {
                Some(format!("{answer}, run again instead of replayed"))
            } else {
                None
            }
        }
        Some((_, other)) => Some(other.to_string()),
        None => Some("no answer: the check never ran".into()),
    };
    if let Some(then) = lost {
        verdict.broken.push(Broken::ResultLost {
            seen: (*last_result).clone(),
            then,
        });
    }
}

/// One list of a compensation: its name, its steps, and how many runs of an undo fit it.
type Listing<'a> = (&'static str, &'a [String], fn(usize) -> bool);

/// In one lifetime of the record (`events`; `last` says it is the last one): every step
/// that registered an undo (its checkpoint stored, or for a step whose value
/// cannot be stored, its effect) is in exactly one of undone, failed, pending,
/// interrupted; undone ones ran once, interrupted ones at most once, pending ones never.
/// The fault-free run ends with the scenario's documented compensation, and the steps the
/// scenario always reports interrupted are, whatever the faults.
fn compensation(
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
fn placed(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::explore::FaultPoint;

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
}
