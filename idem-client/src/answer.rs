//! What the answer says about how it was obtained.

use crate::key::IdempotencyKey;

/// How an answer was obtained: in a response's extensions after the middleware.
///
/// The key is the operation's (the caller's or the automatic one): keep it before
/// reading the body, so that a body cut off mid-way can be fetched again by retrying the
/// request with it.
///
/// ```
/// use idem_client::Attempts;
///
/// let response = reqwest::Response::from(http::Response::new(""));
/// // Absent unless the middleware handled the request.
/// assert!(response.extensions().get::<Attempts>().is_none());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Attempts {
    /// How many requests were sent, the first included (polls of a request in flight
    /// too).
    pub attempts: u32,
    /// Whether the server replayed an earlier try's answer (`Idempotent-Replayed: true`):
    /// the operation ran once, on an earlier try.
    pub replayed: bool,
    /// The key every try carried; `None` for a request sent without one.
    pub key: Option<IdempotencyKey>,
}
