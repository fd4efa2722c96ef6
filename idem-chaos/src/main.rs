//! `idem-chaos`: chaos runs against the durable test servers; see RELIABILITY.md.
//!
//! ```sh
//! eval "$(scripts/services.sh start postgres-durable redis-durable dynamodb-durable)"
//! cargo run --release -p idem-chaos -- --quick            # the bounded run (CI: a debug build)
//! cargo run --release -p idem-chaos -- --long --seed 7    # the long run, replayable by seed
//!
//! # idem-testkit's fault explorer: every single fault on memory and SQLite, sampled
//! # faults on the test servers (IDEM_TEST_* from `scripts/services.sh start`)
//! cargo run --release -p idem-chaos -- explore --backend memory,sqlite
//! cargo run --release -p idem-chaos -- explore --long --backend postgres --seed 7
//!
//! # idem-testkit's linearizability checker through the fault proxy, with crashes
//! cargo run --release -p idem-chaos -- linearizable --quick
//! cargo run --release -p idem-chaos -- linearizable --long --seed 7
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use idem_chaos::backends::Backend;
use idem_chaos::run::{self, Report, Settings};
use idem_chaos::{explore, linearizable};

/// Executes keys through idem while a proxy cuts, delays and blackholes connections and
/// the servers crash; checks every key ends with one result that never changed.
#[derive(Parser, Debug)]
#[command(version, about, args_conflicts_with_subcommands = true)]
struct Args {
    /// Another kind of run; without one, a chaos run.
    #[command(subcommand)]
    command: Option<Command>,
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

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs idem-testkit's systematic fault explorer: faults at every store call and
    /// await point of each scenario (memory and SQLite: every single fault, then sampled
    /// pairs; servers: a seeded sample), then checks every promise.
    Explore(ExploreArgs),
    /// Runs idem-testkit's linearizability checker on the durable servers: concurrent
    /// clients through the fault proxy while the server crashes and revives; every answer
    /// that came back must be explained by the state machine.
    Linearizable(LinearizableArgs),
}

