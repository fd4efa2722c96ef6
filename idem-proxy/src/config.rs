//! The configuration file: what it may say, and every way it can be wrong.
//!
//! TOML, read whole before anything listens or connects. A mistake is a [`ConfigError`]
//! naming the file, the line and column, what is wrong and what to write instead.

use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use serde::Deserialize;
use toml::Spanned;

/// The default `shutdown_grace`: 20 s, which with
/// [`DEFAULT_SHUTDOWN_DELAY_ON_KUBERNETES`] ends a shutdown within Kubernetes' default
/// `terminationGracePeriodSeconds` (30 s), before the pod is killed.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// The default `shutdown_delay` under Kubernetes: 5 s of serving after `/readyz` turned
/// 503, while the endpoints drop the terminating pod and the load balancers and proxies
/// that read them catch up (a request sent meanwhile would otherwise find no listener).
/// Elsewhere the default is 0, so that Ctrl-C on a workstation stops at once.
pub const DEFAULT_SHUTDOWN_DELAY_ON_KUBERNETES: Duration = Duration::from_secs(5);

/// The default `shutdown_delay`: [`DEFAULT_SHUTDOWN_DELAY_ON_KUBERNETES`] when the proxy
/// runs in a Kubernetes pod, else none.
fn default_shutdown_delay(on_kubernetes: bool) -> Duration {
    if on_kubernetes {
        DEFAULT_SHUTDOWN_DELAY_ON_KUBERNETES
    } else {
        Duration::ZERO
    }
}

/// The whole configuration of one proxy.
///
/// ```
/// let config = idem_proxy::Config::parse(
///     "idem.toml",
///     r#"
///     upstream = "http://127.0.0.1:8000"
///     store = "sqlite:///tmp/idem-proxy-doc.db"
///
///     [[routes]]
///     methods = ["POST"]
///     path = "/payments"
///     scope = { header = "x-account-id" }
///     "#,
/// )?;
/// assert_eq!(config.routes.len(), 1);
/// assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
/// # Ok::<(), idem_proxy::ConfigError>(())
/// ```
///
/// Its `Debug` hides the password of the store's URL.
#[derive(Clone)]
#[non_exhaustive]
pub struct Config {
    /// Where clients connect (default `127.0.0.1:8080`).
    pub listen: SocketAddr,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (default `127.0.0.1:9464`),
    /// apart from the proxied paths so that no upstream path is shadowed.
    pub admin_listen: SocketAddr,
    /// The service behind the proxy: `http://host:port`, optionally with a path prefix.
    pub upstream: http::Uri,
    /// Speak HTTP/2 to the upstream without upgrade (h2c prior knowledge); HTTP/1.1
    /// otherwise. Clients may speak either to the proxy.
    pub upstream_http2: bool,
    /// How long a connection to the upstream may take (default 2 s).
    pub connect_timeout: Duration,
    /// How long the upstream may take to answer with a response head (default 60 s),
    /// for unmatched requests and every route that sets none of its own
    /// ([`Route::upstream_timeout`]). A request it never answered in time is answered 504
    /// and its key held. On protected routes the body gets it again from its head: a
    /// small answer is read whole within it, a streamed one may pause no longer between
    /// frames; past it the body breaks off and the head decides the key.
    pub upstream_timeout: Duration,
    /// Keep the client's `Host` header (default: the upstream's authority, as nginx's
    /// `proxy_pass` does).
    pub preserve_host: bool,
    /// How long an idle connection to the upstream is kept for reuse (default 1.5 s,
    /// below the keep-alive of common upstream servers, gunicorn's 2 s the shortest: a
    /// request sent on a connection the upstream is closing fails after it may have been
    /// read, and its key is held). Set it below your upstream's.
    pub upstream_idle_timeout: Duration,
    /// Trust the `X-Forwarded-For`, `X-Forwarded-Proto`, `X-Forwarded-Host` and
    /// `Forwarded` headers clients send (default off: they are replaced). Turn it on when
    /// only a load balancer or gateway that sets them can reach the proxy.
    pub trust_forwarded_headers: bool,
    /// How long a shutdown keeps serving after `/readyz` turned 503, so that a load
    /// balancer stops sending first: by default 5 s under Kubernetes (the proxy's
    /// environment has `KUBERNETES_SERVICE_HOST`), whose endpoints take a few seconds to
    /// drop a terminating pod, and 0 elsewhere ([`DEFAULT_SHUTDOWN_DELAY_ON_KUBERNETES`]).
    pub shutdown_delay: Duration,
    /// How long a shutdown waits for requests in flight to finish and store their
    /// answers (default 20 s: with the delay, within Kubernetes' default 30 s
    /// `terminationGracePeriodSeconds`, so that the pod is not killed mid-answer).
    pub shutdown_grace: Duration,
    /// The limits every client is held to, protected route or not.
    pub clients: ClientLimits,
    /// Whether `/readyz` also reads the store (default off): off, it says whether this
    /// replica serves, and a slow shared store does not take every replica out of a
    /// load balancer at once (unprotected traffic with it); watch the store through the
    /// driver's metrics instead. On, a store that fails a read or takes longer than
    /// 800 ms makes the replica unready.
    pub ready_checks_store: bool,
    /// The store's URL, as `idem` takes it; `--store` or `IDEM_STORE` override it.
    pub store: Option<String>,
    /// Create or upgrade the store's schema at start (`idem migrate`); default off.
    pub migrate: bool,
    /// How many connections to the store a pooled backend (PostgreSQL) keeps at most
    /// (default 16): requests beyond it wait for one.
    pub store_connections: u32,
    /// How often expired records are purged by the proxy itself; none by default (run
    /// `idem purge` from a scheduler instead, once for all replicas).
    pub purge_interval: Option<Duration>,
    /// What a request that matches no route gets (default: passed to the upstream
    /// unprotected).
    pub unmatched: Unmatched,
    /// The routes: one naming the request's method wins over one naming none, then the
    /// most specific pattern.
    pub routes: Vec<Route>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("admin_listen", &self.admin_listen)
            .field("upstream", &self.upstream)
            .field("upstream_http2", &self.upstream_http2)
            .field("connect_timeout", &self.connect_timeout)
            .field("upstream_timeout", &self.upstream_timeout)
            .field("preserve_host", &self.preserve_host)
            .field("upstream_idle_timeout", &self.upstream_idle_timeout)
            .field("trust_forwarded_headers", &self.trust_forwarded_headers)
            .field("shutdown_delay", &self.shutdown_delay)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("clients", &self.clients)
            .field("ready_checks_store", &self.ready_checks_store)
            .field("store", &self.store.as_deref().map(without_password))
            .field("migrate", &self.migrate)
            .field("store_connections", &self.store_connections)
            .field("purge_interval", &self.purge_interval)
            .field("unmatched", &self.unmatched)
            .field("routes", &self.routes)
            .finish()
    }
}

