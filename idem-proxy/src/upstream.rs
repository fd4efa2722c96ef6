//! The service behind the proxy: a request forwarded, its response streamed back.
//!
//! What the proxy answers when the upstream does not, and what becomes of the key:
//!
//! | the upstream | answer | the key |
//! |---|---|---|
//! | could not be reached (refused, no route, connect timeout) | 502 | released: the request never left the proxy, a retry runs it |
//! | took the request and sent no response head in `upstream_timeout` | 504 | held until the lease ends: the effect may have happened |
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
use crate::observe;

/// Forwards requests to the upstream; cheap to clone.
#[derive(Clone)]
pub(crate) struct Upstream {
    inner: Arc<Inner>,
    /// Small answers are read whole before they are passed on (protected routes only:
    /// elsewhere nothing is stored, and a read streams as it comes).
    buffer: bool,
}

struct Inner {
    client: Client<HttpConnector, Body>,
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    /// The upstream URL's path, without its trailing `/`, put before every request's.
    prefix: String,
    timeout: Duration,
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
            inner: Arc::new(Inner {
                client,
                scheme: parts.scheme.unwrap_or(http::uri::Scheme::HTTP),
                authority,
                prefix: parts
                    .path_and_query
                    .map(|p| p.path().trim_end_matches('/').to_owned())
                    .unwrap_or_default(),
                timeout: config.upstream_timeout,
                preserve_host: config.preserve_host,
                http2: config.upstream_http2,
                trust_forwarded: config.trust_forwarded_headers,
            }),
        })
    }

    /// The same upstream, reading small answers whole before passing them on: for a
    /// protected route, whose answer is then stored before the client sees it.
    pub(crate) fn buffering(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            buffer: true,
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
        remove_hop_by_hop(&mut parts.headers, Direction::Request);
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
        let deadline = tokio::time::Instant::now() + inner.timeout;
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
                    let idle = Idle::new(body, inner.timeout);
                    return Response::from_parts(parts, Body::new(idle));
                }
                let body = http_body_util::Limited::new(body, BUFFERED_RESPONSE as usize);
                // The body's own deadline, from its head: a head that came late leaves it
                // the whole timeout.
                let body_deadline = tokio::time::Instant::now() + inner.timeout;
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
                    timeout = ?inner.timeout,
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

/// A body whose every frame must come within `timeout` of the one before, or it breaks
/// off with an error.
struct Idle<B> {
    body: B,
    timeout: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl<B> Idle<B> {
    fn new(body: B, timeout: Duration) -> Self {
        Self {
            body,
            timeout,
            sleep: Box::pin(tokio::time::sleep(timeout)),
        }
    }
}

impl<B> http_body::Body for Idle<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
    B::Error: Into<idem_core::BoxError>,
{
    type Data = bytes::Bytes;
    type Error = idem_core::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            let next = tokio::time::Instant::now() + self.timeout;
            self.sleep.as_mut().reset(next);
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                observe::upstream_error("timeout");
                Poll::Ready(Some(Err("the upstream's answer stalled".into())))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
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
