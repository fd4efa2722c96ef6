//! What the middleware refuses before anything is sent, and what a keyed request that got
//! no answer comes back as.

use std::time::Duration;

use crate::key::IdempotencyKey;

/// Why the middleware refused a request, or gave up on one. It reaches the caller as
/// `reqwest_middleware::Error::Middleware`; `downcast_ref::<ClientError>()` tells which,
/// and [`key_of`] finds the operation's key in any error.
///
/// ```
/// use idem_client::{ClientError, IdempotencyKey};
///
/// let key = IdempotencyKey::new("order-1187")?;
/// let err = ClientError::DeadlineExceeded { attempts: 3, key: Some(key.clone()) };
/// assert_eq!(err.key(), Some(&key));
/// // The message says what to do, and never holds the key.
/// assert!(err.to_string().contains("retry it later with the same idempotency key"));
/// assert!(!err.to_string().contains("order-1187"));
/// # Ok::<(), idem_client::KeyError>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The request could be retried, but its body cannot be sent twice (a stream) and the
    /// middleware was told not to buffer it
    /// ([`IdempotencyMiddleware::buffer_streams`](crate::IdempotencyMiddleware::buffer_streams)
    /// with 0). Nothing was sent.
    #[error(
        "the request's body cannot be sent twice (a stream), so it cannot be retried safely; buffer it first"
    )]
    BodyNotReplayable,
    /// The request's stream body is longer than the middleware buffers to send it again
    /// on a retry. Nothing was sent: raise the limit, or send a body that can be cloned.
    #[error(
        "the request's stream body is over the {limit} bytes buffered to retry it; nothing was sent: raise `buffer_streams` or send a buffered body"
    )]
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// Reading the request's stream body failed before anything was sent.
    #[error("the request's stream body failed while it was buffered; nothing was sent")]
    BodyFailed(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The policy's deadline ended while a try was still waiting for its answer. The
    /// request may have reached the server: retry the operation later with the same key.
    #[error(
        "no answer within the retry deadline (tries sent: {attempts}); the request may have reached the server: retry it later with the same idempotency key, or check whether it ran"
    )]
    DeadlineExceeded {
        /// Tries sent, the last included.
        attempts: u32,
        /// The operation's key (the caller's or the automatic one); `None` for a request
        /// retried for its method alone.
        key: Option<IdempotencyKey>,
    },
    /// One try got no answer within the policy's
    /// [`attempt_timeout`](crate::RetryPolicy::attempt_timeout). It is the last error
    /// of an [`ClientError::Unanswered`] when no try was left.
    #[error(
        "a try got no answer within {after:?}; the request may have reached the server: retry it with the same idempotency key, or raise the policy's attempt_timeout"
    )]
    AttemptTimedOut {
        /// The per-try timeout.
        after: Duration,
    },
    /// A keyed operation ended without an answer: its last try failed (a cut connection,
    /// a timeout) and no try was left, or its error was one no retry mends. The request
    /// may have reached the server: retry later with this key, and the server answers the
    /// first result. The last try's error is the source.
    #[error(
        "no answer (tries sent: {attempts}); the request may have reached the server: retry later with the same idempotency key (ClientError::key), in the same header form"
    )]
    Unanswered {
        /// Tries sent, the last included.
        attempts: u32,
        /// The operation's key, to send again.
        key: IdempotencyKey,
        /// The last try's error.
        #[source]
        last: Box<reqwest_middleware::Error>,
    },
    /// The key could not be written as a header value.
    #[error("the idempotency key could not be written as a header value")]
    BadHeader,
    /// The key cannot go as a bare header value
    /// ([`HeaderForm::Bare`](crate::HeaderForm::Bare)): only letters, digits and
    /// ``!#$%&'*+-.^_`|~:/`` can. Nothing was sent.
    #[error(
        "the idempotency key holds a character a bare header value cannot (only letters, digits and !#$%&'*+-.^_`|~:/); use the quoted form"
    )]
    KeyNotAToken,
}

impl ClientError {
    /// The operation's key, where the error carries one.
    ///
    /// ```
    /// use idem_client::ClientError;
    ///
    /// assert!(ClientError::BodyNotReplayable.key().is_none());
    /// ```
    pub fn key(&self) -> Option<&IdempotencyKey> {
        match self {
            Self::DeadlineExceeded { key, .. } => key.as_ref(),
            Self::Unanswered { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// The key of the operation an error of the middleware's `send` ended, where it had one:
/// to retry later with the same key when the key was made automatically. Send it in the
/// same [`HeaderForm`](crate::HeaderForm) it first went in.
///
/// ```
/// use idem_client::key_of;
///
/// let err = reqwest_middleware::Error::middleware(std::io::Error::other("not ours"));
/// assert!(key_of(&err).is_none());
/// ```
pub fn key_of(err: &reqwest_middleware::Error) -> Option<&IdempotencyKey> {
    match err {
        reqwest_middleware::Error::Middleware(err) => err.downcast_ref::<ClientError>()?.key(),
        reqwest_middleware::Error::Reqwest(_) => None,
    }
}
