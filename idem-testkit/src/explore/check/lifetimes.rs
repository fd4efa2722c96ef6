//! The lifetimes of the record in a run's ledger: where each begins (a fresh grant once
//! the record before had expired), and which one a process acted in.

use std::collections::BTreeMap;

use super::leases::millis;
use crate::explore::Timing;
use crate::explore::faults::Process;
use crate::explore::ledger::Event;

/// Where each lifetime of the record starts in the ledger: at the run's start, then at
/// every fresh grant (`resumed: false`) made once the record before had expired. A
/// record's expiry only grows, to one retention past the latest of: its fresh claim, the
/// end of every lease a takeover granted or a renewal or checkpoint wrote under, and every
/// result stored (by the clocks the store read: the granting and writing process's). A
/// fresh grant sooner is no new lifetime (the store lost a record it had to keep), and the
/// checks report what that caused. A record released without a step also ends at once;
/// that grant stays in the same lifetime, as it always was.
pub(super) fn lifetimes(timing: &Timing, events: &[Event]) -> Vec<usize> {
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

/// The lifetime of the record `process` acted in at `at`: the one of the grant its work
/// runs under (the token its last `WorkStarted` before `at` names: a late copy of a claim
/// of its own moves nothing), else of its last grant before, or, never granted the key,
/// the one `at` falls in.
pub(super) fn grant_lifetime(
    events: &[Event],
    starts: &[usize],
    process: Process,
    at: usize,
) -> usize {
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
