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
    let mut config = Config::load(&args.config).map_err(|err| Failure::Usage {
        what: err.to_string(),
    })?;
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(admin) = args.admin_listen {
        config.admin_listen = admin;
    }
    // The flag (or IDEM_STORE) wins over the file, as for every other command.
    let url = store_args.store.as_deref().or(config.store.as_deref());
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
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
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
    proxy.run(shutdown_signal()).await.map_err(proxy_failure)
}

fn proxy_failure(err: idem_proxy::ProxyError) -> Failure {
    Failure::Proxy(err)
}

/// SIGTERM (what an orchestrator sends) or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
