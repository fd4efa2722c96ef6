//! Reloading the configuration while serving (`idem proxy` does on SIGHUP): the routes,
//! the upstream and the unmatched rule are built anew and swapped in between two
//! requests. No connection is dropped, requests in flight finish on what they started
//! with, and a file that does not build changes nothing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use idem_core::Store;
use idem_http::Handlers;

use crate::config::{Config, Unmatched};
use crate::observe;
use crate::routes::{RouteError, Routes};
use crate::server::{ProxyError, Shared};
use crate::upstream::Upstream;

/// What a reload replaces: the routes and the upstream they forward to.
pub(crate) struct Live {
    pub(crate) routes: Routes,
    pub(crate) upstream: Upstream,
    pub(crate) unmatched: Unmatched,
    /// The key headers of the routes: a request with one that matches no route is
    /// counted, since its key protects nothing.
    pub(crate) key_headers: Vec<http::HeaderName>,
}

impl Live {
    /// Builds what `config` says over `store`, its JWKS fetched (tokens are verified
    /// from the first request on) and refreshed from then on.
    pub(crate) async fn build(
        config: &Config,
        config_path: &Path,
        store: &Arc<dyn Store>,
    ) -> Result<Self, ProxyError> {
        if config.upstream_timeout.is_zero()
            || config
                .routes
                .iter()
                .any(|route| route.upstream_timeout.is_zero())
        {
            return Err(ProxyError::Limit {
                setting: "upstream_timeout",
                why: "is at least 1 ms: zero would answer every request 504 and hold its key",
            });
        }
        let upstream = Upstream::new(config)?;
        let routes = Routes::new(config, config_path, store, &upstream)?;
        for (route, jwks) in &routes.jwks {
            jwks.fetch().await.map_err(|source| RouteError::Jwks {
                route: route.clone(),
                source: Box::new(source),
            })?;
        }
        for (_, jwks) in &routes.jwks {
            jwks.spawn_refresh();
        }
        let mut key_headers = vec![idem_http::DEFAULT_HEADER];
        for route in &config.routes {
            if !key_headers.contains(&route.header) {
                key_headers.push(route.header.clone());
            }
        }
        Ok(Self {
            routes,
            upstream,
            unmatched: config.unmatched,
            key_headers,
        })
    }
}

/// Reloads a running [`Proxy`](crate::Proxy)'s configuration; from
/// [`Proxy::reloader`](crate::Proxy::reloader), cloned freely.
///
/// A reload applies the routes, the upstream's settings (`upstream`, its timeouts,
/// `upstream_http2`, `preserve_host`, `trust_forwarded_headers`,
/// `upstream_idle_timeout`) and `unmatched`. The settings read when the proxy started
/// (where it listens, the store, the client limits, readiness, the purge and the
/// shutdown timings) need a restart: a file that changes one is refused, and nothing
/// changes. What a reload resets: each route's `key_budget` counts, the keys held after
/// a 5xx that this replica remembers (a retry is told to come back in a second, as on
/// another replica), and upstream connections (new ones are opened; the old ones close
/// when their requests end). Every JWKS is fetched again, one after the other: a
/// provider that cannot be reached fails the reload (within its fetch timeout each),
/// and the running configuration stays.
///
/// ```no_run
/// use std::sync::Arc;
/// use idem_core::{MemoryStore, Store};
/// use idem_proxy::{Config, Proxy};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// let proxy = Proxy::bind(Config::load("idem.toml")?, "idem.toml", store).await?;
/// let reloader = proxy.reloader();
/// tokio::spawn(async move {
///     // Whenever the file changed (a signal, a watcher, an admin command):
///     match reloader.reload(Config::load("idem.toml").unwrap()).await {
///         Ok(reloaded) => println!("{} routes", reloaded.routes),
///         Err(err) => eprintln!("kept the running configuration: {err}"),
///     }
/// });
/// proxy.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Reloader {
    pub(crate) shared: Arc<Shared>,
    pub(crate) running: Arc<tokio::sync::Mutex<Config>>,
    pub(crate) config_path: PathBuf,
    pub(crate) listen: SocketAddr,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("config_path", &self.config_path)
            .finish_non_exhaustive()
    }
}

/// What a reload applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reloaded {
    /// How many routes the proxy serves now.
    pub routes: usize,
}

impl Reloader {
    /// Applies `config` (read from the file the proxy started with, with the same
    /// command-line overrides) to the running proxy: its routes, upstream and unmatched
    /// rule are built, their JWKS fetched, and swapped in at once. Requests in flight
    /// finish on the routes they started on; a shutdown waits for their handlers too.
    /// One reload runs at a time.
    ///
    /// # Errors
    /// [`ProxyError::NeedsRestart`] when `config` changes a setting read at start;
    /// the errors of [`Proxy::bind`](crate::Proxy::bind) when it does not build (a
    /// route, the upstream, a JWKS that cannot be fetched). Either way the running
    /// configuration stays, whole.
    pub async fn reload(&self, config: Config) -> Result<Reloaded, ProxyError> {
        let mut running = self.running.lock().await;
        self.reload_locked(&mut running, config).await
    }

