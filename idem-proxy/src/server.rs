//! The proxy as a server: its two listeners, its requests, its shutdown.

use std::convert::Infallible;
use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::Router;
use axum::extract::State;
use axum::routing::get;
use http::{Request, Response, StatusCode};
use idem_core::{Key, Store};
use idem_http::{Body, Handlers, Problem};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::clients;
use crate::config::{ClientLimits, Config, Unmatched};
use crate::idle::{Idle, Side};
use crate::observe;
use crate::reload::{Live, Reloader, Retired};
use crate::routes::RouteError;
use crate::routes::normalize;
use crate::upstream::BadUpstream;

/// Why the proxy could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// A listening address could not be bound.
    #[error(
        "cannot listen on {addr}: {source} (is another process on that port? change `{setting}`)"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The setting that names it.
        setting: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The routes could not be built.
    #[error(transparent)]
    Route(#[from] RouteError),
    /// The upstream cannot be used.
    #[error(transparent)]
    Upstream(#[from] BadUpstream),
    /// The upstream is the proxy itself: every request would come back to it.
    #[error(
        "`upstream` {upstream} is the proxy's own listener ({listen}): point it at the service behind the proxy"
    )]
    Loop {
        /// The upstream.
        upstream: http::Uri,
        /// Where the proxy listens.
        listen: SocketAddr,
    },
    /// A client limit built in code cannot work (the file's check refuses these).
    #[error("`{setting}` {why}")]
    Limit {
        /// The setting, as the file names it.
        setting: &'static str,
        /// What it must be.
        why: &'static str,
    },
    /// A listener failed while serving.
    #[error("serving failed: {0}")]
    Serve(#[source] std::io::Error),
    /// A reload changes a setting read when the proxy started.
    #[error(
        "`{setting}` changed: it is read when the proxy starts; restart the proxy to apply it (nothing was reloaded)"
    )]
    NeedsRestart {
        /// The setting, as the file names it.
        setting: &'static str,
    },
}

/// A bound proxy, ready to [`run`](Proxy::run).
///
/// ```no_run
/// use std::sync::Arc;
/// use idem_core::{MemoryStore, Store};
/// use idem_proxy::{Config, Proxy};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let config = Config::load("idem.toml")?;
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new()); // any idem store
/// let proxy = Proxy::bind(config, "idem.toml", store).await?;
/// println!("listening on {}", proxy.local_addr());
/// proxy.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(()) }
/// ```
pub struct Proxy {
    config: Config,
    /// The configuration in force, as reloads change it.
    running: Arc<tokio::sync::Mutex<Config>>,
    config_path: PathBuf,
    listener: TcpListener,
    admin_listener: TcpListener,
    shared: Arc<Shared>,
    metrics: Option<PrometheusHandle>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("listen", &self.listener.local_addr().ok())
            .field("admin_listen", &self.admin_listener.local_addr().ok())
            .field("upstream", &self.config.upstream)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Shared {
    /// The routes and the upstream, swapped whole by a reload.
    pub(crate) live: ArcSwap<Live>,
    /// The handlers of routes a reload replaced: they still count against
    /// `max_concurrent_requests`, and a shutdown waits for them.
    retired: Retired,
    pub(crate) store: Arc<dyn Store>,
    /// Cleared when a shutdown begins: `/readyz` answers 503 from then on.
    ready: AtomicBool,
    /// Whether `/readyz` reads the store too.
    ready_checks_store: bool,
    limits: ClientLimits,
    /// One permit per request served at once.
    requests: Arc<tokio::sync::Semaphore>,
    /// When an unprotected key was last logged (seconds since the proxy started).
    unprotected_logged: std::sync::atomic::AtomicU64,
    started: std::time::Instant,
}

impl Shared {
    pub(crate) fn retire(&self, live: &Arc<Live>) {
        self.retired.add(live);
    }

