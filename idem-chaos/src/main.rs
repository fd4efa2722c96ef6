//! `idem-chaos`: chaos runs against the durable test servers; see RELIABILITY.md.
//!
//! ```sh
//! eval "$(scripts/services.sh start postgres-durable redis-durable dynamodb-durable)"
//! cargo run --release -p idem-chaos -- --quick            # the bounded run CI does
//! cargo run --release -p idem-chaos -- --long --seed 7    # the long run, replayable by seed
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use idem_chaos::backends::Backend;
use idem_chaos::run::{self, Report, Settings};

/// Executes keys through idem while a proxy cuts, delays and blackholes connections and
/// the servers crash; checks every key ends with one result that never changed.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Backends to run, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "postgres,redis,dynamodb")]
    backends: Vec<String>,
    /// The seed of every random choice (default: from the clock, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// A short run (8 s per backend, one crash): what CI does.
    #[arg(long, conflicts_with = "long")]
    quick: bool,
    /// A long run (120 s per backend, six crashes).
    #[arg(long)]
    long: bool,
    /// Concurrent workers (default 16).
    #[arg(long)]
    workers: Option<usize>,
    /// The most distinct keys a run creates (default 4 000; quick 400, long 20 000).
    #[arg(long)]
    keys: Option<usize>,
    /// Random faults per million requests (default 20 000: one request in 50).
    #[arg(long, default_value_t = 20_000)]
    fault_ppm: u64,
    /// The driver's lease, in milliseconds (default 1 000).
    #[arg(long, default_value_t = 1_000)]
    lease_ms: u64,
    /// Also write the reports as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let (duration, restarts, workers, keys) = if args.quick {
        (Duration::from_secs(8), 1, 8, 400)
    } else if args.long {
        (Duration::from_secs(120), 6, 16, 20_000)
    } else {
        (Duration::from_secs(30), 2, 16, 4_000)
    };
    let mut reports = Vec::new();
    for name in &args.backends {
        let Some(backend) = Backend::parse(name) else {
            eprintln!("idem-chaos: unknown backend {name} (postgres, redis, dynamodb)");
            return ExitCode::from(2);
        };
        let url = match backend.url() {
            Ok(url) => url,
            Err(err) => {
                eprintln!("idem-chaos: {err}");
                return ExitCode::from(2);
            }
        };
        let settings = Settings {
            seed,
            workers: args.workers.unwrap_or(workers),
            keys: args.keys.unwrap_or(keys),
            duration,
            restarts,
            fault_ppm: args.fault_ppm,
            lease: Duration::from_millis(args.lease_ms.max(3)),
        };
        eprintln!("idem-chaos: {name}, seed {seed}, {settings:?}");
        match run::run(backend, &url, settings).await {
            Ok(report) => {
                print(&report);
                reports.push(report);
            }
            Err(err) => {
                eprintln!("idem-chaos: the {name} run could not be set up: {err}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(path) = &args.json {
        match serde_json::to_vec_pretty(&reports) {
            Ok(json) => {
                if let Err(err) = std::fs::write(path, json) {
                    eprintln!("idem-chaos: could not write {}: {err}", path.display());
                }
            }
            Err(err) => eprintln!("idem-chaos: {err}"),
        }
    }
    let failed: Vec<_> = reports.iter().filter(|r| !r.passed()).collect();
    if failed.is_empty() {
        println!("idem-chaos: every check passed (seed {seed})");
        ExitCode::SUCCESS
    } else {
        for report in failed {
            eprintln!(
                "idem-chaos: {} FAILED (seed {seed}): rerun with --backends {} --seed {seed}",
                report.backend, report.backend
            );
        }
        ExitCode::FAILURE
    }
}

fn print(r: &Report) {
    println!(
        "{backend}: {ops} operations in {secs:.1} s, {faults} faults {f:?}, {restarts} restarts",
        backend = r.backend,
        ops = r.operations,
        secs = r.elapsed_s,
        faults = r.faults.total(),
        f = r.faults,
        restarts = r.restarts,
    );
    println!("  outcomes: {:?}", r.outcomes);
    for sample in &r.error_samples {
        println!("  error seen: {sample}");
    }
    println!(
        "  executions {} on {} keys; run more than once: {} keys, {} duplicates ({} lease lost mid-work, {} result never stored)",
        r.executions,
        r.keys,
        r.keys_run_more_than_once,
        r.duplicate_executions,
        r.duplicates_lease_lost_mid_work,
        r.duplicates_result_never_stored,
    );
    println!(
        "  completed after the faults: {}; unexplained overlaps {}, changed results {}, lost results {}, keys without a result {}",
        r.completed_after_faults,
        r.unexplained_overlaps,
        r.changed_results,
        r.lost_results,
        r.keys_without_result,
    );
}
