//! The configuration file: what it may say, and every way it can be wrong.
//!
//! TOML, read whole before anything listens or connects. A mistake is a [`ConfigError`]
//! naming the file, the line and column, what is wrong and what to write instead.
//!
//! Here: [`Config`], its error and its defaults. Apart: `client_limits` and `route`, the
//! checked settings' types; `file`, the file as written; `values`, single values
//! (durations, addresses, sizes, counts); `check`, `check_route` and `check_scope`, the
//! file, a route and a scope checked.

mod check;
mod check_route;
mod check_scope;
mod client_limits;
mod file;
mod route;
mod values;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use client_limits::ClientLimits;
use file::{File, Locator};
pub use route::{JwtKey, KeyRule, Route, ScopeSource, StatusPolicy};

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

/// What a request that matches no route gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unmatched {
    /// Passed to the upstream, unprotected, as a plain reverse proxy would.
    Pass,
    /// Answered 404 by the proxy; the upstream never sees it.
    Reject,
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