    /// Handlers running for clients that went away, on the routes served now or before
    /// a reload.
    fn orphaned(&self, live: &Live) -> usize {
        live.routes
            .handlers
            .iter()
            .map(Handlers::orphaned)
            .sum::<usize>()
            + self.retired.orphaned()
    }
}

impl Proxy {
    /// Builds the routes over `store` and binds both listeners; nothing is served until
    /// [`run`](Proxy::run). `config_path` names the file in messages.
    ///
    /// # Errors
    /// [`ProxyError::Bind`] when an address is taken, [`ProxyError::Route`] when a
    /// route cannot be built (two routes that cannot be told apart, say).
    pub async fn bind(
        config: Config,
        config_path: impl Into<PathBuf>,
        store: Arc<dyn Store>,
    ) -> Result<Self, ProxyError> {
        check_limits(&config.clients)?;
        let config_path = config_path.into();
        let live = Live::build(&config, &config_path, &store).await?;
        let bind = |addr: SocketAddr, setting: &'static str| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| ProxyError::Bind {
                    addr,
                    setting,
                    source,
                })
        };
        let listener = bind(config.listen, "listen").await?;
        if let Ok(listen) = listener.local_addr()
            && points_at(&config.upstream, listen)
        {
            return Err(ProxyError::Loop {
                upstream: config.upstream.clone(),
                listen,
            });
        }
        let admin_listener = bind(config.admin_listen, "admin_listen").await?;
        Ok(Self {
            shared: Arc::new(Shared {
                live: ArcSwap::from_pointee(live),
                retired: Retired::default(),
                store,
                ready: AtomicBool::new(true),
                ready_checks_store: config.ready_checks_store,
                limits: config.clients,
                requests: Arc::new(tokio::sync::Semaphore::new(
                    config.clients.max_concurrent_requests,
                )),
                unprotected_logged: std::sync::atomic::AtomicU64::new(u64::MAX),
                started: std::time::Instant::now(),
            }),
            running: Arc::new(tokio::sync::Mutex::new(config.clone())),
            config,
            config_path,
            listener,
            admin_listener,
            metrics: None,
        })
    }

    /// A handle that reloads this proxy's configuration while it runs (see
    /// [`Reloader`]).
    pub fn reloader(&self) -> Reloader {
        Reloader {
            shared: Arc::clone(&self.shared),
            running: Arc::clone(&self.running),
            config_path: self.config_path.clone(),
            listen: self.local_addr(),
        }
    }

    /// Serves `/metrics` from this recorder's handle (the process installs the recorder:
    /// there is one per process). Without it, `/metrics` is 404.
    #[must_use]
    pub fn metrics(mut self, handle: PrometheusHandle) -> Self {
        self.metrics = Some(handle);
        self
    }

    /// Where clients connect (the port the system chose, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.config.listen)
    }

    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_listener
            .local_addr()
            .unwrap_or(self.config.admin_listen)
    }

    /// Serves until `shutdown` completes, then shuts down gracefully:
    ///
    /// - `/readyz` answers 503 at once, so a load balancer stops sending; requests are
    ///   still served for `shutdown_delay`.
    /// - Then no new connection is accepted; requests in flight run to their end, and
    ///   idle connections are closed.
    /// - Handlers whose clients went away run on and store their answers.
    /// - All of it within `shutdown_delay` plus `shutdown_grace`; what is still running
    ///   then is cut, and its keys stay held until their leases end, when a retry
    ///   (through another replica) takes over. Connections cut so end when the runtime is
    ///   shut down: `run` returns without waiting for them, and the caller shuts the
    ///   runtime down (`idem proxy` does, on return).
    ///
    /// Clients are held to [`Config::clients`](crate::Config::clients) throughout.
    ///
    /// # Errors
    /// None today: a failed accept (no file descriptor left, say) is logged and tried
    /// again after a second, as hyper's own server did. [`ProxyError::Serve`] is kept for
    /// a listener that fails for good.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ProxyError> {
        let token = CancellationToken::new();
        let purge = self.config.purge_interval.map(|every| {
            tokio::spawn(purge_loop(
                Arc::clone(&self.shared.store),
                every,
                token.clone(),
            ))
        });

        let admin = Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(AdminState {
                shared: Arc::clone(&self.shared),
                metrics: self.metrics.clone(),
            });
        let admin_token = token.clone();
        let admin_server = tokio::spawn(
            axum::serve(self.admin_listener, admin)
                .with_graceful_shutdown(async move { admin_token.cancelled().await })
                .into_future(),
        );

        let app = Router::new().fallback_service(ProxyService {
            shared: Arc::clone(&self.shared),
        });
        let shared = Arc::clone(&self.shared);
        let serve_token = token.clone();
        let began = CancellationToken::new();
        let began_signal = began.clone();
        let delay = self.config.shutdown_delay;
        let server = clients::serve(self.listener, app, self.config.clients, async move {
            tokio::select! {
                () = shutdown => {}
                () = serve_token.cancelled() => {}
            }
            shared.ready.store(false, Ordering::SeqCst);
            began_signal.cancel();
            if !delay.is_zero() {
                tracing::info!(
                    ?delay,
                    "shutting down: not ready; still serving for the shutdown delay"
                );
                tokio::time::sleep(delay).await;
            }
            tracing::info!(
                "shutting down: no new connections; requests in flight run to their end"
            );
        });
        tokio::pin!(server);

        // One deadline for the whole shutdown, from the moment it began (plus the
        // delay): in-flight requests, then handlers whose clients went away.
        let grace = self.config.shutdown_grace;
        let deadline = async {
            began.cancelled().await;
            tokio::time::Instant::now() + delay + grace
        };
        tokio::pin!(deadline);
        let mut ends_at = None;
        loop {
            tokio::select! {
                () = &mut server => break,
                at = &mut deadline, if ends_at.is_none() => ends_at = Some(at),
                () = async {
                    match ends_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {
                    tracing::warn!(?grace, "requests still in flight after the shutdown grace are cut; their keys stay held until their leases end, when a retry takes over");
                    break;
                }
            }
        }
        let ends_at = match ends_at {
            Some(at) => at,
            // The server ended in the same moment the shutdown began.
            None if began.is_cancelled() => (&mut deadline).await,
            // It ended on its own (a listener failed).
            None => tokio::time::Instant::now() + grace,
        };
        // Handlers whose clients went away store their answers, within what is left.
        let mut handlers = self.shared.live.load().routes.handlers.clone();
        handlers.extend(self.shared.retired.all());
        let waited = tokio::time::timeout_at(ends_at, async move {
            for handlers in &handlers {
                handlers.wait().await;
            }
        })
        .await;
        if waited.is_err() {
            tracing::warn!(
                "handlers whose clients went away were still running after the shutdown grace; their keys stay held until their leases end"
            );
        }
        token.cancel();
        if let Some(purge) = purge {
            let _ = purge.await;
        }
        // A scraper that holds its connection open does not hold the shutdown.
        let mut admin_server = admin_server;
        if tokio::time::timeout(Duration::from_secs(1), &mut admin_server)
            .await
            .is_err()
        {
            admin_server.abort();
        }
        Ok(())
    }
}

