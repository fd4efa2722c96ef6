//! The service behind the proxy: a request forwarded, its response streamed back.
//!
//! What the proxy answers when the upstream does not, and what becomes of the key:
//!
//! | the upstream | answer | the key |
//! |---|---|---|
//! | could not be reached (refused, no route, connect timeout) | 502 | released: the request never left the proxy, a retry runs it |
//! | took the request and sent no response head in `upstream_timeout` | 504 | held until the lease ends: the effect may have happened |
//! | refused the request's HTTP/2 stream (`REFUSED_STREAM`, or a graceful `GOAWAY` whose last stream id is below it: nothing of it was processed) | 502 | released: a retry runs it |
//! | broke the connection before the response head | 502 | held, for the same reason |
//! | sent its response head, then broke off its body, or (protected routes) let it stall for `upstream_timeout` | the client's connection is cut, after the head where it already went | the head decides: a stored status finishes the key without its body (a retry gets the status and headers with `idempotent-body-not-stored: true`, never a second run); a released or held one as its status says |
//!
//! On a protected route, a response whose `Content-Length` is at most 1 MiB is read whole
//! before it is passed on (within `upstream_timeout` from its head), so that its record
//! is stored before the client sees it: a retry sent the moment the first answer arrives
//! is a replay, not a 409. Longer or unsized responses stream, each frame within
//! `upstream_timeout` of the one before; on unprotected routes nothing bounds them (long
//! polls, long downloads).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use idem_http::{Body, Disposition, FinalHead, Problem};

use crate::config::Config;
use crate::idle::{Idle, Side};
use crate::observe;

/// Forwards requests to the upstream; cheap to clone.
#[derive(Clone)]
pub(crate) struct Upstream {
    inner: Arc<Inner>,
    /// Small answers are read whole before they are passed on (protected routes only:
    /// elsewhere nothing is stored, and a read streams as it comes).
    buffer: bool,
    /// How long the upstream may take to send a head, and (protected routes) to go on
    /// with its body: the route's `upstream_timeout`.
    timeout: Duration,
    /// The route's key header, on protected routes: a request that carries it is sent
    /// with its scoped key too.
    key_header: Option<HeaderName>,
}

/// The header a protected request's scoped key reaches the upstream in.
pub(crate) const SCOPED_KEY: HeaderName = HeaderName::from_static("idempotency-scoped-key");

struct Inner {
    client: Client<HttpConnector, Body>,
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    /// The upstream URL's path, without its trailing `/`, put before every request's.
    prefix: String,
    preserve_host: bool,
    http2: bool,
    trust_forwarded: bool,
}

/// Responses read whole before they are passed on, by their `Content-Length`.
const BUFFERED_RESPONSE: u64 = 1 << 20;

/// The upstream named in a configuration cannot be used (a configuration changed in
/// code; the file's check refuses these).
#[derive(Debug, thiserror::Error)]
#[error("`upstream` {0} is not http://host:port")]
pub struct BadUpstream(pub(crate) Uri);