/// A URL with its passwords replaced, in its user info and in a `password` query
/// parameter: `postgres://app:***@db/idem`. The user info ends at the last `@` (a
/// password may hold `/`, `?`, `#` or `@`); what cannot be read as a URL is hidden whole
/// past its scheme.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".to_owned();
    };
    let (shown, after) = match rest.rfind('@') {
        Some(at) => {
            let user = match rest[..at].split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => rest[..at].to_owned(),
            };
            (format!("{scheme}://{user}@"), &rest[at + 1..])
        }
        None => (format!("{scheme}://"), rest),
    };
    without_password_parameters(&format!("{shown}{after}"))
}

/// `text` with the value of every `password=` parameter replaced, wherever it stands (a
/// query after an `@` in another parameter is still a query).
fn without_password_parameters(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.to_ascii_lowercase().find("password=") {
        let value = at + "password=".len();
        shown.push_str(&rest[..value]);
        shown.push_str("***");
        let end = rest[value..]
            .find(['&', '#', ' '])
            .map_or(rest.len(), |end| value + end);
        rest = &rest[end..];
    }
    shown.push_str(rest);
    shown
}

/// The limits every client is held to, so that slow, idle or too many clients cannot hold
/// the proxy's connections and memory: what nginx's `client_header_timeout`,
/// `client_body_timeout` and `worker_connections` bound.
///
/// At most `max_concurrent_requests` requests are served at once (protected ones until
/// the server took their answer's last part, others until their answer's head is ready;
/// handlers whose clients went away count until they end), each holding at most its route's
/// `max_request_body` and a stored answer (`max_response_body`, plus 64 KiB of headers)
/// in memory: that product bounds the bodies of protected requests a replica holds.
///
/// ```
/// let config = idem_proxy::Config::parse(
///     "idem.toml",
///     r#"
///     upstream = "http://127.0.0.1:8000"
///     client_header_timeout = "10s"
///     max_connections = 2048
///     "#,
/// )?;
/// assert_eq!(config.clients.header_timeout, std::time::Duration::from_secs(10));
/// assert_eq!(config.clients.max_concurrent_requests, 1024);
/// # Ok::<(), idem_proxy::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientLimits {
    /// How long a client has to send its first bytes, and then each HTTP/1 request's
    /// whole head, counted from the moment its connection opened (so a first head may
    /// take twice it) or its previous answer ended (default 75 s): a silent connection, a slow head (slowloris) and an idle HTTP/1
    /// keep-alive connection are closed alike. HTTP/2 clients are pinged every 30 s and
    /// closed when a ping goes 20 s unanswered. Keep it above the
    /// idle timeout of the load balancer in front (AWS's is 60 s), or the balancer may
    /// send a request on a connection the proxy is closing.
    pub header_timeout: Duration,
    /// How long the proxy waits for the next part of a request body it is reading
    /// (default 60 s; gRPC streams excepted). On a protected route the body is read whole
    /// before anything is claimed: one that stalls is answered 408 and nothing happens.
    /// Elsewhere the body streams to the upstream, which has its start; the stalled
    /// request is cut and answered 408.
    pub body_timeout: Duration,
    /// How long a write to a client may wait (default 60 s): a client that stops reading
    /// its answer is cut, as with nginx's `send_timeout`.
    pub send_timeout: Duration,
    /// How many client connections are open at most (default 4096); past it the proxy
    /// accepts no more until one closes, and new ones wait in the system's backlog.
    pub max_connections: usize,
    /// How many requests are served at once at most (default 1024); past it a request is
    /// answered 503 with `Retry-After`, before any key is claimed.
    pub max_concurrent_requests: usize,
}

impl Default for ClientLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(75),
            body_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(60),
            max_connections: 4096,
            max_concurrent_requests: 1024,
        }
    }
}

/// What a request that matches no route gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unmatched {
    /// Passed to the upstream, unprotected, as a plain reverse proxy would.
    Pass,
    /// Answered 404 by the proxy; the upstream never sees it.
    Reject,
}

/// Whether a route's requests need a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRule {
    /// Refused with 400 without the header.
    Required,
    /// Protected with the header, passed through without it.
    Optional,
    /// Never protected, header or not.
    Exempt,
}

/// Whose key it is: each route's scope names the caller.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ScopeSource {
    /// A request header naming the caller: one an authenticating gateway in front of the
    /// proxy sets (`X-Account-Id`), or an API key. Its value is hashed, never stored.
    Header(HeaderName),
    /// A claim of the bearer token in `Authorization`, verified with a key; the claim's
    /// value is hashed, the token is never stored. A request without a valid token is
    /// refused with 401 before anything is claimed.
    JwtClaim {
        /// The claim (`sub`).
        claim: String,
        /// The verification key and algorithm.
        key: JwtKey,
        /// The audiences a token must name in `aud`, one of them; none: `aud` is not
        /// checked.
        audience: Vec<String>,
        /// The issuer a token must name in `iss`; none: `iss` is not checked.
        issuer: Option<String>,
    },
}

