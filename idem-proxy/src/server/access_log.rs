//! The access log: one line per request, with nothing secret in it.

use std::time::Duration;

use http::Response;
use idem_http::Body;

/// One line per request at `info`, target `idem_proxy::access`: the method, the path
/// (never the query, where tokens travel), the client's address, the route, the status,
/// whether it was a replay, and the time to the answer's head. Never a key, a header, a
/// token or a body. A subscriber filtering that target out (`idem proxy --log warn`)
/// leaves it out.
pub(super) fn access_log(seen: &Seen<'_>, response: &Response<Body>, elapsed: Duration) {
    // Only the layer says a replay is one: an unprotected upstream's header is its own.
    let replayed = seen.protected
        && response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|value| value == "true");
    // A path is as long as a client makes it: the line is not.
    let path = match seen.path.char_indices().nth(MAX_LOGGED_PATH) {
        Some((cut, _)) => &seen.path[..cut],
        None => seen.path,
    };
    tracing::info!(
        target: "idem_proxy::access",
        // The line says everything itself: not again as the request span's context.
        parent: None,
        method = %seen.method,
        path,
        peer = seen.peer.map(tracing::field::display),
        route = seen.route,
        trace_id = seen.trace,
        status = response.status().as_u16(),
        replayed,
        ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
    );
}

/// The characters of a path an access log line keeps.
const MAX_LOGGED_PATH: usize = 256;

/// What the access log says of a request.
pub(super) struct Seen<'a> {
    /// The request's W3C trace id, when it carried one.
    pub(super) trace: Option<&'a str>,
    pub(super) method: &'a http::Method,
    pub(super) path: &'a str,
    pub(super) peer: Option<std::net::IpAddr>,
    pub(super) route: &'a str,
    pub(super) protected: bool,
}