/// Every proxied request: its route, or the unmatched rule.
#[derive(Clone)]
struct ProxyService {
    shared: Arc<Shared>,
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

/// One line per request at `info`, target `idem_proxy::access`: the method, the path
/// (never the query, where tokens travel), the client's address, the route, the status,
/// whether it was a replay, and the time to the answer's head. Never a key, a header, a
/// token or a body. A subscriber filtering that target out (`idem proxy --log warn`)
/// leaves it out.
fn access_log(seen: &Seen<'_>, response: &Response<Body>, elapsed: Duration) {
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
struct Seen<'a> {
    /// The request's W3C trace id, when it carried one.
    trace: Option<&'a str>,
    method: &'a http::Method,
    path: &'a str,
    peer: Option<std::net::IpAddr>,
    route: &'a str,
    protected: bool,
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

#[derive(Clone)]
struct AdminState {
    shared: Arc<Shared>,
    metrics: Option<PrometheusHandle>,
}

/// 200 while serving; 503 once a shutdown began. With `ready_checks_store`, also 503
/// while the store fails a read or takes longer than 800 ms (below kubelet's default 1 s
/// probe timeout, so the probe gets an answer, not a timeout).
async fn readyz(State(state): State<AdminState>) -> (StatusCode, &'static str) {
    if !state.shared.ready.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
    }
    if !state.shared.ready_checks_store {
        return (StatusCode::OK, "ready\n");
    }
    let Ok(probe) = Key::new("idem-proxy", "readiness") else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no probe key\n");
    };
    match tokio::time::timeout(Duration::from_millis(800), state.shared.store.get(&probe)).await {
        Ok(Ok(_)) => (StatusCode::OK, "ready\n"),
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "readiness: the store failed a read");
            (StatusCode::SERVICE_UNAVAILABLE, "the store failed a read\n")
        }
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the store did not answer in 800 ms\n",
        ),
    }
}