    async fn reload_locked(
        &self,
        running: &mut Config,
        config: Config,
    ) -> Result<Reloaded, ProxyError> {
        let outcome = self.apply(running, &config).await;
        observe::reload(outcome.is_ok());
        match outcome {
            Ok(reloaded) => {
                *running = config;
                tracing::info!(
                    routes = reloaded.routes,
                    "reloaded the configuration; requests in flight finish on the one they began with"
                );
                Ok(reloaded)
            }
            Err(err) => {
                tracing::error!(error = %err, "the configuration was not reloaded; the running one stays");
                Err(err)
            }
        }
    }

    /// Reads the file the proxy started with again, lets `overrides` apply what the
    /// command line said at start (a `--listen`, say), and [reloads](Self::reload) it.
    ///
    /// # Errors
    /// A file that does not parse ([`ProxyError::Route`] with the
    /// [`ConfigError`](crate::ConfigError), naming the line), and those of
    /// [`reload`](Self::reload). Either way the running configuration stays, whole.
    pub async fn reload_file(
        &self,
        overrides: impl FnOnce(&mut Config) + Send,
    ) -> Result<Reloaded, ProxyError> {
        // Read under the lock: of two reloads, the later one applies the later file.
        let mut running = self.running.lock().await;
        match Config::load(&self.config_path) {
            Ok(mut config) => {
                overrides(&mut config);
                self.reload_locked(&mut running, config).await
            }
            Err(err) => {
                observe::reload(false);
                let err = ProxyError::Route(RouteError::Config(err));
                tracing::error!(error = %err, "the configuration was not reloaded; the running one stays");
                Err(err)
            }
        }
    }

    async fn apply(&self, running: &Config, config: &Config) -> Result<Reloaded, ProxyError> {
        if let Some(setting) = needs_restart(running, config) {
            return Err(ProxyError::NeedsRestart { setting });
        }
        if crate::server::points_at(&config.upstream, self.listen) {
            return Err(ProxyError::Loop {
                upstream: config.upstream.clone(),
                listen: self.listen,
            });
        }
        let live = Live::build(config, &self.config_path, &self.shared.store).await?;
        let routes = config.routes.len();
        let old = self.shared.live.swap(Arc::new(live));
        self.shared.retire(&old);
        Ok(Reloaded { routes })
    }
}

/// The first setting read at start that `config` changes, by its name in the file.
fn needs_restart(running: &Config, config: &Config) -> Option<&'static str> {
    let changed: [(&'static str, bool); 10] = [
        ("listen", running.listen != config.listen),
        ("admin_listen", running.admin_listen != config.admin_listen),
        ("store", running.store != config.store),
        (
            "store_connections",
            running.store_connections != config.store_connections,
        ),
        ("migrate", running.migrate != config.migrate),
        (
            "purge_interval",
            running.purge_interval != config.purge_interval,
        ),
        ("client limits", running.clients != config.clients),
        (
            "ready_checks_store",
            running.ready_checks_store != config.ready_checks_store,
        ),
        (
            "shutdown_delay",
            running.shutdown_delay != config.shutdown_delay,
        ),
        (
            "shutdown_grace",
            running.shutdown_grace != config.shutdown_grace,
        ),
    ];
    changed
        .into_iter()
        .find_map(|(setting, changed)| changed.then_some(setting))
}

/// The handlers of routes a reload replaced, still counted and waited for.
#[derive(Default)]
pub(crate) struct Retired {
    handlers: Mutex<Vec<(Weak<Live>, Handlers)>>,
}

impl Retired {
    pub(crate) fn add(&self, live: &Arc<Live>) {
        let mut retired = self.lock();
        // Forgotten once nothing runs on them and no request holds their routes, from
        // which a handler could still be detached (its client going away).
        retired.retain(|(live, handlers)| live.strong_count() > 0 || handlers.running() > 0);
        retired.extend(
            live.routes
                .handlers
                .iter()
                .map(|handlers| (Arc::downgrade(live), handlers.clone())),
        );
    }

    pub(crate) fn all(&self) -> Vec<Handlers> {
        self.lock()
            .iter()
            .map(|(_, handlers)| handlers.clone())
            .collect()
    }

    pub(crate) fn orphaned(&self) -> usize {
        self.lock()
            .iter()
            .map(|(_, handlers)| handlers.orphaned())
            .sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Weak<Live>, Handlers)>> {
        self.handlers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
