//! Every proxied request: the client limits on it, its route or the unmatched rule, its
//! trace id, and the answers the proxy gives itself (overloaded, a stalled body).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use idem_http::{Body, Problem};

use super::Shared;
use super::access_log::{Seen, access_log};
use crate::clients;
use crate::config::Unmatched;
use crate::idle::{Idle, Side};
use crate::observe;
use crate::routes::normalize;

/// Every proxied request: its route, or the unmatched rule.
#[derive(Clone)]
pub(super) struct ProxyService {
    pub(super) shared: Arc<Shared>,
}

impl tower::Service<Request<axum::body::Body>> for ProxyService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<axum::body::Body>) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        // The request's span, in OpenTelemetry's terms (a `tracing-opentelemetry` layer
        // exports it): its trace is the caller's W3C trace context, which goes on to the
        // upstream untouched. At `debug`, as tower-http's `TraceLayer`: a subscriber at
        // `info` (the binary's default) neither builds nor formats it per request.
        let trace = trace_id(request.headers());
        let span = tracing::debug_span!(
            "request",
            otel.kind = "server",
            http.request.method = %request.method(),
            http.route = tracing::field::Empty,
            http.response.status_code = tracing::field::Empty,
            trace_id = trace.as_deref(),
        );
        let future = Box::pin(async move {
            // Past the limit, answered before anything is read, claimed or forwarded.
            // Handlers whose clients went away still hold their bodies and an upstream
            // call: they count too.
            let started = std::time::Instant::now();
            let peer = request
                .extensions()
                .get::<axum::extract::ConnectInfo<SocketAddr>>()
                .map(|info| info.0.ip());
            let detached = shared.orphaned(&shared.live.load());
            let permit = match Arc::clone(&shared.requests).try_acquire_owned() {
                Ok(permit) if detached <= shared.requests.available_permits() => permit,
                _ => {
                    observe::client_limit("requests");
                    observe::request("overloaded", StatusCode::SERVICE_UNAVAILABLE);
                    let response = overloaded();
                    let seen = Seen {
                        method: request.method(),
                        path: request.uri().path(),
                        peer,
                        route: "overloaded",
                        protected: false,
                        trace: trace.as_deref(),
                    };
                    access_log(&seen, &response, started.elapsed());
                    return Ok(response);
                }
            };
            let (method, path) = (request.method().clone(), request.uri().path().to_owned());
            let Answered {
                route,
                protected,
                response,
                stalled,
            } = answer(&shared, request.map(Body::new)).await;
            // The body stalled and the proxy's own refusal says what broke (a 400 from
            // the layer): the client is told it was too slow. An upstream's answer stays.
            let response = match stalled {
                Some(stalled)
                    if stalled.load(Ordering::Relaxed)
                        && response.extensions().get::<Problem>().is_some() =>
                {
                    body_timed_out()
                }
                _ => response,
            };
            observe::request(&route, response.status());
            let span = tracing::Span::current();
            span.record("http.route", route.as_str());
            span.record("http.response.status_code", response.status().as_u16());
            let seen = Seen {
                method: &method,
                path: &path,
                peer,
                route: &route,
                protected,
                trace: trace.as_deref(),
            };
            access_log(&seen, &response, started.elapsed());
            // A protected answer is held in memory until it has gone out; anything else
            // streams, and stops counting once its head is ready.
            Ok(match protected {
                true => response.map(|body| clients::holding(body, permit)),
                false => response,
            })
        });
        Box::pin(tracing::Instrument::instrument(future, span))
    }
}

