//! The checks of the store's grants: `resumed` exactly after a takeover, tokens that grow,
//! renewals that extend the lease, and no late claim or renewal granted for nobody.

use std::collections::{BTreeMap, BTreeSet};

use idem_core::store::Operation;

use super::Verdict;
use crate::explore::faults::{PlacedFault, Process, Site};
use crate::explore::ledger::Event;
use crate::explore::report::Broken;

/// `ctx.resumed()` is true exactly after a takeover: a token above the first claim's (or,
/// on the safe side, after a retried claim with such a token: [`claim_retried`]). And
/// every new owner's token is above every earlier owner's.
pub(super) fn resumed(events: &[Event], plan: &[PlacedFault], verdict: &mut Verdict) {
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

/// Every renewal the store granted extends the lease it was asked to renew: a store
/// that answers Renewed and keeps the old end lets the lease run out under heartbeats.
pub(super) fn renewals(events: &[Event], verdict: &mut Verdict) {
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
pub(super) fn late_grants(events: &[Event], starts: &[usize], verdict: &mut Verdict) {
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