/// How bearer tokens are verified.
#[derive(Clone)]
#[non_exhaustive]
pub enum JwtKey {
    /// HS256, HS384 or HS512 with a shared secret.
    Secret {
        /// The algorithm.
        algorithm: jsonwebtoken::Algorithm,
        /// The secret's bytes.
        secret: Vec<u8>,
    },
    /// RS256/384/512, PS256/384/512, ES256/384 or EdDSA with a public key in PEM.
    PublicKeyPem {
        /// The algorithm.
        algorithm: jsonwebtoken::Algorithm,
        /// The PEM text.
        pem: Vec<u8>,
    },
    /// The keys an identity provider publishes at a JWKS URL, picked by the token's
    /// `kid`: fetched before the proxy serves, refreshed every `refresh` and early when a
    /// token names a key not known yet (at most every 30 s), so a rotation needs no
    /// restart. Each key verifies with its own `alg`, never the token's choice.
    Jwks {
        /// `https://` (this machine's TLS roots) or `http://`.
        url: http::Uri,
        /// How often the set is fetched again (default 5 min).
        refresh: std::time::Duration,
        /// The algorithm of keys that name none (`algorithm` in the file).
        algorithm: Option<jsonwebtoken::Algorithm>,
    },
}

impl fmt::Debug for JwtKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret.
        match self {
            Self::Secret { algorithm, .. } => write!(f, "Secret({algorithm:?})"),
            Self::PublicKeyPem { algorithm, .. } => write!(f, "PublicKeyPem({algorithm:?})"),
            Self::Jwks { url, refresh, .. } => write!(f, "Jwks({url}, every {refresh:?})"),
        }
    }
}

/// Which responses are stored, released or held, by status, over the default policy
/// (`idem_http::default_disposition`: 5xx and 408 held, other 4xx but 402 released, the
/// rest stored).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct StatusPolicy {
    /// Statuses stored and replayed.
    pub store: Vec<StatusCode>,
    /// Statuses whose key is forgotten: nothing happened, a retry runs again.
    pub release: Vec<StatusCode>,
    /// Statuses whose key is held until the lease ends: the effect may have happened.
    pub hold: Vec<StatusCode>,
}

/// One route: which requests, and how they are protected.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Route {
    /// A name for metrics and logs (default: the methods and the path).
    pub name: String,
    /// The methods it matches; empty matches every method, and protects all but GET,
    /// HEAD, OPTIONS and TRACE.
    pub methods: Vec<Method>,
    /// The path pattern: `/payments`, `/orders/{id}/refund`, `/files/{*rest}`.
    pub path: String,
    /// Whether its requests need a key (default required).
    pub key: KeyRule,
    /// The key's header (default `Idempotency-Key`).
    pub header: HeaderName,
    /// Whose key it is. Required where the key is not exempt.
    pub scope: Option<ScopeSource>,
    /// Body fields left out of the fingerprint: a top-level name or a JSON Pointer.
    pub ignore_fields: Vec<String>,
    /// The status policy.
    pub status: StatusPolicy,
    /// Response headers stored and replayed beyond idem-http's defaults
    /// (`idem_http::DEFAULT_STORED_HEADERS`): `x-charge-id`, say.
    pub store_headers: Vec<HeaderName>,
    /// How long the upstream may take to answer this route's requests with a response
    /// head, and (protected routes) to go on with its body (default: the file's
    /// `upstream_timeout`). A route of long uploads or long polls sets its own, and its
    /// lease follows, without raising every route's.
    pub upstream_timeout: Duration,
    /// How long a first request holds its key before a retry may take over (default 60 s).
    pub lease: Duration,
    /// How long answers are kept for retries (default 24 h).
    pub retention: Duration,
    /// The largest request body read to fingerprint it (default 1 MiB); larger is 413.
    pub max_request_body: usize,
    /// The largest response body stored (default 960 KiB); a larger one streams to its
    /// client and is stored without its body.
    pub max_response_body: usize,
    /// How many new keys one scope (caller) may create, per period (default: no limit):
    /// a caller that sends a new key with every retry fills the store, and past its
    /// budget it gets 429 with `Retry-After`, nothing stored. Retries of keys it already
    /// has replay as ever. Counted per replica (`idem_core::driver::TokenBucket`).
    pub key_budget: Option<KeyBudget>,
    /// Where the route starts in the file, for messages.
    pub line: usize,
}

/// A route's budget of new keys per scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyBudget {
    /// New keys at once, and per `per`.
    pub keys: u32,
    /// The period they refill over.
    pub per: Duration,
}

/// A configuration that cannot be used: where, what, and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the configuration file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid, at a place in it.
    #[error("{}:{line}:{column}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// The column, from 1.
        column: usize,
        /// What is wrong and what to write instead.
        message: String,
    },
}

impl Config {
    /// Reads and checks the configuration file at `path`.
    ///
    /// # Errors
    /// [`ConfigError::Read`] when the file cannot be read; [`ConfigError::Invalid`], with
    /// the line, for anything in it that cannot work.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Checks the configuration `text`, as read from `path` (named in messages).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`], with the line, for anything that cannot work.
    pub fn parse(path: impl AsRef<Path>, text: &str) -> Result<Self, ConfigError> {
        let at = Locator {
            path: path.as_ref(),
            text,
        };
        let file: File = toml::from_str(text).map_err(|err| {
            let span = err.span().unwrap_or(0..0);
            at.error(span.clone(), err.message().to_owned())
        })?;
        file.check(&at)
    }
}

/// Turns byte spans into lines and columns of one file.
struct Locator<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Locator<'_> {
    fn error(&self, span: Range<usize>, message: impl Into<String>) -> ConfigError {
        let before = self.text.get(..span.start).unwrap_or(self.text);
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        ConfigError::Invalid {
            path: self.path.to_owned(),
            line,
            column,
            message: message.into(),
        }
    }

    fn line(&self, offset: usize) -> usize {
        self.text
            .get(..offset)
            .unwrap_or(self.text)
            .matches('\n')
            .count()
            + 1
    }
}

