//! What the consumer did with a delivery, and why.

use std::time::Duration;

use crate::DeadLetterReason;

/// How a delivery was settled, with the answer or the reason.
///
/// ```
/// use idem_consumer::Settled;
///
/// fn log(settled: &Settled<String, String>) {
///     match settled {
///         Settled::Acked { value, replayed } => println!("done: {value} (replayed: {replayed})"),
///         Settled::Retried { delay, cause } => println!("again in {delay:?}: {cause}"),
///         Settled::DeadLettered { reason, cause } => println!("dead letter ({reason}): {cause}"),
///         _ => {}
///     }
/// }
/// # log(&Settled::Acked { value: "ok".into(), replayed: false });
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Settled<T, E> {
    /// The result is stored and the message acknowledged.
    Acked {
        /// The stored result (an earlier delivery's when `replayed`).
        value: T,
        /// True when the work did not run for this delivery: a redelivery of a message
        /// already handled.
        replayed: bool,
    },
    /// Negatively acknowledged: the broker delivers the message again after `delay`.
    Retried {
        /// The delay asked of the broker.
        delay: Duration,
        /// Why.
        cause: Cause<E>,
    },
    /// Sent to the dead-letter path: redelivery can never help.
    DeadLettered {
        /// The code given to the broker.
        reason: DeadLetterReason,
        /// What happened.
        cause: Cause<E>,
    },
}

impl<T, E> Settled<T, E> {
    /// True when the message was acknowledged.
    pub fn is_acked(&self) -> bool {
        matches!(self, Settled::Acked { .. })
    }

    /// True when the work did not run for this delivery and its stored answer was used.
    pub fn replayed(&self) -> bool {
        matches!(self, Settled::Acked { replayed: true, .. })
    }
}

/// Why a delivery was retried or dead-lettered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Cause<E> {
    /// The work's own error: permanent for a dead letter (stored, so every redelivery
    /// gets it again), retryable or of unknown effect for a retry.
    #[error("the work failed")]
    Work(E),
    /// idem could not give the work's answer: another delivery of the message is in
    /// flight, the key was reused for another payload, the store failed...
    #[error(transparent)]
    Idem(#[from] idem_core::Error),
    /// The message has no id and no key function gave one.
    #[error("the message has no id to key it by; set a key function or have publishers set an id")]
    NoKey,
    /// The message's key is not a valid idem key (or the consumer's scope is not, when
    /// the error names the scope).
    #[error("the message's key is not valid: {0}")]
    BadKey(#[source] idem_core::key::KeyError),
    /// The delivery's execution took longer than
    /// [`Consumer::work_timeout`](crate::Consumer::work_timeout) and was stopped; its
    /// lease is kept, so a redelivery takes over once it ends (resuming at its steps).
    #[error("the work took longer than {limit:?} and was stopped")]
    TimedOut {
        /// The limit that was reached.
        limit: std::time::Duration,
    },
    /// An earlier message of the batch in its ordering group was not acked: this one was
    /// nak'd without running, so that it does not overtake that one.
    #[error("an earlier message of its ordering group was not acked; it waits behind it")]
    BehindUnacked,
    /// The work panicked; its lease is kept, so a redelivery takes over once it ends.
    #[error("the work panicked")]
    Panicked,
    /// The driver answered a kind of outcome this version of idem-consumer does not know;
    /// the message was left to the broker.
    #[error("the driver answered an outcome this version does not know; upgrade idem-consumer")]
    Unrecognised,
}