impl Upstream {
    pub(crate) fn new(config: &Config) -> Result<Self, BadUpstream> {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(config.connect_timeout));
        connector.set_nodelay(true);
        // Idle connections are dropped before the upstream closes them (gunicorn after
        // 2 s, Node and uvicorn 5 s): a request written on a connection the upstream is
        // closing fails after it may have been read, and its key is held.
        let client = Client::builder(TokioExecutor::new())
            .http2_only(config.upstream_http2)
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(config.upstream_idle_timeout)
            .pool_max_idle_per_host(64)
            .build(connector);
        let parts = config.upstream.clone().into_parts();
        let Some(authority) = parts.authority else {
            return Err(BadUpstream(config.upstream.clone()));
        };
        Ok(Self {
            buffer: false,
            timeout: config.upstream_timeout.min(idem_core::raw::MAX_DURATION),
            key_header: None,
            inner: Arc::new(Inner {
                client,
                scheme: parts.scheme.unwrap_or(http::uri::Scheme::HTTP),
                authority,
                prefix: parts
                    .path_and_query
                    .map(|p| p.path().trim_end_matches('/').to_owned())
                    .unwrap_or_default(),
                preserve_host: config.preserve_host,
                http2: config.upstream_http2,
                trust_forwarded: config.trust_forwarded_headers,
            }),
        })
    }

    /// The same upstream for a route, within its `timeout`; for a protected route (its
    /// key header given), reading small answers whole before passing them on (so that
    /// they are stored before the client sees them) and sending the scoped key.
    pub(crate) fn for_route(&self, protected: Option<HeaderName>, timeout: Duration) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            buffer: protected.is_some(),
            // A deadline far enough to be none, never past what an `Instant` holds.
            timeout: timeout.min(idem_core::raw::MAX_DURATION),
            key_header: protected,
        }
    }

    /// The request on its way to the upstream, and the response on its way back.
    pub(crate) async fn forward(&self, request: Request<Body>) -> Response<Body> {
        let inner = &self.inner;
        let (mut parts, body) = request.into_parts();
        let path_and_query = parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        let uri = Uri::builder()
            .scheme(inner.scheme.clone())
            .authority(inner.authority.clone())
            .path_and_query(format!("{}{path_and_query}", inner.prefix))
            .build();
        let Ok(uri) = uri else {
            return problem(
                StatusCode::BAD_REQUEST,
                "bad-target",
                "The request target cannot be forwarded",
                Disposition::Release,
            );
        };
        let original_host = parts.headers.get(header::HOST).cloned().or_else(|| {
            parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|info| info.0.ip());
        // Decided before hop-by-hop headers go: a client's `Connection` may name its key
        // header, never take the scoped key away.
        let scoped = match (
            &self.key_header,
            parts.extensions.get::<idem_core::Context>(),
        ) {
            (Some(name), Some(context)) if parts.headers.contains_key(name) => {
                Some(scoped_key(&context.key()))
            }
            _ => None,
        };
        remove_hop_by_hop(&mut parts.headers, Direction::Request);
        // Never a client's own: only the proxy names a scoped key.
        parts.headers.remove(SCOPED_KEY);
        if let Some(value) = scoped {
            parts.headers.insert(SCOPED_KEY, value);
        }
        if !inner.trust_forwarded {
            // What a client says of where it came from, or of which method or path it
            // meant, is not believed.
            for name in [
                "forwarded",
                "x-forwarded-for",
                "x-forwarded-proto",
                "x-forwarded-host",
                "x-forwarded-port",
                "x-forwarded-prefix",
                "x-real-ip",
                "x-original-url",
                "x-rewrite-url",
                "x-http-method-override",
                "x-http-method",
                "x-method-override",
            ] {
                parts.headers.remove(name);
            }
        }
        if let Some(peer) = peer {
            let earlier: Vec<&str> = parts
                .headers
                .get_all("x-forwarded-for")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            let forwarded_for = match earlier.is_empty() {
                false => format!("{}, {peer}", earlier.join(", ")),
                true => peer.to_string(),
            };
            if let Ok(value) = HeaderValue::from_str(&forwarded_for) {
                parts.headers.insert("x-forwarded-for", value);
            }
        }
        if !parts.headers.contains_key("x-forwarded-proto") {
            parts
                .headers
                .insert("x-forwarded-proto", HeaderValue::from_static("http"));
        }
        if let Some(host) = &original_host
            && !parts.headers.contains_key("x-forwarded-host")
        {
            parts.headers.insert("x-forwarded-host", host.clone());
        }
        if inner.preserve_host {
            if let Some(host) = original_host {
                parts.headers.insert(header::HOST, host);
            }
        } else if let Ok(host) = HeaderValue::from_str(inner.authority.as_str()) {
            parts.headers.insert(header::HOST, host);
        }
        // The upstream's own spelling of the path, to tell a redirect that only adds or
        // drops its trailing `/`.
        let upstream_path = uri.path().to_owned();
        parts.uri = uri;
        // The client's own version says nothing of the upstream's connection.
        parts.version = if inner.http2 {
            http::Version::HTTP_2
        } else {
            http::Version::HTTP_11
        };
        let started = Instant::now();
        let request = Request::from_parts(parts, body);
        let deadline = tokio::time::Instant::now() + self.timeout;
        let answer = tokio::time::timeout_at(deadline, inner.client.request(request)).await;
        observe::upstream_latency(started.elapsed());
        match answer {
            Ok(Ok(response)) => {
                let (mut parts, body) = response.into_parts();
                // Both framings: the length is not what the body is (RFC 9112, section
                // 6.3); hyper's server frames what is passed on by itself.
                if parts.headers.contains_key(header::TRANSFER_ENCODING) {
                    parts.headers.remove(header::CONTENT_LENGTH);
                }
                remove_hop_by_hop(&mut parts.headers, Direction::Response);
                // The upstream's head is how the request went: if its body breaks off, the
                // key is finished with the head, never run again.
                parts.extensions.insert(FinalHead);
                if redirects_to_other_slash(parts.status, &parts.headers, &upstream_path) {
                    // Nothing ran (Starlette's and Werkzeug's `/payments` to `/payments/`),
                    // and both spellings are one operation here: kept, the redirect would
                    // be replayed to the request that follows it, forever.
                    parts.extensions.insert(Disposition::Release);
                }
                // Only a length the client enforces counts, and never more than the bound.
                let small = http_body::Body::size_hint(&body)
                    .exact()
                    .is_some_and(|length| length <= BUFFERED_RESPONSE);
                if !self.buffer {
                    return Response::from_parts(parts, Body::new(body));
                }
                if !small {
                    // Streamed on a protected route: a body that stalls for a whole
                    // `upstream_timeout` breaks off, and its head decides the key,
                    // rather than holding it in progress while the client waits.
                    let idle = Idle::new(body, self.timeout, Side::Upstream)
                        .on_stall(|| observe::upstream_error("timeout"));
                    return Response::from_parts(parts, Body::new(idle));
                }
                let body = http_body_util::Limited::new(body, BUFFERED_RESPONSE as usize);
                // The body's own deadline, from its head: a head that came late leaves it
                // the whole timeout.
                let body_deadline = tokio::time::Instant::now() + self.timeout;
                match tokio::time::timeout_at(body_deadline, body.collect()).await {
                    Ok(Ok(collected)) => {
                        let (data, trailers) = {
                            let trailers = collected.trailers().cloned();
                            (collected.to_bytes(), trailers)
                        };
                        let body = http_body_util::Full::new(data);
                        match trailers {
                            None => Response::from_parts(parts, Body::new(body)),
                            Some(trailers) => Response::from_parts(
                                parts,
                                Body::new(body.with_trailers(async move { Some(Ok(trailers)) })),
                            ),
                        }
                    }
                    Ok(Err(err)) => {
                        observe::upstream_error("broken");
                        tracing::warn!(error = %err, "the upstream's response body broke off after its head; its head decides the key");
                        Response::from_parts(
                            parts,
                            broken_body("the upstream broke off its answer"),
                        )
                    }
                    Err(_) => {
                        observe::upstream_error("timeout");
                        tracing::warn!(
                            "the upstream's response body did not arrive in time after its head; its head decides the key"
                        );
                        Response::from_parts(
                            parts,
                            broken_body("the upstream did not finish its answer in time"),
                        )
                    }
                }
            }
            Ok(Err(err)) if err.is_connect() => {
                observe::upstream_error("connect");
                tracing::warn!(error = %err, "the upstream could not be reached; the key is released");
                problem(
                    StatusCode::BAD_GATEWAY,
                    "upstream-unreachable",
                    "The service behind the proxy could not be reached; nothing was sent to it",
                    Disposition::Release,
                )
            }
            // The client stopped sending its body: the upstream got part of it, and no
            // answer is owed to a client that went quiet. Nothing protected reaches here
            // (the layer reads those bodies before a claim).
            Ok(Err(err)) if crate::idle::client_stalled(&err) => {
                tracing::debug!("a client's request body stalled on its way to the upstream");
                problem(
                    StatusCode::REQUEST_TIMEOUT,
                    "body-timeout",
                    "The request body stopped arriving; send the request again",
                    Disposition::Release,
                )
            }
            Ok(Err(err)) if refused_stream(&err) => {
                observe::upstream_error("refused");
                tracing::warn!(error = %err, "the upstream refused the request's HTTP/2 stream, before processing it; the key is released");
                problem(
                    StatusCode::BAD_GATEWAY,
                    "upstream-refused",
                    "The service behind the proxy refused the request without processing it; retry",
                    Disposition::Release,
                )
            }
            Ok(Err(err)) => {
                observe::upstream_error("broken");
                tracing::warn!(error = %err, "the upstream broke the exchange before answering; the key is held until its lease ends");
                problem(
                    StatusCode::BAD_GATEWAY,
                    "upstream-broken",
                    "The service behind the proxy took the request but did not answer; retry after the lease",
                    Disposition::Hold,
                )
            }
            Err(_) => {
                observe::upstream_error("timeout");
                tracing::warn!(
                    timeout = ?self.timeout,
                    "the upstream did not answer in time; the key is held until its lease ends"
                );
                problem(
                    StatusCode::GATEWAY_TIMEOUT,
                    "upstream-timeout",
                    "The service behind the proxy did not answer in time; retry after the lease",
                    Disposition::Hold,
                )
            }
        }
    }
}