// The file as written. Unknown fields are refused: a misspelt setting must not be ignored.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<Spanned<String>>,
    admin_listen: Option<Spanned<String>>,
    upstream: Option<Spanned<String>>,
    #[serde(default)]
    upstream_http2: bool,
    connect_timeout: Option<Spanned<String>>,
    upstream_timeout: Option<Spanned<String>>,
    #[serde(default)]
    preserve_host: bool,
    upstream_idle_timeout: Option<Spanned<String>>,
    #[serde(default)]
    trust_forwarded_headers: bool,
    shutdown_grace: Option<Spanned<String>>,
    shutdown_delay: Option<Spanned<String>>,
    client_header_timeout: Option<Spanned<String>>,
    client_body_timeout: Option<Spanned<String>>,
    client_send_timeout: Option<Spanned<String>>,
    max_connections: Option<Spanned<i64>>,
    max_concurrent_requests: Option<Spanned<i64>>,
    #[serde(default)]
    ready_checks_store: bool,
    store: Option<String>,
    #[serde(default)]
    migrate: bool,
    store_connections: Option<Spanned<i64>>,
    purge_interval: Option<Spanned<String>>,
    unmatched: Option<Spanned<String>>,
    #[serde(default)]
    defaults: Defaults,
    #[serde(default)]
    routes: Vec<Spanned<RouteFile>>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct Defaults {
    key: Option<Spanned<String>>,
    header: Option<Spanned<String>>,
    scope: Option<Spanned<ScopeFile>>,
    ignore_fields: Option<Vec<String>>,
    status: Option<StatusFile>,
    store_headers: Option<Vec<Spanned<String>>>,
    upstream_timeout: Option<Spanned<String>>,
    lease: Option<Spanned<String>>,
    retention: Option<Spanned<String>>,
    max_request_body: Option<Spanned<i64>>,
    max_response_body: Option<Spanned<i64>>,
    key_budget: Option<Spanned<KeyBudgetFile>>,
}

// The settings of `Defaults` again: serde's `flatten` would lose the spans and cannot
// refuse unknown fields.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteFile {
    name: Option<String>,
    #[serde(default)]
    methods: Vec<Spanned<String>>,
    path: Spanned<String>,
    key: Option<Spanned<String>>,
    header: Option<Spanned<String>>,
    scope: Option<Spanned<ScopeFile>>,
    ignore_fields: Option<Vec<String>>,
    status: Option<StatusFile>,
    store_headers: Option<Vec<Spanned<String>>>,
    upstream_timeout: Option<Spanned<String>>,
    lease: Option<Spanned<String>>,
    retention: Option<Spanned<String>>,
    max_request_body: Option<Spanned<i64>>,
    max_response_body: Option<Spanned<i64>>,
    key_budget: Option<Spanned<KeyBudgetFile>>,
}