#[derive(clap::Args, Debug)]
struct LinearizableArgs {
    /// Backends, comma separated (their durable servers, as for a chaos run).
    #[arg(long, value_delimiter = ',', default_value = "postgres,redis,dynamodb")]
    backends: Vec<String>,
    /// The seed of the workload and the faults (default: from the clock, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// A short run (3 000 calls per backend, one crash): what CI does.
    #[arg(long, conflicts_with = "long")]
    quick: bool,
    /// A long run (40 000 calls per backend, six crashes).
    #[arg(long)]
    long: bool,
    /// Calls per backend, overriding the mode's (default 10 000).
    #[arg(long)]
    operations: Option<usize>,
    /// Random faults per million requests (default 20 000: one request in 50).
    #[arg(long, default_value_t = 20_000)]
    fault_ppm: u64,
    /// Also write the reports as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

async fn run_linearizable(args: LinearizableArgs) -> ExitCode {
    let seed = args.seed.unwrap_or_else(seed_from_clock);
    let (operations, restarts, crash_every) = if args.quick {
        (3_000, 1, Duration::from_millis(1_500))
    } else if args.long {
        // Spread over the run: 40 000 calls take two to four minutes per backend here.
        (40_000, 6, Duration::from_secs(10))
    } else {
        (10_000, 2, Duration::from_secs(6))
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
        let settings = linearizable::Settings {
            seed,
            operations: args.operations.unwrap_or(operations),
            clients: 8,
            keys: 4,
            fault_ppm: args.fault_ppm,
            restarts,
            crash_every,
        };
        eprintln!(
            "idem-chaos linearizable: {name}, seed {}, {} calls from {} clients on {} keys, {} faults per million requests, {} crash(es) {:?} apart",
            settings.seed,
            settings.operations,
            settings.clients,
            settings.keys,
            settings.fault_ppm,
            settings.restarts,
            settings.crash_every,
        );
        match linearizable::run(backend, &url, settings).await {
            Ok(report) => {
                println!(
                    "{}: {} calls ({} answers lost) in {:.1} s, {} faults (delay {}, refuse {}, blackhole {}, cut after the request {}, cut mid-answer {}), {} restarts; checked in {:.1} s, {} states, the longest search {}",
                    report.backend,
                    report.operations,
                    report.lost,
                    report.record_s,
                    report.faults.total(),
                    report.faults.delay,
                    report.faults.refuse,
                    report.faults.blackhole,
                    report.faults.cut_after_request,
                    report.faults.cut_mid_answer,
                    report.restarts,
                    report.check_s,
                    report.states,
                    report.longest_search,
                );
                if let Some(unexplained) = &report.unexplained {
                    println!("  UNEXPLAINED: {unexplained}");
                }
                if report.restarts == 0 && report.settings.restarts > 0 {
                    println!(
                        "  NO CRASH: the calls ended before the first crash; run more of them"
                    );
                }
                reports.push(report);
            }
            Err(err) => {
                eprintln!("idem-chaos linearizable: the {name} run could not be set up: {err}");
                return ExitCode::FAILURE;
            }
        }
    }
    write_json(args.json.as_deref(), &reports);
    if reports.iter().all(linearizable::Report::passed) {
        println!("idem-chaos linearizable: every answer explained (seed {seed})");
        ExitCode::SUCCESS
    } else {
        eprintln!("idem-chaos linearizable: unexplained histories (seed {seed}, see above)");
        ExitCode::FAILURE
    }
}

fn seed_from_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

fn write_json(path: Option<&std::path::Path>, reports: &impl serde::Serialize) {
    let Some(path) = path else { return };
    match serde_json::to_vec_pretty(reports) {
        Ok(json) => {
            if let Err(err) = std::fs::write(path, json) {
                eprintln!("idem-chaos: could not write {}: {err}", path.display());
            }
        }
        Err(err) => eprintln!("idem-chaos: {err}"),
    }
}

#[derive(clap::Args, Debug)]
struct ExploreArgs {
    /// Backends, comma separated: memory, sqlite, postgres, redis, dynamodb (servers at
    /// IDEM_TEST_POSTGRES_URL, IDEM_TEST_REDIS_URL, IDEM_TEST_DYNAMODB_ENDPOINT).
    #[arg(
        long = "backend",
        value_delimiter = ',',
        default_value = "memory,sqlite"
    )]
    backends: Vec<String>,
    /// Draws the pairs and samples (default: a fixed seed).
    #[arg(long)]
    seed: Option<u64>,
    /// Many more runs: 2 000 pairs per scenario on memory and SQLite, 1 000 sampled runs
    /// on a server.
    #[arg(long)]
    long: bool,
    /// Pairs per scenario (memory, SQLite) or sampled runs (servers), overriding the
    /// defaults (60 and 48; with --long 2 000 and 1 000).
    #[arg(long)]
    runs: Option<usize>,
}

fn run_explore(args: ExploreArgs) -> ExitCode {
    let settings = explore::Settings {
        backends: args.backends,
        seed: args.seed,
        long: args.long,
        runs: args.runs,
    };
    match explore::explore(&settings) {
        Ok(reports) => {
            for report in &reports {
                println!("{report}");
            }
            if reports.iter().all(|report| report.passed()) {
                println!("idem-chaos explore: no violation");
                ExitCode::SUCCESS
            } else {
                eprintln!("idem-chaos explore: violations found (see above)");
                ExitCode::FAILURE
            }
        }
        Err(err) => {
            eprintln!("idem-chaos explore: {err}");
            ExitCode::from(2)
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match args.command {
        // The explorer makes runtimes of its own, on a thread of its own.
        Some(Command::Explore(explore)) => {
            return tokio::task::block_in_place(|| run_explore(explore));
        }
        Some(Command::Linearizable(linearizable)) => {
            return run_linearizable(linearizable).await;
        }
        None => {}
    }
    let seed = args.seed.unwrap_or_else(seed_from_clock);
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
    write_json(args.json.as_deref(), &reports);
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