/// `idem-` and a hash of the key with its scope (64 hex digits): what the upstream
/// dedupes by, the same for every retry of one caller's operation and never the same for
/// two callers.
fn scoped_key(key: &idem_core::Key) -> HeaderValue {
    let digest = idem_core::Fingerprint::builder()
        .field("idem-proxy scoped key")
        .field(key.scope())
        .field(key.key())
        .finish();
    let mut text = String::with_capacity(5 + 64);
    text.push_str("idem-");
    for byte in digest.as_bytes() {
        text.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
        text.push(char::from(b"0123456789abcdef"[usize::from(byte & 0xf)]));
    }
    HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("idem-"))
}

/// Whether the upstream said that no part of the request's HTTP/2 stream was processed
/// (RFC 9113, section 8.7), so that a retry may run it:
/// - it reset the stream with `REFUSED_STREAM`;
/// - it went away gracefully (`GOAWAY` with `NO_ERROR`) with a last stream id below the
///   stream's. The h2 crate fails a stream with that `GOAWAY` only when the stream is
///   past the last id: the streams the upstream took run on, and one cut later fails
///   with the connection's own error. A `GOAWAY` with an error code is not read so:
///   it fails every stream, those taken included.
fn refused_stream(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(cause) = source {
        if let Some(h2) = cause.downcast_ref::<h2::Error>() {
            let refused = h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM);
            let passed_over = h2.is_go_away() && h2.reason() == Some(h2::Reason::NO_ERROR);
            return h2.is_remote() && (refused || passed_over);
        }
        source = cause.source();
    }
    false
}

