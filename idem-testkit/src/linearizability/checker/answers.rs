//! Whether the state machine gives the answer the store gave: an operation applied to a
//! state at a moment, and the store's leases and records compared with the machine's
//! within a millisecond.

use std::time::Duration;

use idem_core::{
    Record, Timestamp, machine, raw::clamp_duration, record::Lease, store::ClaimOutcome,
    store::RenewOutcome,
};

use super::{State, TOLERANCE};
use crate::linearizability::history::{Answer, Call, Operation};

/// The state after `operation` at `now` on `record`, when the machine gives the answer
/// the store gave (any answer, for a lost one); `None` when it does not.
pub(super) fn apply(operation: &Operation, record: &State, now: Timestamp) -> Option<State> {
    let existing = record.as_ref();
    let lost = operation.is_lost();
    let unchanged = || record.clone();
    macro_rules! write {
        ($transition:expr, $matches:expr) => {{
            let transition = $transition;
            if lost || $matches(&transition.outcome) {
                Some(transition.write.or_else(unchanged))
            } else {
                None
            }
        }};
    }
    match (&operation.call, &operation.answer) {
        (Call::Claim(request), Answer::Claim(actual)) => {
            // A refusal (a token at its limit) answers an error, not a claim's outcome.
            let transition = machine::claim(existing, request, now).ok()?;
            if !same_claim(actual, &transition.outcome) {
                return None;
            }
            let mut write = transition.write;
            if let (
                Some(record),
                ClaimOutcome::Claimed { lease, .. },
                ClaimOutcome::Claimed { resumed, .. },
            ) = (&mut write, actual, &transition.outcome)
            {
                // The store's times, which may be a millisecond off the machine's at the
                // moment tried (see `same_lease`).
                record.lease_until = lease.lease_until;
                if *resumed {
                    let before = existing.map_or(record.expires_at, |r| r.expires_at);
                    record.expires_at =
                        machine::kept_past(before, lease.lease_until, request.retention);
                } else {
                    record.created_at = lease.created_at;
                    record.expires_at = lease
                        .created_at
                        .saturating_add(clamp_duration(request.retention));
                }
            }
            Some(write.or_else(unchanged))
        }
        (Call::Renew(lease, extend), Answer::Renew(actual)) => {
            let transition = machine::renew(existing, lease, *extend, now);
            let same = match (actual, &transition.outcome) {
                (RenewOutcome::Renewed(a), RenewOutcome::Renewed(m)) => same_lease(a, m),
                (a, m) => a == m,
            };
            if !same {
                return None;
            }
            let mut write = transition.write;
            if let (Some(record), RenewOutcome::Renewed(renewed), Some(before)) =
                (&mut write, actual, existing)
            {
                record.lease_until = renewed.lease_until;
                record.expires_at =
                    machine::kept_past(before.expires_at, renewed.lease_until, lease.retention);
            }
            Some(write.or_else(unchanged))
        }
        (Call::Claim(request), answer) => match machine::claim(existing, request, now) {
            Ok(transition) => write!(
                transition,
                |model: &ClaimOutcome| matches!(answer, Answer::Claim(actual) if same_claim(actual, model))
            ),
            // Refused: nothing written, whatever the store answered.
            Err(_) => Some(unchanged()),
        },
        (Call::Complete(lease, bytes), answer) => write!(
            machine::complete(existing, lease, bytes, now),
            |model: &_| matches!(answer, Answer::Write(actual) if actual == model)
        ),
        (Call::Fail(lease, bytes), answer) => write!(
            machine::fail(existing, lease, bytes, now),
            |model: &_| matches!(answer, Answer::Write(actual) if actual == model)
        ),
        (Call::Release(lease), answer) => write!(
            machine::release(existing, lease, now),
            |model: &_| matches!(answer, Answer::Write(actual) if actual == model)
        ),
        (Call::Checkpoint(lease, step, bytes), answer) => write!(
            machine::checkpoint(existing, lease, step, bytes, now),
            |model: &_| matches!(answer, Answer::Write(actual) if actual == model)
        ),
        (Call::Renew(lease, extend), answer) => write!(
            machine::renew(existing, lease, *extend, now),
            |model: &_| matches!(answer, Answer::Renew(actual) if actual == model)
        ),
        (Call::Get(_), Answer::Get(actual)) => {
            same_get(actual.as_ref(), machine::visible(existing, now)).then(unchanged)
        }
        (Call::Get(_), _) => lost.then(unchanged),
    }
}

fn same_claim(actual: &ClaimOutcome, model: &ClaimOutcome) -> bool {
    match (actual, model) {
        (
            ClaimOutcome::Claimed {
                lease: a,
                resumed: a_resumed,
                steps: a_steps,
                ..
            },
            ClaimOutcome::Claimed {
                lease: m,
                resumed: m_resumed,
                steps: m_steps,
                ..
            },
        ) => same_lease(a, m) && a_resumed == m_resumed && a_steps == m_steps,
        (
            ClaimOutcome::InFlight {
                retry_after: actual,
                ..
            },
            ClaimOutcome::InFlight {
                retry_after: model, ..
            },
        ) => actual.abs_diff(*model) <= Duration::from_millis(TOLERANCE),
        _ => actual == model,
    }
}

/// A lease the store answered against the machine's: the same but for its times, which
/// may be a millisecond apart. A store that keeps finer times (PostgreSQL keeps
/// microseconds) finds a lease live at `lease_until.123` that the machine, on whole
/// milliseconds, finds ended at `lease_until`: its answer then matches the machine's a
/// millisecond earlier, with times a millisecond later.
fn same_lease(actual: &Lease, model: &Lease) -> bool {
    actual.key == model.key
        && actual.token == model.token
        && actual.attempt == model.attempt
        && actual.retention == model.retention
        && near(actual.lease_until, model.lease_until)
        && near(actual.created_at, model.created_at)
}

/// Two times a millisecond apart at most: a store that keeps finer times than the
/// machine's whole milliseconds rounds the other way.
fn near(a: Timestamp, m: Timestamp) -> bool {
    a.as_unix_millis().abs_diff(m.as_unix_millis()) <= 1
}

/// A record `get` returned against the machine's: the same, with the lease's end and the
/// expiry within a millisecond ([`near`]).
fn same_get(actual: Option<&Record>, model: Option<&Record>) -> bool {
    match (actual, model) {
        (None, None) => true,
        (Some(a), Some(m)) => {
            // The lease's end and the expiry too, within the millisecond a lease may be
            // off by (see `same_lease`): a read pins the moment of the write that set
            // them, at once, where a later answer at the expiry's edge would show a
            // wrong moment only after every order of the calls between.
            a.key == m.key
                && a.fingerprint == m.fingerprint
                && a.state == m.state
                && a.token == m.token
                && a.attempt == m.attempt
                && a.created_at == m.created_at
                && near(a.lease_until, m.lease_until)
                && near(a.expires_at, m.expires_at)
                && a.response == m.response
                && a.steps == m.steps
        }
        _ => false,
    }
}
