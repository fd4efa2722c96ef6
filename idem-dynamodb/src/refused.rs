//! What a conditional write whose condition failed answers, from the item as it was.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::AttributeValue;
use idem_core::{
    Record, State, StoreError, Timestamp, machine, record::Lease, store::Operation,
    store::WriteOutcome,
};

use crate::errors::map;

/// What a complete or fail whose condition failed answers, from the item as it was.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The same owner's earlier try stored this result: applied, nothing written again.
    Landed,
    /// Another owner, another terminal state, or no record: fenced.
    Fenced,
    /// The fence holds: only the expiry the write assumed was wrong (it moved, or the
    /// other write is the right one). Write again, choosing from the item's.
    Again {
        /// The item's expiry.
        expires_at: Timestamp,
    },
}

/// The state machine's answer for `seen` (none: no item), with leases lasting the skew
/// margin longer, as the fence's condition counts them.
pub(crate) fn refused_finish(
    seen: Option<Record>,
    lease: &Lease,
    terminal: State,
    now: Timestamp,
    skew_margin: Duration,
) -> Refused {
    let Some(mut seen) = seen else {
        return Refused::Fenced;
    };
    seen.lease_until = seen.lease_until.saturating_add(skew_margin);
    let answer = match terminal {
        State::Failed => machine::fail(Some(&seen), lease, b"", now),
        _ => machine::complete(Some(&seen), lease, b"", now),
    };
    match (answer.outcome, answer.write) {
        (WriteOutcome::Applied, None) => Refused::Landed,
        (WriteOutcome::Applied, Some(_)) => Refused::Again {
            expires_at: seen.expires_at,
        },
        _ => Refused::Fenced,
    }
}

/// The conditional-check failure's old item, if this error is one; `Err` otherwise.
pub(crate) type ConditionFailure = Option<HashMap<String, AttributeValue>>;

pub(crate) type UpdateError = aws_sdk_dynamodb::error::SdkError<
    UpdateItemError,
    aws_sdk_dynamodb::config::http::HttpResponse,
>;

pub(crate) fn condition_failed(
    err: UpdateError,
    operation: Operation,
) -> Result<ConditionFailure, StoreError> {
    match err.as_service_error() {
        Some(UpdateItemError::ConditionalCheckFailedException(failure)) => {
            Ok(failure.item().cloned())
        }
        _ => Err(map(operation, err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{Fingerprint, Key, record::AttemptId, store::ClaimRequest};

    const T0: Timestamp = Timestamp::from_unix_millis(1_000_000);

    /// A record claimed at `T0` with a lease of a minute and a retention of an hour.
    fn claimed() -> (Record, Lease) {
        let request = ClaimRequest::new(
            Key::new("s", "k").unwrap(),
            Fingerprint::of_bytes("x"),
            Duration::from_secs(60),
            Duration::from_secs(3600),
        );
        let record = machine::claim(None, &request, T0)
            .expect("a first claim is never refused")
            .write
            .expect("a fresh claim");
        let lease = machine::lease_of(&record, Duration::from_secs(3600));
        (record, lease)
    }

    fn at(seconds: u64) -> Timestamp {
        T0.saturating_add(Duration::from_secs(seconds))
    }

    #[test]
    fn no_item_read_back_is_fenced() {
        let (_, lease) = claimed();
        assert_eq!(
            refused_finish(None, &lease, State::Completed, T0, Duration::ZERO),
            Refused::Fenced
        );
    }

    #[test]
    fn the_owners_stored_result_is_landed_while_present() {
        let (record, lease) = claimed();
        for terminal in [State::Completed, State::Failed] {
            let stored = match terminal {
                State::Failed => machine::fail(Some(&record), &lease, b"r", T0),
                _ => machine::complete(Some(&record), &lease, b"r", T0),
            }
            .write
            .unwrap();
            let refused =
                |now| refused_finish(Some(stored.clone()), &lease, terminal, now, Duration::ZERO);
            assert_eq!(refused(at(10)), Refused::Landed, "{terminal:?}");
            assert_eq!(refused(at(3600)), Refused::Fenced, "{terminal:?}: expired");
            let other = if terminal == State::Failed {
                State::Completed
            } else {
                State::Failed
            };
            assert_eq!(
                refused_finish(Some(stored.clone()), &lease, other, at(10), Duration::ZERO),
                Refused::Fenced,
                "{terminal:?} is not {other:?}"
            );
        }
    }

    #[test]
    fn another_owner_is_fenced() {
        let (record, mut lease) = claimed();
        lease.attempt = AttemptId::random();
        assert_eq!(
            refused_finish(
                Some(record.clone()),
                &lease,
                State::Completed,
                at(10),
                Duration::ZERO
            ),
            Refused::Fenced
        );
        let (_, mut lease) = claimed();
        lease.token += 1;
        assert_eq!(
            refused_finish(
                Some(record),
                &lease,
                State::Completed,
                at(10),
                Duration::ZERO
            ),
            Refused::Fenced
        );
    }

    #[test]
    fn a_fence_that_holds_is_written_again_from_the_items_expiry() {
        let (record, lease) = claimed();
        assert_eq!(
            refused_finish(
                Some(record.clone()),
                &lease,
                State::Completed,
                at(10),
                Duration::ZERO
            ),
            Refused::Again {
                expires_at: record.expires_at
            }
        );
    }

    #[test]
    fn a_lease_live_within_the_skew_margin_still_holds_the_fence() {
        let (mut record, lease) = claimed();
        record.expires_at = at(30); // retention over, lease until 60 s
        let refused = |margin| {
            refused_finish(
                Some(record.clone()),
                &lease,
                State::Completed,
                at(61),
                margin,
            )
        };
        assert_eq!(refused(Duration::ZERO), Refused::Fenced);
        assert_eq!(
            refused(Duration::from_secs(2)),
            Refused::Again {
                expires_at: record.expires_at
            }
        );
    }
}