/// Whether an answer redirects to the same path with its trailing `/` added or dropped.
fn redirects_to_other_slash(status: StatusCode, headers: &HeaderMap, path: &str) -> bool {
    if !status.is_redirection() {
        return false;
    }
    let Some(location) = headers
        .get(header::LOCATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<Uri>().ok())
    else {
        return false;
    };
    let target = location.path();
    target != path && target.trim_end_matches('/') == path.trim_end_matches('/')
}

/// A body that fails at once: the client's connection is cut after the head, and the
/// layer finishes the key with the head (the response carries [`FinalHead`]).
fn broken_body(why: &'static str) -> Body {
    /// Its one frame is an error.
    struct Broken(Option<&'static str>);
    impl http_body::Body for Broken {
        type Data = bytes::Bytes;
        type Error = idem_core::BoxError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
            Poll::Ready(self.0.take().map(|why| Err(why.into())))
        }
    }
    Body::new(Broken(Some(why)))
}

/// A problem of the proxy's own, with what the layer does with the key.
fn problem(
    status: StatusCode,
    slug: &str,
    title: &str,
    disposition: Disposition,
) -> Response<Body> {
    let mut response = Problem::new(status, slug, title).into_http_response();
    response.extensions_mut().insert(disposition);
    response
}

/// Which way a message goes through the proxy.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Request,
    Response,
}

/// Headers that describe one connection (RFC 9110, section 7.6.1), and those the
/// `Connection` header names: never forwarded either way. A request's `Connection` cannot
/// take its key or its credentials away from the upstream, after the proxy used them.
fn remove_hop_by_hop(headers: &mut HeaderMap, direction: Direction) {
    let kept = [
        header::AUTHORIZATION,
        header::COOKIE,
        HeaderName::from_static("idempotency-key"),
    ];
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .filter(|name| direction == Direction::Response || !kept.contains(name))
        .collect();
    for name in named {
        headers.remove(name);
    }
    // `TE: trailers` goes on (gRPC needs it end to end); any other TE is this hop's.
    if headers
        .get(header::TE)
        .is_some_and(|te| !te.as_bytes().eq_ignore_ascii_case(b"trailers"))
    {
        headers.remove(header::TE);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        HeaderName::from_static("proxy-connection"),
    ] {
        headers.remove(name);
    }
}

impl tower::Service<Request<Body>> for Upstream {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.forward(request).await) })
    }
}
