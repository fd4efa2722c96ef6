//! Requests to a store and the expected outcomes it answers with.
//!
//! Everything here is a value, not an error: a replay, an in-flight duplicate, a mismatched
//! fingerprint and a fenced write are normal answers that callers branch on.

use std::fmt;
use std::time::Duration;

use crate::{Fingerprint, Key, record::AttemptId, record::Lease, record::Steps};

/// A request to claim a key (see [`Store::claim`](crate::Store::claim)).
///
/// ```
/// use idem_core::{store::ClaimRequest, Fingerprint, Key};
/// use std::time::Duration;
///
/// let request = ClaimRequest::new(
///     Key::new("acct_42/payments.create", "order-1187")?,
///     Fingerprint::of_bytes(b"amount=500&currency=EUR"),
///     Duration::from_secs(30),
///     Duration::from_secs(24 * 3600),
/// );
/// assert_eq!(request.lease, Duration::from_secs(30));
/// # Ok::<(), idem_core::key::KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub struct ClaimRequest {
    /// The key to claim.
    pub key: Key,
    /// The fingerprint of this request.
    pub fingerprint: Fingerprint,
    /// Identifies this attempt; send the same request again to retry an ambiguous claim.
    pub attempt: AttemptId,
    /// How long the lease lasts from the store's `now`. Longer than
    /// [`MAX_DURATION`](crate::raw::MAX_DURATION) counts as that.
    pub lease: Duration,
    /// How long a new record is kept from its creation. Longer than
    /// [`MAX_DURATION`](crate::raw::MAX_DURATION) counts as that.
    pub retention: Duration,
}

impl ClaimRequest {
    /// A request with a fresh random [`AttemptId`].
    pub fn new(key: Key, fingerprint: Fingerprint, lease: Duration, retention: Duration) -> Self {
        Self {
            key,
            fingerprint,
            attempt: AttemptId::random(),
            lease,
            retention,
        }
    }

    /// The same request with the given attempt id.
    #[must_use]
    pub fn with_attempt(mut self, attempt: AttemptId) -> Self {
        self.attempt = attempt;
        self
    }
}

/// What a claim found and did.
///
/// Stores build outcomes with the constructors ([`ClaimOutcome::claimed`] and friends), so
/// that a field added later breaks no store; callers match on the variants.
///
/// ```
/// use idem_core::store::ClaimOutcome;
///
/// let outcome = ClaimOutcome::replay(b"receipt".to_vec());
/// match outcome {
///     ClaimOutcome::Replay { response, .. } => assert_eq!(response, b"receipt"),
///     _ => unreachable!(),
/// }
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// The caller now owns the key and must do the work.
    #[non_exhaustive]
    Claimed {
        /// The lease to fence every later write with.
        lease: Lease,
        /// True when this claim took over an in-progress record from an attempt whose
        /// lease had expired: a previous owner may have done part of the work.
        resumed: bool,
        /// Checkpoints left by previous owners (empty on a fresh record).
        steps: Steps,
    },
    /// The work completed before; here is its response, byte for byte.
    #[non_exhaustive]
    Replay {
        /// The stored response.
        response: Vec<u8>,
    },
    /// The work failed permanently before; here is the stored failure, byte for byte.
    #[non_exhaustive]
    ReplayFailure {
        /// The stored failure.
        response: Vec<u8>,
    },
    /// Another attempt holds a live lease; try again after `retry_after`.
    #[non_exhaustive]
    InFlight {
        /// Time left on the other attempt's lease.
        retry_after: Duration,
    },
    /// The key exists for a request with a different fingerprint: the client reused a key.
    Mismatch,
}

impl ClaimOutcome {
    /// [`ClaimOutcome::Claimed`].
    pub fn claimed(lease: Lease, resumed: bool, steps: Steps) -> Self {
        ClaimOutcome::Claimed {
            lease,
            resumed,
            steps,
        }
    }

    /// [`ClaimOutcome::Replay`].
    pub fn replay(response: Vec<u8>) -> Self {
        ClaimOutcome::Replay { response }
    }

    /// [`ClaimOutcome::ReplayFailure`].
    pub fn replay_failure(response: Vec<u8>) -> Self {
        ClaimOutcome::ReplayFailure { response }
    }

    /// [`ClaimOutcome::InFlight`].
    pub fn in_flight(retry_after: Duration) -> Self {
        ClaimOutcome::InFlight { retry_after }
    }
}

impl fmt::Debug for ClaimOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimOutcome::Claimed {
                lease,
                resumed,
                steps,
            } => f
                .debug_struct("Claimed")
                .field("lease", lease)
                .field("resumed", resumed)
                .field("steps", &steps.keys().collect::<Vec<_>>())
                .finish(),
            ClaimOutcome::Replay { response } => f
                .debug_struct("Replay")
                .field("response_len", &response.len())
                .finish(),
            ClaimOutcome::ReplayFailure { response } => f
                .debug_struct("ReplayFailure")
                .field("response_len", &response.len())
                .finish(),
            ClaimOutcome::InFlight { retry_after } => f
                .debug_struct("InFlight")
                .field("retry_after", retry_after)
                .finish(),
            ClaimOutcome::Mismatch => f.write_str("Mismatch"),
        }
    }
}

/// The answer to a fenced write (`complete`, `fail`, `release`, `checkpoint`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[must_use = "a fenced write means the lease was lost; the caller must not report success"]
pub enum WriteOutcome {
    /// The write applied (or had already applied, for a retried `complete` or `fail`).
    Applied,
    /// The record has moved on (another owner took over, or it finished or expired):
    /// nothing changed.
    Fenced,
}

/// The answer to [`Store::renew`](crate::Store::renew).
#[derive(Clone, PartialEq, Eq, Debug)]
#[must_use = "a fenced renewal means the lease was lost; the work must stop"]
pub enum RenewOutcome {
    /// The lease now ends at the returned lease's `lease_until`.
    Renewed(Lease),
    /// The record has moved on: nothing changed and the lease is lost.
    Fenced,
}
