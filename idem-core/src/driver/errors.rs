//! What the work reports, and what `execute` answers when it does not return a value.

use std::time::Duration;

use crate::{KeyError, StoreError};

/// How the protected work failed; the kind decides what is stored.
///
/// ```
/// use idem_core::WorkError;
///
/// #[derive(Debug, serde::Serialize, serde::Deserialize)]
/// enum PaymentError { CardDeclined, ProviderDown, ProviderTimedOut }
///
/// fn classify(err: PaymentError) -> WorkError<PaymentError> {
///     match err {
///         // Replayed to every retry: the card will still be declined.
///         PaymentError::CardDeclined => WorkError::Permanent(err),
///         // Nothing happened: let the next retry run the work again.
///         PaymentError::ProviderDown => WorkError::Retryable(err),
///         // The charge may have gone through: hold the key until the lease ends.
///         PaymentError::ProviderTimedOut => WorkError::Unknown(err),
///     }
/// }
/// # let _ = classify(PaymentError::CardDeclined);
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum WorkError<E> {
    /// The operation failed for good: the error is stored and every retry gets it back.
    Permanent(E),
    /// Nothing took effect: the lease is released and nothing is stored, so the next retry
    /// runs the work again at once.
    Retryable(E),
    /// The work may or may not have taken effect (a downstream call timed out). The lease is
    /// kept until it expires: duplicates see in-flight until then, and a later retry takes
    /// over (resuming through its checkpointed steps).
    Unknown(E),
    /// The driver stopped the work: raised by [`Context::step`](crate::Context::step), never
    /// built by hand. Propagate it with `?`; the lease is kept, nothing is stored.
    Interrupted(Interrupted),
}

impl<E> From<Interrupted> for WorkError<E> {
    fn from(interrupted: Interrupted) -> Self {
        WorkError::Interrupted(interrupted)
    }
}

/// Why the driver interrupted the work (see [`WorkError::Interrupted`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Interrupted {
    /// Another attempt took the key over; this run's writes no longer count.
    #[error("the lease was lost to another attempt")]
    LeaseLost,
    /// A step name broke the naming rules.
    #[error("invalid step name")]
    InvalidStepName(#[source] KeyError),
    /// Writing a checkpoint failed in the store.
    #[error("the checkpoint could not be written")]
    Store(#[source] StoreError),
    /// A step's value could not be serialised, or a stored one read back as its type.
    #[error("a step value could not be encoded or decoded")]
    Codec(#[source] serde_json::Error),
}

/// Why a duplicate-free answer could not be given, or the stored failure.
///
/// Expected answers (a duplicate in flight, a reused key, a lost lease) are variants too,
/// so a caller can map each to its protocol (HTTP 409, 422, 503 ...).
/// [`Error::is_retryable`] says whether the caller's retry can help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error<E> {
    /// The work failed permanently, now or on an earlier attempt whose failure is replayed.
    #[error("the operation failed permanently{}", replay_note(*replayed))]
    Failed {
        /// The stored failure.
        error: E,
        /// True when this failure is a replay of an earlier attempt's.
        replayed: bool,
    },
    /// The work reported a retryable failure; nothing was stored and the key is free again.
    #[error("the operation failed and may be retried now")]
    Retryable(E),
    /// The work reported an unknown outcome; the key stays held until its lease ends.
    #[error("the operation's outcome is unknown; retry after the lease ends to resume it")]
    OutcomeUnknown(E),
    /// Another attempt holds the key; retry after `retry_after`.
    #[error("a request with this key is in flight; retry in {retry_after:?}")]
    InFlight {
        /// How long the other attempt's lease still runs.
        retry_after: Duration,
    },
    /// The key was used before for a request with a different fingerprint.
    #[error("this idempotency key was already used for a different request; use a new key")]
    Mismatch,
    /// Another attempt took over while the work ran, so its result was not stored; the
    /// other attempt's result is what retries get.
    #[error("the lease was lost to another attempt; retry to get that attempt's result")]
    LeaseLost,
    /// The result was larger than the size cap. The work ran once; this failure is stored
    /// so retries get it back instead of running the work again.
    #[error("the result is {size} bytes, over the {limit} byte cap{}; raise the cap or return less", replay_note(*replayed))]
    ResultTooLarge {
        /// The serialised result's size.
        size: usize,
        /// The cap in force.
        limit: usize,
        /// True when this is a replay of an earlier attempt's failure.
        replayed: bool,
    },
    /// The result (or the permanent error) could not be serialised. The work ran once; this
    /// failure is stored so retries get it back instead of running the work again.
    #[error("the result could not be serialised{}", replay_note(*replayed))]
    Unserializable {
        /// The serialiser's error (absent on a replay).
        #[source]
        source: Option<serde_json::Error>,
        /// True when this is a replay of an earlier attempt's failure.
        replayed: bool,
    },
    /// A stored result could not be read back as the expected type (the type changed since
    /// it was stored?). Not retryable.
    #[error("a stored result could not be decoded as the expected type")]
    Decode(#[source] serde_json::Error),
    /// The driver interrupted the work (an invalid step name, or a step value that could
    /// not be encoded or decoded). The lease is kept until it expires.
    #[error("the work was interrupted")]
    Interrupted(#[source] Interrupted),
    /// The store failed. The work did not run if the claim failed; if storing the result
    /// failed after the work ran, the key stays held until its lease ends.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn replay_note(replayed: bool) -> &'static str {
    if replayed { " (replayed)" } else { "" }
}

impl<E> Error<E> {
    /// Whether the caller retrying the same request (same key) can get a better answer.
    ///
    /// ```
    /// use idem_core::Error;
    /// use std::time::Duration;
    ///
    /// let in_flight: Error<()> = Error::InFlight { retry_after: Duration::from_secs(1) };
    /// assert!(in_flight.is_retryable());
    /// assert!(!Error::<()>::Mismatch.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Retryable(_)
            | Error::OutcomeUnknown(_)
            | Error::InFlight { .. }
            | Error::LeaseLost => true,
            Error::Store(err) => err.is_retryable(),
            Error::Failed { .. }
            | Error::Mismatch
            | Error::ResultTooLarge { .. }
            | Error::Unserializable { .. }
            | Error::Decode(_)
            | Error::Interrupted(_) => false,
        }
    }

    /// When this answer is a replay of an earlier attempt's stored failure.
    pub fn is_replay(&self) -> bool {
        matches!(
            self,
            Error::Failed { replayed: true, .. }
                | Error::ResultTooLarge { replayed: true, .. }
                | Error::Unserializable { replayed: true, .. }
        )
    }
}

/// A driver setting that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The lease was zero: every duplicate could take over at once.
    #[error("the lease must be longer than zero")]
    ZeroLease,
    /// The retention was shorter than the lease, so a record could expire under its owner.
    #[error("the retention ({retention:?}) must be at least the lease ({lease:?})")]
    RetentionShorterThanLease {
        /// The retention asked for.
        retention: Duration,
        /// The lease asked for.
        lease: Duration,
    },
    /// The response cap was zero.
    #[error("the response size cap must be at least one byte")]
    ZeroResponseCap,
    /// A heartbeat interval of zero, or not shorter than the lease, cannot keep it alive.
    #[error(
        "the heartbeat interval ({every:?}) must be above zero and shorter than the lease ({lease:?})"
    )]
    HeartbeatNotShorterThanLease {
        /// The interval asked for.
        every: Duration,
        /// The lease asked for.
        lease: Duration,
    },
}
