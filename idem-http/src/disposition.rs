//! What becomes of a handler's response: stored and replayed, or not.

use http::StatusCode;

/// What the layer does with a handler's response.
///
/// The layer's status policy picks one for every response
/// ([`IdempotencyLayer::disposition`](crate::IdempotencyLayer::disposition)); a handler
/// overrides it for one response by putting a `Disposition` in the response's extensions.
///
/// ```
/// use http::{Response, StatusCode};
/// use idem_http::Disposition;
///
/// // The payment provider did not answer: the charge may have happened. Hold the key
/// // until the lease ends, whatever the status says.
/// let mut response = Response::new(());
/// *response.status_mut() = StatusCode::BAD_GATEWAY;
/// response.extensions_mut().insert(Disposition::Hold);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Disposition {
    /// A final answer: stored, and replayed to every retry with the same key.
    Store,
    /// Nothing happened: nothing is stored and the key is released at once; a retry runs
    /// the handler again.
    Release,
    /// The outcome is unknown (the effect may have happened): nothing is stored and the
    /// key stays held until the lease ends; then a retry takes over and runs the handler
    /// again (resuming through its steps, see [`idem_core::Context::step`]).
    Hold,
}

/// The default status policy, which never releases a key whose effect may have happened:
///
/// | status | disposition |
/// |---|---|
/// | 1xx, 2xx, 3xx, 4xx | [`Disposition::Store`]: a final answer |
/// | 408 Request Timeout, 425 Too Early, 429 Too Many Requests | [`Disposition::Release`]: the request was not processed |
/// | 5xx | [`Disposition::Hold`]: the handler failed, possibly after its effect |
///
/// ```
/// use http::StatusCode;
/// use idem_http::{default_disposition, Disposition};
///
/// assert_eq!(default_disposition(StatusCode::CREATED), Disposition::Store);
/// assert_eq!(default_disposition(StatusCode::PAYMENT_REQUIRED), Disposition::Store);
/// assert_eq!(default_disposition(StatusCode::TOO_MANY_REQUESTS), Disposition::Release);
/// assert_eq!(default_disposition(StatusCode::INTERNAL_SERVER_ERROR), Disposition::Hold);
/// ```
pub fn default_disposition(status: StatusCode) -> Disposition {
    match status {
        StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_EARLY | StatusCode::TOO_MANY_REQUESTS => {
            Disposition::Release
        }
        status if status.is_server_error() => Disposition::Hold,
        _ => Disposition::Store,
    }
}