/// The trace id of a request's W3C `traceparent` (version `00`, or a later one read as
/// `00` says), when it is well formed: 32 lowercase hex digits, not all zero.
fn trace_id(headers: &http::HeaderMap) -> Option<String> {
    let value = headers.get("traceparent")?.to_str().ok()?.trim();
    let mut fields = value.split('-');
    let (version, trace, parent, flags) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let hex = |text: &str, len: usize| {
        text.len() == len
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let valid = hex(version, 2)
        && version != "ff"
        && (version != "00" || fields.next().is_none())
        && hex(trace, 32)
        && trace.bytes().any(|b| b != b'0')
        && hex(parent, 16)
        && parent.bytes().any(|b| b != b'0')
        && hex(flags, 2);
    valid.then(|| trace.to_owned())
}

/// A request's answer, and where it came from.
struct Answered {
    /// The route's name, or `unmatched`.
    route: String,
    /// Whether the route is protected.
    protected: bool,
    response: Response<Body>,
    /// Raised when the request body stalled, if it was timed.
    stalled: Option<Arc<std::sync::atomic::AtomicBool>>,
}

/// The request with its body timed by `client_body_timeout`, and the flag it raises when
/// it stalls. An unprotected gRPC call's body is left alone: a client stream stays open,
/// quiet, for as long as the call lasts. A protected one is read whole before a claim (a
/// unary call's one message; client streams are refused), and is timed like any body.
fn timed(
    shared: &Shared,
    request: Request<Body>,
    protected: bool,
) -> (Request<Body>, Option<Arc<std::sync::atomic::AtomicBool>>) {
    let grpc = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"));
    if grpc && !protected {
        return (request, None);
    }
    let (parts, body) = request.into_parts();
    let body = Idle::new(body, shared.limits.body_timeout, Side::Client)
        .on_stall(|| observe::client_limit("body_timeout"));
    let stalled = body.stalled();
    (Request::from_parts(parts, Body::new(body)), Some(stalled))
}

/// A request's answer: its route's, or the unmatched rule's.
async fn answer(shared: &Shared, request: Request<Body>) -> Answered {
    let mut request = request;
    // What this request began on: a reload meanwhile does not change it.
    let live = shared.live.load_full();
    // Routes see, and the upstream gets, the path made plain.
    if let Some(plain) = normalize(request.uri().path()) {
        let target = match request.uri().query() {
            Some(query) => format!("{plain}?{query}"),
            None => plain,
        };
        let mut parts = request.uri().clone().into_parts();
        let rebuilt = target.parse().ok().and_then(|target| {
            parts.path_and_query = Some(target);
            http::Uri::from_parts(parts).ok()
        });
        let Some(uri) = rebuilt else {
            // Never the raw path, which the routes did not see.
            return Answered {
                route: "unmatched".to_owned(),
                protected: false,
                stalled: None,
                response: Problem::new(
                    StatusCode::BAD_REQUEST,
                    "bad-target",
                    "The request's path cannot be made plain",
                )
                .into_http_response(),
            };
        };
        *request.uri_mut() = uri;
    }
    // The router in front set the path as it came; the scope and the fingerprint
    // read that one first (`idem_http::scope::path`): they must see the plain one,
    // or each spelling of a path would be an operation of its own (a trailing `/`
    // the route's pattern does not have included). The upstream gets the path as
    // it came, made plain.
    let route = live.routes.find(request.method(), request.uri().path());
    let operation = route
        .map(|index| live.routes.operation_path(index, request.uri().path()))
        .filter(|path| *path != request.uri().path())
        .and_then(|path| {
            let target = match request.uri().query() {
                Some(query) => format!("{path}?{query}"),
                None => path.to_owned(),
            };
            target.parse::<http::Uri>().ok()
        });
    let plain = axum::extract::OriginalUri(operation.unwrap_or_else(|| request.uri().clone()));
    request.extensions_mut().insert(plain);
    let protected = route.is_some_and(|index| live.routes.is_protected(index));
    let (request, stalled) = timed(shared, request, protected);
    match route {
        Some(index) => Answered {
            route: live.routes.name(index).to_owned(),
            protected,
            response: live.routes.serve(index, request).await,
            stalled,
        },
        None => Answered {
            route: "unmatched".to_owned(),
            protected: false,
            stalled,
            response: match live.unmatched {
                Unmatched::Pass => {
                    if !request.method().is_safe()
                        && live
                            .key_headers
                            .iter()
                            .any(|name| request.headers().contains_key(name))
                    {
                        unprotected_key(shared, &request);
                    }
                    live.upstream.forward(request).await
                }
                Unmatched::Reject => Problem::new(
                    StatusCode::NOT_FOUND,
                    "no-route",
                    "No route of the proxy matches this method and path",
                )
                .into_http_response(),
            },
        },
    }
}

/// A request with a key on no route: counted, and logged at most once a minute (never
/// the key), so that a route missing from the file is seen before a retry runs twice.
fn unprotected_key(shared: &Shared, request: &Request<Body>) {
    observe::unprotected_key();
    let now = shared.started.elapsed().as_secs();
    let last = shared.unprotected_logged.load(Ordering::Relaxed);
    if (last == u64::MAX || now >= last + 60)
        && shared
            .unprotected_logged
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            method = %request.method(),
            path = %request.uri().path(),
            "a request with an idempotency key matches no route: it went to the upstream unprotected, and a retry of it runs again; add a route for it (or `unmatched = \"reject\"`). Counted in idem_proxy_unprotected_keys_total; logged at most once a minute"
        );
    }
}

/// 503 with `Retry-After`: `max_concurrent_requests` are being served.
fn overloaded() -> Response<Body> {
    let mut response = Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        "The proxy is serving as many requests as it may at once; nothing was done: retry shortly",
    )
    .into_http_response();
    response.headers_mut().insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from_static("1"),
    );
    response
}

/// 408: the request body stalled for `client_body_timeout` while the proxy read it to
/// fingerprint it; nothing was claimed or forwarded. The connection is closed.
fn body_timed_out() -> Response<Body> {
    let mut response = Problem::new(
        StatusCode::REQUEST_TIMEOUT,
        "body-timeout",
        "The request body stopped arriving; nothing was done: send it again",
    )
    .into_http_response();
    response.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::trace_id;

    #[test]
    fn a_trace_id_is_read_from_a_well_formed_traceparent_only() {
        let with = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert("traceparent", http::HeaderValue::from_str(value).unwrap());
            trace_id(&headers)
        };
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(
            with(&format!("00-{id}-00f067aa0ba902b7-01")).as_deref(),
            Some(id)
        );
        // A later version may add fields.
        assert_eq!(
            with(&format!("01-{id}-00f067aa0ba902b7-01-more")).as_deref(),
            Some(id)
        );
        for bad in [
            format!("00-{id}-00f067aa0ba902b7-01-more"),
            format!("ff-{id}-00f067aa0ba902b7-01"),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01".to_owned(),
            format!("00-{id}-0000000000000000-01"),
            format!("00-{}-00f067aa0ba902b7-01", id.to_uppercase()),
            format!("00-{id}-00f067aa0ba902b7"),
            "garbage".to_owned(),
        ] {
            assert_eq!(with(&bad), None, "{bad}");
        }
        assert_eq!(trace_id(&http::HeaderMap::new()), None);
    }
}
