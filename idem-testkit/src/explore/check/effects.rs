//! The check that every effect happens at most once, unless the contract allows it again
//! (a crash, a drop mid-work, a pause or a partition, heartbeats off), and then says why.

use std::collections::BTreeMap;

use idem_core::{Heartbeat, store::Operation};

use super::Verdict;
use super::leases::{cut_at, granted_while_live, last_claim};
use super::lifetimes::grant_lifetime;
use crate::explore::Timing;
use crate::explore::faults::{Process, Site};
use crate::explore::ledger::{Effect, End, Event, held_until};
use crate::explore::report::Broken;

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
pub(super) fn effects(timing: &Timing, events: &[Event], starts: &[usize], verdict: &mut Verdict) {
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
