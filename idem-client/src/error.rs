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
    /// The key could not be written as a header value.
    #[error("the idempotency key could not be written as a header value")]
    BadHeader,
}
