//! `idem proxy`: the reverse proxy of idem-proxy, on the store the flags or the file name.

use std::io::Write;
use std::sync::Arc;

use idem_core::Store;
use idem_core::connect::{ConnectOptions, Create};
use idem_proxy::{Config, Proxy};

use crate::cli::{ProxyArgs, StoreArgs};
use crate::connect;
use crate::failure::Failure;
use crate::target;

pub(crate) async fn run(
    store_args: &StoreArgs,
    args: &ProxyArgs,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    // Registered first: from the start on, a SIGHUP reloads (or is ignored until the
    // proxy serves), never stops the process.
    let hangups = hangups();
    let mut config = Config::load(&args.config).map_err(|err| Failure::Usage {
        what: err.to_string(),
    })?;
    let store_flag = store_args.store.is_some();
    let overrides = overrides(args.listen, args.admin_listen, store_flag);
    // The flag (or IDEM_STORE) wins over the file, as for every other command.
    let url = store_args.store.clone().or(config.store.clone());
    overrides(&mut config);
    let url = url.as_deref();
    let options = ConnectOptions::default().connections(config.store_connections);
    let target = target::parse_with(
        url,
        store_args.table.as_deref(),
        store_args.prefix.as_deref(),
        options,
    )?;
    let target = &*target;
    if config.migrate {
        let said = connect::migrate(target).await?;
        writeln!(out, "{said}")?;
    }
    let store = target
        .open(Create::No)
        .await
        .map_err(Failure::open(target))?;
    let store: Arc<dyn Store> = store;
    // One recorder per process; the metrics of the layer and the driver go to it too.
    let metrics = idem_proxy::observe::prometheus_builder()
        .and_then(|builder| builder.install_recorder())
        .map_err(|err| Failure::Usage {
            what: format!("cannot install the metrics recorder: {err}"),
        })?;
    // The recorder keeps histograms until they are rendered: without a scraper, this
    // keeps them bounded.
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let proxy = Proxy::bind(config, &args.config, store)
        .await
        .map_err(proxy_failure)?
        .metrics(metrics);
    writeln!(
        out,
        "idem proxy: listening on http://{} (admin on http://{}), store {target}",
        proxy.local_addr(),
        proxy.admin_addr()
    )?;
    out.flush()?;
    if args.check {
        writeln!(
            out,
            "idem proxy: the configuration and the store are fine (--check: not serving)"
        )?;
        return Ok(());
    }
    reload_on_hangup(hangups, proxy.reloader(), overrides);
    proxy.run(shutdown_signal()).await.map_err(proxy_failure)
}

/// What the command line says over the file: where the proxy listens, and whether the
/// store is the flag's (the file's `store` is then not in force, and a reload does not
/// hold a change of it against the file).
fn overrides(
    listen: Option<std::net::SocketAddr>,
    admin_listen: Option<std::net::SocketAddr>,
    store_flag: bool,
) -> impl Fn(&mut Config) + Copy + Send + 'static {
    move |config: &mut Config| {
        if let Some(listen) = listen {
            config.listen = listen;
        }
        if let Some(admin) = admin_listen {
            config.admin_listen = admin;
        }
        if store_flag {
            config.store = None;
        }
    }
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = ();

/// SIGHUP, caught from now on.
fn hangups() -> Hangups {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let caught = signal(SignalKind::hangup()).ok();
        if caught.is_none() {
            eprintln!(
                "idem proxy: SIGHUP cannot be caught here: the configuration reloads only on a restart"
            );
        }
        caught
    }
}

/// SIGHUP reloads the configuration file, with the command line's overrides: routes,
/// upstream and unmatched rule, without dropping a connection. A file that does not
/// parse or build, or that changes a setting read at start, is logged and changes
/// nothing (`idem_proxy_reloads_total{result}` counts both).
fn reload_on_hangup(
    hangups: Hangups,
    reloader: idem_proxy::Reloader,
    overrides: impl Fn(&mut Config) + Copy + Send + 'static,
) {
    #[cfg(unix)]
    if let Some(mut hangups) = hangups {
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                // The reloader logs what it did, and why not.
                let _ = reloader.reload_file(overrides).await;
            }
        });
    }
    #[cfg(not(unix))]
    let _ = (hangups, reloader, overrides);
}

fn proxy_failure(err: idem_proxy::ProxyError) -> Failure {
    Failure::Proxy(err)
}

/// SIGTERM (what an orchestrator sends) or Ctrl-C. A second one stops the process at
/// once, with exit code 143 (SIGTERM) or 130 (Ctrl-C): requests in flight are cut, and
/// their keys stay held until their leases end, when a retry takes over.
async fn shutdown_signal() {
    let mut signals = Signals::new();
    signals.next().await;
    tokio::spawn(async move {
        let code = signals.next().await;
        eprintln!(
            "idem proxy: a second signal: stopping at once; requests in flight are cut, and their keys stay held until their leases end"
        );
        std::process::exit(code);
    });
}

/// The shutdown signals, registered once so that none arriving between two waits is
/// missed.
struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Self {
                term: signal(SignalKind::terminate()).ok(),
                interrupt: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Waits for the next one; answers the exit code a process it stopped would have.
    async fn next(&mut self) -> i32 {
        #[cfg(unix)]
        if let (Some(term), Some(interrupt)) = (&mut self.term, &mut self.interrupt) {
            return tokio::select! {
                _ = term.recv() => 143,
                _ = interrupt.recv() => 130,
            };
        }
        let _ = tokio::signal::ctrl_c().await;
        130
    }
}
