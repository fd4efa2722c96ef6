//! What the middleware refuses before anything is sent.

/// Why the middleware refused a request. It reaches the caller as
/// `reqwest_middleware::Error::Middleware`; `downcast_ref::<ClientError>()` tells which.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The request could be retried, but its body cannot be sent twice (a stream). Buffer
    /// the body, or send the request with a key-less non-idempotent method through a
    /// client without this middleware.
    #[error(
        "the request's body cannot be sent twice (a stream), so it cannot be retried safely; buffer it first"
    )]
    BodyNotReplayable,
    /// The policy's deadline ended while a try was still waiting for its answer. The
    /// request may have reached the server: retry the operation later with the same key.
    #[error(
        "no answer within the retry deadline after {attempts} tries; the request may have reached the server: retry later with the same key"
    )]
    DeadlineExceeded {
        /// Tries sent, the last included.
        attempts: u32,
    },
    /// A 409 problem document over 64 KiB: no server's in-flight answer, and too large to
    /// read for its type.
    #[error("a 409 answer's problem document is over 64 KiB")]
    ConflictTooLarge,
    /// The key could not be written as a header value.
    #[error("the idempotency key could not be written as a header value")]
    BadHeader,
}