impl RouteFile {
    fn settings(&self) -> Defaults {
        Defaults {
            key: self.key.clone(),
            header: self.header.clone(),
            scope: self.scope.clone(),
            ignore_fields: self.ignore_fields.clone(),
            status: self.status.clone(),
            store_headers: self.store_headers.clone(),
            upstream_timeout: self.upstream_timeout.clone(),
            lease: self.lease.clone(),
            retention: self.retention.clone(),
            max_request_body: self.max_request_body.clone(),
            max_response_body: self.max_response_body.clone(),
            key_budget: self.key_budget.clone(),
        }
    }
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct KeyBudgetFile {
    keys: i64,
    per: String,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct ScopeFile {
    header: Option<String>,
    jwt_claim: Option<String>,
    algorithm: Option<String>,
    secret_env: Option<String>,
    public_key_pem: Option<String>,
    jwks_url: Option<String>,
    jwks_refresh: Option<String>,
    audience: Option<Vec<String>>,
    issuer: Option<String>,
}

#[derive(Deserialize, Clone, Default)]
#[serde(deny_unknown_fields)]
struct StatusFile {
    #[serde(default)]
    store: Vec<Spanned<u16>>,
    #[serde(default)]
    release: Vec<Spanned<u16>>,
    #[serde(default)]
    hold: Vec<Spanned<u16>>,
}

/// A duration as people write it (`30s`, `24h`, `1h 30m`), at least `min`.
fn duration(
    at: &Locator<'_>,
    name: &str,
    value: Option<&Spanned<String>>,
    default: Duration,
    min: Duration,
) -> Result<Duration, ConfigError> {
    let Some(value) = value else {
        return Ok(default);
    };
    let parsed = humantime::parse_duration(value.get_ref()).map_err(|err| {
        at.error(
            value.span(),
            format!("`{name}`: {err}; write a duration such as \"30s\", \"5m\" or \"24h\""),
        )
    })?;
    if parsed > idem_core::raw::MAX_DURATION {
        return Err(at.error(
            value.span(),
            format!("`{name}` is longer than idem allows (100 years)"),
        ));
    }
    if parsed < min {
        return Err(at.error(
            value.span(),
            format!(
                "`{name}` is {}, under the least that works, {}",
                humantime::format_duration(parsed),
                humantime::format_duration(min)
            ),
        ));
    }
    Ok(parsed)
}

fn address(
    at: &Locator<'_>,
    name: &str,
    value: Option<&Spanned<String>>,
    default: &str,
) -> Result<SocketAddr, ConfigError> {
    let Some(value) = value else {
        return Ok(default.parse().expect("the defaults are addresses"));
    };
    value.get_ref().parse().map_err(|_| {
        at.error(
            value.span(),
            format!(
                "`{name}` = {:?} is not an address and port: write \"127.0.0.1:8080\" (a host name is not resolved here)",
                value.get_ref()
            ),
        )
    })
}

fn bytes(
    at: &Locator<'_>,
    name: &str,
    value: Option<&Spanned<i64>>,
    default: usize,
) -> Result<usize, ConfigError> {
    let Some(value) = value else {
        return Ok(default);
    };
    // At most 1 GiB: a body is held in memory whole to fingerprint or store it.
    usize::try_from(*value.get_ref())
        .ok()
        .filter(|bytes| (1..=1 << 30).contains(bytes))
        .ok_or_else(|| {
            at.error(
                value.span(),
                format!(
                    "`{name}` is a number of bytes from 1 to 1073741824 (1 GiB), such as 1048576"
                ),
            )
        })
}

/// A count from 1 to `most`.
fn count(
    at: &Locator<'_>,
    name: &str,
    value: Option<&Spanned<i64>>,
    default: usize,
    most: usize,
) -> Result<usize, ConfigError> {
    let Some(value) = value else {
        return Ok(default);
    };
    usize::try_from(*value.get_ref())
        .ok()
        .filter(|n| (1..=most).contains(n))
        .ok_or_else(|| {
            at.error(
                value.span(),
                format!("`{name}` is a number from 1 to {most}"),
            )
        })
}

impl File {
    fn client_limits(&self, at: &Locator<'_>) -> Result<ClientLimits, ConfigError> {
        let defaults = ClientLimits::default();
        // A timer shorter than a round trip on a loaded machine would close every
        // connection before its head arrived.
        let least = Duration::from_millis(100);
        Ok(ClientLimits {
            header_timeout: duration(
                at,
                "client_header_timeout",
                self.client_header_timeout.as_ref(),
                defaults.header_timeout,
                least,
            )?,
            body_timeout: duration(
                at,
                "client_body_timeout",
                self.client_body_timeout.as_ref(),
                defaults.body_timeout,
                least,
            )?,
            send_timeout: duration(
                at,
                "client_send_timeout",
                self.client_send_timeout.as_ref(),
                defaults.send_timeout,
                least,
            )?,
            max_connections: count(
                at,
                "max_connections",
                self.max_connections.as_ref(),
                defaults.max_connections,
                1_000_000,
            )?,
            max_concurrent_requests: count(
                at,
                "max_concurrent_requests",
                self.max_concurrent_requests.as_ref(),
                defaults.max_concurrent_requests,
                1_000_000,
            )?,
        })
    }

    fn check(self, at: &Locator<'_>) -> Result<Config, ConfigError> {
        let upstream = self
            .upstream
            .as_ref()
            .ok_or_else(|| at.error(0..0, "`upstream` is missing: write upstream = \"http://127.0.0.1:8000\", the service behind the proxy"))?;
        let uri: http::Uri = upstream.get_ref().parse().map_err(|err| {
            at.error(
                upstream.span(),
                format!("`upstream`: {err}; write \"http://host:port\""),
            )
        })?;
        if uri.scheme_str() != Some("http")
            || uri.authority().is_none_or(|a| a.as_str().contains('@'))
            || uri.query().is_some()
        {
            return Err(at.error(
                upstream.span(),
                "`upstream` must be http://host:port (optionally with a path prefix; no query, no user name): the proxy speaks plain HTTP/1.1 or h2c to the service behind it; put TLS in front of the proxy",
            ));
        }
        let unmatched = match self.unmatched.as_ref().map(|u| (u.get_ref().as_str(), u)) {
            None | Some(("pass", _)) => Unmatched::Pass,
            Some(("reject", _)) => Unmatched::Reject,
            Some((other, spanned)) => {
                return Err(at.error(
                    spanned.span(),
                    format!("`unmatched` = {other:?}: write \"pass\" (to the upstream, unprotected) or \"reject\" (404)"),
                ));
            }
        };
        let listen = address(at, "listen", self.listen.as_ref(), "127.0.0.1:8080")?;
        if uri
            .authority()
            .is_some_and(|a| a.as_str() == listen.to_string())
        {
            return Err(at.error(
                upstream.span(),
                "`upstream` is the proxy's own `listen` address: every request would come back to the proxy",
            ));
        }
        let connect_timeout = duration(
            at,
            "connect_timeout",
            self.connect_timeout.as_ref(),
            Duration::from_secs(2),
            Duration::from_millis(1),
        )?;
        let upstream_timeout = duration(
            at,
            "upstream_timeout",
            self.upstream_timeout.as_ref(),
            Duration::from_secs(60),
            Duration::from_millis(1),
        )?;
        if upstream_timeout <= connect_timeout {
            return Err(at.error(
                self.upstream_timeout.as_ref().map_or(0..0, Spanned::span),
                format!(
                    "`upstream_timeout` ({}) must be longer than `connect_timeout` ({}): it counts from the request's start, connection included",
                    humantime::format_duration(upstream_timeout),
                    humantime::format_duration(connect_timeout)
                ),
            ));
        }
        let mut routes = Vec::with_capacity(self.routes.len());
        for route in &self.routes {
            routes.push(route_of(
                at,
                route,
                &self.defaults,
                (connect_timeout, upstream_timeout),
            )?);
        }
        Ok(Config {
            listen,
            admin_listen: address(
                at,
                "admin_listen",
                self.admin_listen.as_ref(),
                "127.0.0.1:9464",
            )?,
            upstream: uri,
            upstream_http2: self.upstream_http2,
            connect_timeout,
            upstream_timeout,
            preserve_host: self.preserve_host,
            upstream_idle_timeout: duration(
                at,
                "upstream_idle_timeout",
                self.upstream_idle_timeout.as_ref(),
                Duration::from_millis(1500),
                Duration::from_millis(1),
            )?,
            trust_forwarded_headers: self.trust_forwarded_headers,
            shutdown_grace: duration(
                at,
                "shutdown_grace",
                self.shutdown_grace.as_ref(),
                DEFAULT_SHUTDOWN_GRACE,
                Duration::ZERO,
            )?,
            shutdown_delay: duration(
                at,
                "shutdown_delay",
                self.shutdown_delay.as_ref(),
                default_shutdown_delay(std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()),
                Duration::ZERO,
            )?,
            clients: self.client_limits(at)?,
            ready_checks_store: self.ready_checks_store,
            store: self.store.filter(|s| !s.trim().is_empty()),
            migrate: self.migrate,
            store_connections: match &self.store_connections {
                None => 16,
                Some(value) => u32::try_from(*value.get_ref())
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| {
                        at.error(
                            value.span(),
                            "`store_connections` is a number from 1 to 1000",
                        )
                    })?,
            },
            purge_interval: match &self.purge_interval {
                None => None,
                Some(value) => Some(duration(
                    at,
                    "purge_interval",
                    Some(value),
                    Duration::ZERO,
                    Duration::from_secs(1),
                )?),
            },
            unmatched,
            routes,
        })
    }
}

fn route_of(
    at: &Locator<'_>,
    spanned: &Spanned<RouteFile>,
    defaults: &Defaults,
    (connect_timeout, upstream_timeout): (Duration, Duration),
) -> Result<Route, ConfigError> {
    let route = spanned.get_ref();
    let line = at.line(spanned.span().start);
    let own = &route.settings();
    let pick = |a: &Option<Spanned<String>>, b: &Option<Spanned<String>>| a.clone().or(b.clone());

    let mut methods = Vec::new();
    for method in &route.methods {
        let parsed = Method::from_bytes(method.get_ref().to_ascii_uppercase().as_bytes())
            .map_err(|_| at.error(method.span(), format!("{:?} is not an HTTP method: write \"POST\", \"PUT\", \"PATCH\" or \"DELETE\"", method.get_ref())))?;
        methods.push(parsed);
    }
    let path = route.path.get_ref();
    if !path.starts_with('/') {
        return Err(at.error(
            route.path.span(),
            format!("`path` = {path:?} must start with `/`: write \"/payments\", \"/orders/{{id}}/refund\" or \"/files/{{*rest}}\""),
        ));
    }
    // The pattern's syntax is checked by the matcher, here with the route's own line.
    matchit::Router::<()>::new()
        .insert(path.as_str(), ())
        .map_err(|err| at.error(route.path.span(), format!("`path` = {path:?}: {err}; parameters are written {{name}}, a rest of path {{*name}}")))?;

    let key = match pick(&own.key, &defaults.key) {
        None => KeyRule::Required,
        Some(value) => match value.get_ref().as_str() {
            "required" => KeyRule::Required,
            "optional" => KeyRule::Optional,
            "exempt" => KeyRule::Exempt,
            other => {
                return Err(at.error(
                    value.span(),
                    format!("`key` = {other:?}: write \"required\", \"optional\" or \"exempt\""),
                ));
            }
        },
    };
    let header = match pick(&own.header, &defaults.header) {
        None => idem_http::DEFAULT_HEADER,
        Some(value) => {
            let name = HeaderName::from_bytes(value.get_ref().as_bytes()).map_err(|_| {
                at.error(
                    value.span(),
                    format!("`header` = {:?} is not a header name", value.get_ref()),
                )
            })?;
            // A credential as the key would put it in the store and in every replay.
            if [
                http::header::AUTHORIZATION,
                http::header::COOKIE,
                http::header::PROXY_AUTHORIZATION,
            ]
            .contains(&name)
            {
                return Err(at.error(
                    value.span(),
                    format!(
                        "`header` = {:?} carries credentials, not an idempotency key: use \"Idempotency-Key\"",
                        value.get_ref()
                    ),
                ));
            }
            name
        }
    };
    let mut store_headers = Vec::new();
    for name in own
        .store_headers
        .as_ref()
        .or(defaults.store_headers.as_ref())
        .into_iter()
        .flatten()
    {
        let parsed = HeaderName::from_bytes(name.get_ref().as_bytes()).map_err(|_| {
            at.error(
                name.span(),
                format!(
                    "{:?} in `store_headers` is not a header name",
                    name.get_ref()
                ),
            )
        })?;
        if parsed == http::header::SET_COOKIE {
            return Err(at.error(
                name.span(),
                "`set-cookie` is never stored: a replay would hand the first caller's session to whoever retries",
            ));
        }
        store_headers.push(parsed);
    }
    let scope = match own.scope.clone().or(defaults.scope.clone()) {
        None if key == KeyRule::Exempt => None,
        None => {
            return Err(at.error(
                spanned.span(),
                format!("route `{path}` has no `scope`: say whose key it is, with scope = {{ header = \"x-account-id\" }} (a header your gateway sets after authenticating) or scope = {{ jwt_claim = \"sub\", secret_env = \"JWT_SECRET\" }}; without one, one caller's retry could replay another's response"),
            ));
        }
        Some(scope) => Some(scope_of(at, &scope)?),
    };
    let status = own
        .status
        .clone()
        .or(defaults.status.clone())
        .unwrap_or_default();
    let mut policy = StatusPolicy::default();
    for (list, into) in [
        (&status.store, &mut policy.store),
        (&status.release, &mut policy.release),
        (&status.hold, &mut policy.hold),
    ] {
        for code in list {
            let parsed = StatusCode::from_u16(*code.get_ref())
                .ok()
                .filter(|s| (100..600).contains(&s.as_u16()))
                .ok_or_else(|| {
                    at.error(
                        code.span(),
                        format!("{} is not an HTTP status", code.get_ref()),
                    )
                })?;
            into.push(parsed);
        }
    }
    for code in &policy.store {
        if policy.release.contains(code) || policy.hold.contains(code) {
            return Err(at.error(
                spanned.span(),
                format!("status {code} is in more than one of `status.store`, `status.release` and `status.hold`: keep it in one"),
            ));
        }
    }
    if let Some(code) = policy.release.iter().find(|c| policy.hold.contains(c)) {
        return Err(at.error(
            spanned.span(),
            format!("status {code} is in both `status.release` and `status.hold`: keep it in one"),
        ));
    }
    let own_timeout = pick(&own.upstream_timeout, &defaults.upstream_timeout);
    let upstream_timeout = duration(
        at,
        "upstream_timeout",
        own_timeout.as_ref(),
        upstream_timeout,
        connect_timeout.saturating_add(Duration::from_millis(1)),
    )?;
    let lease = duration(
        at,
        "lease",
        pick(&own.lease, &defaults.lease).as_ref(),
        Duration::from_secs(60).max(upstream_timeout),
        Duration::from_millis(100),
    )?;
    // An exempt route claims nothing: its lease and retention are never used.
    let exempt = key == KeyRule::Exempt;
    if lease < upstream_timeout && !exempt {
        let value = pick(&own.lease, &defaults.lease);
        return Err(at.error(
            value.map_or(spanned.span(), |v| v.span()),
            format!(
                "route `{path}`: `lease` ({}) is shorter than `upstream_timeout` ({}): after the proxy gives up on a request the upstream may still run it, and a retry could run it again once the lease ends; make the lease at least `upstream_timeout`, and longer than the upstream's slowest answer",
                humantime::format_duration(lease),
                humantime::format_duration(upstream_timeout)
            ),
        ));
    }
    let retention_value = pick(&own.retention, &defaults.retention);
    let retention = duration(
        at,
        "retention",
        retention_value.as_ref(),
        Duration::from_secs(24 * 3600),
        Duration::from_secs(1),
    )?;
    if retention <= lease && !exempt {
        return Err(at.error(
            retention_value.map_or(spanned.span(), |v| v.span()),
            format!(
                "route `{path}`: `retention` ({}) must be longer than `lease` ({}): an answer must outlive the lease that produced it",
                humantime::format_duration(retention),
                humantime::format_duration(lease)
            ),
        ));
    }
    let name = route.name.clone().unwrap_or_else(|| {
        let methods: Vec<&str> = methods.iter().map(Method::as_str).collect();
        if methods.is_empty() {
            path.clone()
        } else {
            format!("{} {path}", methods.join(","))
        }
    });
    Ok(Route {
        name,
        methods,
        path: path.clone(),
        key,
        header,
        scope,
        ignore_fields: own
            .ignore_fields
            .clone()
            .or(defaults.ignore_fields.clone())
            .unwrap_or_default(),
        status: policy,
        store_headers,
        upstream_timeout,
        lease,
        retention,
        max_request_body: bytes(
            at,
            "max_request_body",
            own.max_request_body
                .as_ref()
                .or(defaults.max_request_body.as_ref()),
            idem_http::DEFAULT_MAX_REQUEST_BODY,
        )?,
        max_response_body: bytes(
            at,
            "max_response_body",
            own.max_response_body
                .as_ref()
                .or(defaults.max_response_body.as_ref()),
            idem_http::DEFAULT_MAX_RESPONSE_BODY,
        )?,
        key_budget: match own.key_budget.as_ref().or(defaults.key_budget.as_ref()) {
            None => None,
            Some(budget) => Some(key_budget(at, budget)?),
        },
        line,
    })
}

fn key_budget(
    at: &Locator<'_>,
    spanned: &Spanned<KeyBudgetFile>,
) -> Result<KeyBudget, ConfigError> {
    let budget = spanned.get_ref();
    let keys = u32::try_from(budget.keys)
        .ok()
        .filter(|keys| *keys >= 1)
        .ok_or_else(|| {
            at.error(
                spanned.span(),
                "`key_budget.keys` is a number of new keys from 1 to 4294967295, such as 100",
            )
        })?;
    let per = humantime::parse_duration(&budget.per)
        .ok()
        .filter(|per| (Duration::from_secs(1)..=idem_core::raw::MAX_DURATION).contains(per))
        .ok_or_else(|| {
            at.error(
                spanned.span(),
                format!(
                    "`key_budget.per` = {:?}: write a period from 1 s, such as \"1m\" or \"1h\"",
                    budget.per
                ),
            )
        })?;
    Ok(KeyBudget { keys, per })
}

/// The keys of a JWKS URL: `algorithm` only for keys that name none.
fn jwks_key(
    at: &Locator<'_>,
    span: &Range<usize>,
    scope: &ScopeFile,
) -> Result<JwtKey, ConfigError> {
    let text = scope.jwks_url.as_deref().unwrap_or_default();
    let url: http::Uri = text
        .parse()
        .ok()
        .filter(|url: &http::Uri| {
            let loopback = url.host().is_some_and(|host| {
                host == "localhost"
                    || host
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            });
            // Keys fetched in clear could be swapped on the way: plain HTTP only from
            // this machine (a local mirror).
            url.authority().is_some()
                && (url.scheme_str() == Some("https")
                    || url.scheme_str() == Some("http") && loopback)
        })
        .ok_or_else(|| {
            at.error(
                span.clone(),
                format!(
                    "`jwks_url` = {text:?}: write the provider's https://.../.well-known/jwks.json (plain http only on this machine)"
                ),
            )
        })?;
    // A provider's key set signs every tenant's tokens (Firebase, Entra's common keys):
    // only the issuer tells this deployment's from another's.
    if scope.issuer.as_deref().is_none_or(str::is_empty) {
        return Err(at.error(
            span.clone(),
            "a `jwks_url` scope needs `issuer`: the provider signs other tenants' tokens with the same keys, and only `iss` tells yours apart; write issuer = \"https://id.example/\" as your tokens name it (and `audience`, your API's)",
        ));
    }
    let refresh = match &scope.jwks_refresh {
        None => Duration::from_secs(300),
        Some(text) => humantime::parse_duration(text)
            .ok()
            .filter(|refresh| (Duration::from_secs(1)..=Duration::from_secs(7 * 24 * 3600)).contains(refresh))
            .ok_or_else(|| {
                at.error(span.clone(), format!("`jwks_refresh` = {text:?}: write a period from 1 s to 7 days, such as \"5m\""))
            })?,
    };
    let algorithm = match &scope.algorithm {
        None => None,
        Some(text) => Some(
            text.parse::<jsonwebtoken::Algorithm>()
                .ok()
                .filter(|algorithm| {
                    !matches!(
                        algorithm,
                        jsonwebtoken::Algorithm::HS256
                            | jsonwebtoken::Algorithm::HS384
                            | jsonwebtoken::Algorithm::HS512
                    )
                })
                .ok_or_else(|| {
                    at.error(span.clone(), format!("`algorithm` = {text:?} for a JWKS's keys without `alg`: write RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384 or EdDSA (a shared secret never comes from a public key set)"))
                })?,
        ),
    };
    Ok(JwtKey::Jwks {
        url,
        refresh,
        algorithm,
    })
}

fn scope_of(at: &Locator<'_>, spanned: &Spanned<ScopeFile>) -> Result<ScopeSource, ConfigError> {
    let scope = spanned.get_ref();
    let span = spanned.span();
    match (&scope.header, &scope.jwt_claim) {
        (Some(header), None) => {
            if scope.algorithm.is_some()
                || scope.secret_env.is_some()
                || scope.public_key_pem.is_some()
                || scope.jwks_url.is_some()
                || scope.jwks_refresh.is_some()
                || scope.audience.is_some()
                || scope.issuer.is_some()
            {
                return Err(at.error(span.clone(), "a header scope takes no `algorithm`, `secret_env`, `public_key_pem`, `jwks_url`, `jwks_refresh`, `audience` or `issuer`"));
            }
            let name = HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
                at.error(span.clone(), format!("scope header {header:?} is not a header name"))
            })?;
            if name == http::header::AUTHORIZATION {
                return Err(at.error(span.clone(), "scope = { header = \"authorization\" } would put a new scope on every refreshed token (a retry after a refresh would run again): use scope = { jwt_claim = \"sub\", ... } to scope by the verified subject"));
            }
            Ok(ScopeSource::Header(name))
        }
        (None, Some(claim)) => {
            let algorithm_text = scope.algorithm.as_deref().unwrap_or("HS256");
            let algorithm: jsonwebtoken::Algorithm = algorithm_text.parse().map_err(|_| {
                at.error(span.clone(), format!("`algorithm` = {algorithm_text:?}: write HS256, HS384, HS512, RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384 or EdDSA"))
            })?;
            let hmac = matches!(
                algorithm,
                jsonwebtoken::Algorithm::HS256
                    | jsonwebtoken::Algorithm::HS384
                    | jsonwebtoken::Algorithm::HS512
            );
            if scope.jwks_refresh.is_some() && scope.jwks_url.is_none() {
                return Err(at.error(span.clone(), "`jwks_refresh` goes with `jwks_url`"));
            }
            let key = match (&scope.secret_env, &scope.public_key_pem, hmac) {
                (None, None, _) if scope.jwks_url.is_some() => jwks_key(at, &span, scope)?,
                _ if scope.jwks_url.is_some() => {
                    return Err(at.error(span.clone(), "a scope's keys come from one place: `jwks_url`, `public_key_pem` or `secret_env`"));
                }
                (Some(var), None, true) => {
                    let secret = std::env::var(var).map_err(|_| {
                        at.error(span.clone(), format!("`secret_env` names {var}, which is not set in the proxy's environment: export it (the secret never goes in this file)"))
                    })?;
                    // As long as the hash's output (RFC 7518, section 3.2).
                    let least = match algorithm {
                        jsonwebtoken::Algorithm::HS384 => 48,
                        jsonwebtoken::Algorithm::HS512 => 64,
                        _ => 32,
                    };
                    if secret.len() < least {
                        return Err(at.error(span.clone(), format!("the secret in {var} is {} bytes: an {algorithm_text} secret needs at least {least}", secret.len())));
                    }
                    JwtKey::Secret {
                        algorithm,
                        secret: secret.into_bytes(),
                    }
                }
                (None, Some(file), false) => {
                    let pem = std::fs::read(file).map_err(|err| {
                        at.error(span.clone(), format!("cannot read `public_key_pem` {file}: {err}"))
                    })?;
                    let parsed = crate::scope::decoding_key(algorithm, &pem).map(drop);
                    parsed.map_err(|err| {
                        at.error(span.clone(), format!("`public_key_pem` {file} is not a {algorithm_text} public key in PEM: {err}"))
                    })?;
                    JwtKey::PublicKeyPem { algorithm, pem }
                }
                _ if hmac => {
                    return Err(at.error(span.clone(), format!("{algorithm_text} tokens are verified with a secret: write secret_env = \"JWT_SECRET\", an environment variable holding it")));
                }
                _ => {
                    return Err(at.error(span.clone(), format!("{algorithm_text} tokens are verified with a public key: write public_key_pem = \"/etc/idem/jwt.pem\"")));
                }
            };
            if claim.is_empty() {
                return Err(at.error(span.clone(), "`jwt_claim` is empty: name the claim that names the caller, usually \"sub\""));
            }
            if scope
                .audience
                .as_ref()
                .is_some_and(|a| a.is_empty() || a.iter().any(String::is_empty))
            {
                return Err(at.error(span.clone(), "`audience` lists the audiences a token may name, none of them empty; leave it out not to check `aud`"));
            }
            Ok(ScopeSource::JwtClaim {
                claim: claim.clone(),
                key,
                audience: scope.audience.clone().unwrap_or_default(),
                issuer: scope.issuer.clone().filter(|i| !i.is_empty()),
            })
        }
        _ => Err(at.error(
            span,
            "a scope is either { header = \"x-account-id\" } or { jwt_claim = \"sub\", secret_env = \"JWT_SECRET\" }, exactly one of them",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::without_password;

    #[test]
    fn a_pod_waits_for_its_endpoints_to_drop_it_and_a_workstation_does_not() {
        use std::time::Duration;
        assert_eq!(super::default_shutdown_delay(true), Duration::from_secs(5));
        assert_eq!(super::default_shutdown_delay(false), Duration::ZERO);
    }

    #[test]
    fn a_store_urls_password_is_hidden() {
        assert_eq!(
            without_password("postgres://app:s3cret@db:5432/idem?sslmode=require"),
            "postgres://app:***@db:5432/idem?sslmode=require"
        );
        assert_eq!(
            without_password("redis://:p%40ss@127.0.0.1:6379/0"),
            "redis://:***@127.0.0.1:6379/0"
        );
        assert_eq!(
            without_password("postgres://app@db/idem"),
            "postgres://app@db/idem"
        );
        assert_eq!(
            without_password("postgres://app:pa/ss@db/idem"),
            "postgres://app:***@db/idem"
        );
        assert_eq!(
            without_password("postgres://app@db/idem?sslmode=require&password=s3cret"),
            "postgres://app@db/idem?sslmode=require&password=***"
        );
        assert_eq!(
            without_password("postgres://app:pa?ss#w@db/idem"),
            "postgres://app:***@db/idem"
        );
        assert_eq!(without_password("not a url"), "***");
        assert_eq!(
            without_password("postgres://db/idem?password=s3cret&application_name=a@b"),
            "postgres://db/idem?password=***&application_name=a@b"
        );
    }
}
