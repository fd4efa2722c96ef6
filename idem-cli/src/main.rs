//! `idem`: operates an idem store from the command line. See `idem --help`, and the
//! crate's README for the exit codes and the store URLs.
//!
//! ## Where things live
//!
//! - `cli.rs`: the command line (clap); `commands/`: one module per subcommand.
//! - `target.rs`: the backends this binary knows, one line each, and the URL dispatch
//!   (`idem_core::connect`); each backend crate parses its own URLs.
//! - `connect.rs`: opening and migrating; `failure.rs`: what went wrong, its advice and
//!   its exit code; `render.rs`: tables and JSON.

mod cli;
mod commands;
mod connect;
mod failure;
mod render;
mod target;

use std::error::Error;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Usage errors exit with 2 here, with clap's message.
    let cli = cli::Cli::parse();
    if let Some(secret) = &cli.store.log_hash_secret
        && let Err(err) = idem_core::key::set_log_hash_secret(secret.as_bytes())
    {
        eprintln!("idem: --log-hash-secret: {err}");
        return ExitCode::from(failure::code::USAGE);
    }
    // Unkeyed, an 8-digit hash of a scope that holds an account id can be reversed by
    // trying the ids: say so where the hashes go to a metrics system.
    if cli.store.log_hash_secret.is_none()
        && let cli::Command::Stats(stats) = &cli.command
        && stats.prometheus
        && !stats.raw_scope_labels
    {
        eprintln!(
            "idem: warning: scope labels are unkeyed hashes; set IDEM_LOG_HASH_SECRET (the service's log hash secret) so they cannot be reversed by trying account ids"
        );
    }
    // The operator's commands make a few store calls; the proxy serves on every core
    // (or --threads), and logs.
    let threads = match &cli.command {
        cli::Command::Proxy(proxy) => {
            tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_max_level(proxy.log)
                .init();
            proxy.threads.map_or_else(
                || std::thread::available_parallelism().map_or(2, usize::from),
                usize::from,
            )
        }
        _ => {
            // The stores' own warnings (a key skipped as unreadable, by its short hash)
            // are for the operator who ran the command.
            tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
                .without_time()
                .with_target(false)
                .init();
            2
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("idem: could not start the async runtime: {err}");
            return ExitCode::from(failure::code::RETRYABLE);
        }
    };
    let mut stdout = std::io::stdout().lock();
    let result = runtime.block_on(commands::run(cli, &mut stdout));
    // Tasks still running (the proxy's connections cut at its shutdown deadline) end
    // here, without waiting on them for long.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("idem: {}", report(&failure));
            failure.exit_code()
        }
    }
}

/// The error and its causes on one line, each cause once.
fn report(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}