async fn metrics(State(state): State<AdminState>) -> Response<axum::body::Body> {
    match state.metrics {
        Some(handle) => Response::builder()
            .header(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")
            .body(axum::body::Body::from(handle.render()))
            .unwrap_or_default(),
        None => Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(axum::body::Body::from(
                "no metrics recorder in this process\n",
            ))
            .unwrap_or_default(),
    }
}

/// Purges expired records every `every`, in batches, until a shutdown.
async fn purge_loop(store: Arc<dyn Store>, every: Duration, token: CancellationToken) {
    const BATCH: usize = 1000;
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let mut purged = 0;
        // Bounded: a store that keeps a backlog finishes it over the next rounds.
        for _ in 0..100 {
            // A shutdown does not wait for a store that hangs.
            let batch = tokio::select! {
                () = token.cancelled() => return,
                batch = store.purge_expired(BATCH) => batch,
            };
            match batch {
                Ok(n) => {
                    purged += n;
                    if n < BATCH {
                        break;
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "purging expired records failed; trying again next round");
                    break;
                }
            }
            if token.is_cancelled() {
                return;
            }
        }
        if purged > 0 {
            tracing::info!(purged, "expired records purged");
        }
    }
}

/// The limits a file could not have set: counts from 1 to a million, timeouts from
/// 100 ms to idem's longest duration.
fn check_limits(limits: &ClientLimits) -> Result<(), ProxyError> {
    let count = |setting, n: usize| match (1..=1_000_000).contains(&n) {
        true => Ok(()),
        false => Err(ProxyError::Limit {
            setting,
            why: "is a number from 1 to 1000000",
        }),
    };
    count("max_connections", limits.max_connections)?;
    count("max_concurrent_requests", limits.max_concurrent_requests)?;
    for (setting, timeout) in [
        ("client_header_timeout", limits.header_timeout),
        ("client_body_timeout", limits.body_timeout),
        ("client_send_timeout", limits.send_timeout),
    ] {
        if !(Duration::from_millis(100)..=idem_core::raw::MAX_DURATION).contains(&timeout) {
            return Err(ProxyError::Limit {
                setting,
                why: "is a duration from 100 ms to 100 years",
            });
        }
    }
    Ok(())
}

/// Whether `upstream` names this machine's `listen` address: the same port, on the same
/// address, on loopback or "any address".
pub(crate) fn points_at(upstream: &http::Uri, listen: SocketAddr) -> bool {
    let Some(authority) = upstream.authority() else {
        return false;
    };
    if authority.port_u16().unwrap_or(80) != listen.port() {
        return false;
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let ip = match host {
        "localhost" => return true,
        other => other.parse::<std::net::IpAddr>(),
    };
    match ip {
        Ok(ip) => {
            ip == listen.ip()
                || ip.is_unspecified()
                || listen.ip().is_unspecified() && ip.is_loopback()
                || ip.is_loopback() && listen.ip().is_loopback()
        }
        // Another machine's name: not resolved here.
        Err(_) => false,
    }
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

    use super::points_at;

    #[test]
    fn an_upstream_on_the_proxys_own_port_is_a_loop() {
        let uri = |u: &str| u.parse::<http::Uri>().unwrap();
        let at = |a: &str| a.parse::<std::net::SocketAddr>().unwrap();
        assert!(points_at(
            &uri("http://127.0.0.1:8080"),
            at("127.0.0.1:8080")
        ));
        assert!(points_at(
            &uri("http://localhost:8080"),
            at("127.0.0.1:8080")
        ));
        assert!(points_at(&uri("http://127.0.0.1:8080"), at("0.0.0.0:8080")));
        assert!(points_at(&uri("http://[::1]:8080"), at("[::1]:8080")));
        assert!(points_at(&uri("http://127.0.0.1"), at("127.0.0.1:80")));
        assert!(!points_at(
            &uri("http://127.0.0.1:8000"),
            at("127.0.0.1:8080")
        ));
        assert!(!points_at(
            &uri("http://10.0.0.7:8080"),
            at("127.0.0.1:8080")
        ));
        assert!(!points_at(
            &uri("http://payments.internal:8080"),
            at("127.0.0.1:8080")
        ));
    }
}
