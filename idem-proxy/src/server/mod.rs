//! The proxy as a server: its two listeners, its requests, its shutdown.
//!
//! Here the proxy is bound and run. Beside it: `requests` answers every
//! proxied request, `access_log` writes its line, `admin` serves `/readyz` and
//! `/metrics`, `purge` purges expired records, and `bind_checks` refuses what cannot
//! work before anything is served.

mod access_log;
mod admin;
mod bind_checks;
mod purge;
mod requests;

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::Router;
use axum::routing::get;
use idem_core::Store;
use idem_http::Handlers;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::clients;
use crate::config::{ClientLimits, Config};
use crate::reload::{Live, Reloader, Retired};
use crate::routes::RouteError;
use crate::upstream::BadUpstream;

use admin::{AdminState, metrics, readyz};
use bind_checks::check_limits;
pub(crate) use bind_checks::points_at;
use purge::purge_loop;
use requests::ProxyService;

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
