//! What becomes of a handler's response: stored and replayed, or not.

use http::StatusCode;

/// What the layer does with a handler's response.
///
/// The layer's status policy picks one for every response
/// ([`IdempotencyLayer::disposition`](crate::IdempotencyLayer::disposition)); a handler
/// overrides it for one response by putting a `Disposition` in the response's extensions.
///
/// The key is decided when the handler's body ends: a response streamed to the client
/// keeps its key in progress until its last frame, whichever disposition it carries (a
/// retry meanwhile is told the request is in flight), unless it is stored and grows past
/// [`max_response_body`](crate::IdempotencyLayer::max_response_body) (then it is
/// finished without its body and the rest streams on) or its client has gone and it
/// outlasts a lease.
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

/// A response part saying that the response's head is its outcome: if its body breaks
/// off after the head (an upstream that cut its connection mid-answer, a body that
/// failed), the head's disposition decides the key, instead of the key being held for a
/// takeover that would run the request again:
///
/// - stored: finished with its status and stored headers, without the body (a retry gets
///   them with `idempotent-body-not-stored: true`);
/// - released or held: as the status says.
///
/// The client whose body broke off gets the head, then its connection cut, once the key
/// is finished: a retry that the cut prompts finds the record.
///
/// For responses whose status is decided before the body is written, and stays true
/// however the body ends: `idem proxy` marks every upstream answer with it, once the
/// upstream's head has arrived. Not for gRPC, whose status comes in the trailers: a gRPC
/// answer whose body breaks off is held whatever it carries.
///
/// ```
/// use http::{Response, StatusCode};
/// use idem_http::FinalHead;
///
/// let mut response = Response::new(());
/// *response.status_mut() = StatusCode::CREATED;
/// response.extensions_mut().insert(FinalHead);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FinalHead;

/// The default status policy, which never releases a key whose effect may have happened
/// and never keeps an answer that says nothing was done:
///
/// | status | disposition | why |
/// |---|---|---|
/// | 1xx, 2xx, 3xx | [`Disposition::Store`] | the request was carried out: a retry gets this answer |
/// | 402 Payment Required | [`Disposition::Store`] | a declined payment is a result: a retry must not charge again |
/// | 400, 401, 403, 404, 405, 406, 409, 410, 411, 412, 413, 414, 415, 416, 417, 421, 422, 423, 424, 426, 428, 431, 451, and any other 4xx | [`Disposition::Release`] | a client error says the request was not carried out (RFC 9110 §15.5): a corrected retry (a fixed body, a refreshed token, the optimistic lock retried after a 409) runs the handler, as Stripe does for requests that fail validation |
/// | 425 Too Early, 429 Too Many Requests | [`Disposition::Release`] | the request was not processed; retry later |
/// | 408 Request Timeout | [`Disposition::Hold`] | the layer reads the whole request before the handler runs, so a 408 after it comes from a timeout between the layer and the handler (tower-http's `TimeoutLayer` answers 408), which may have cut the handler off after its effect |
/// | 5xx | [`Disposition::Hold`] | the handler failed, possibly after its effect: the key is held until the lease ends, then a retry takes over (resuming through its steps) |
///
/// A handler whose 4xx follows an effect says so with [`Disposition::Store`] in the
/// response's extensions.
///
/// ```
/// use http::StatusCode;
/// use idem_http::{default_disposition, Disposition};
///
/// assert_eq!(default_disposition(StatusCode::CREATED), Disposition::Store);
/// assert_eq!(default_disposition(StatusCode::PAYMENT_REQUIRED), Disposition::Store);
/// assert_eq!(default_disposition(StatusCode::UNPROCESSABLE_ENTITY), Disposition::Release);
/// assert_eq!(default_disposition(StatusCode::CONFLICT), Disposition::Release);
/// assert_eq!(default_disposition(StatusCode::TOO_MANY_REQUESTS), Disposition::Release);
/// assert_eq!(default_disposition(StatusCode::REQUEST_TIMEOUT), Disposition::Hold);
/// assert_eq!(default_disposition(StatusCode::INTERNAL_SERVER_ERROR), Disposition::Hold);
/// ```
pub fn default_disposition(status: StatusCode) -> Disposition {
    match status {
        StatusCode::PAYMENT_REQUIRED => Disposition::Store,
        StatusCode::REQUEST_TIMEOUT => Disposition::Hold,
        status if status.is_client_error() => Disposition::Release,
        status if status.is_server_error() => Disposition::Hold,
        _ => Disposition::Store,
    }
}
