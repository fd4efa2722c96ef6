//! # idem-bench
//!
//! idem against the raw native operations, on every backend, with the same client and the
//! same concurrency, alternating the two so machine noise falls on both; and idem-http's
//! layer (memory store) against the bare handler over loopback HTTP. See BENCHMARKS.md.
//!
//! ```sh
//! eval "$(scripts/services.sh start)"
//! cargo run --release -p idem-bench -- --json target/bench.json
//! cargo run --release -p idem-bench -- --quick   # a smoke run, as CI does
//! cargo build --release -p idem-cli -p idem-bench
//! target/release/idem-bench --purge 100000 --backends sqlite,postgres,redis,dynamodb
//! cargo run --release -p idem-bench -- --codec --backends memory,sqlite,postgres
//! ```

mod backends;
mod codec;
mod counting;
mod floor;
mod http;
mod proxy;
mod purge;
mod raw;
mod target;
mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde::Serialize;

use crate::backends::{Backend, Counted};
use crate::target::{BoxError, Done, Target};
use crate::workload::{Sample, Workload};

/// Benchmarks idem against the raw native operations, on every backend.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// A smoke run: few operations, one round.
    #[arg(long)]
    quick: bool,
    /// Rounds per measurement; idem and raw alternate, medians are reported.
    #[arg(long)]
    rounds: Option<usize>,
    /// Operations per round (default depends on the backend).
    #[arg(long)]
    ops: Option<usize>,
    /// Backends to run, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memory,sqlite,postgres,redis,dynamodb,http"
    )]
    backends: Vec<String>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Only measure `idem purge` on this many expired records per backend (SQLite,
    /// PostgreSQL, Redis, DynamoDB of --backends). Quick mode purges 200 after its run.
    #[arg(long, value_name = "RECORDS")]
    purge: Option<usize>,
    /// Only measure what encryption at rest (AES-256-GCM) adds per execute, on memory,
    /// SQLite and PostgreSQL of --backends. Quick mode runs a small one after its run.
    #[arg(long)]
    codec: bool,
    /// The `idem` binary for the purge measurement (default: the one built beside this
    /// benchmark, `cargo build --release -p idem-cli`).
    #[arg(long, value_name = "PATH")]
    idem: Option<PathBuf>,
}

#[derive(Serialize)]
struct Measurement {
    backend: &'static str,
    workload: Workload,
    concurrency: usize,
    ops_per_round: usize,
    rounds: usize,
    idem_ops_per_sec: f64,
    raw_ops_per_sec: f64,
    ratio: f64,
    idem_p50_us: f64,
    idem_p99_us: f64,
    raw_p50_us: f64,
    raw_p99_us: f64,
}

#[derive(Serialize)]
struct Trips {
    backend: &'static str,
    unit: &'static str,
    idem_fresh: f64,
    idem_replay: f64,
    raw_fresh: f64,
    raw_replay: f64,
}

#[derive(Serialize)]
struct MemoryFloor {
    records_per_round: usize,
    pairs_per_sec_one_core: f64,
    pairs_per_sec_16_tasks: f64,
    threads: usize,
}

#[derive(Serialize)]
struct Report {
    cores: usize,
    quick: bool,
    measurements: Vec<Measurement>,
    round_trips: Vec<Trips>,
    memory_floor: Option<MemoryFloor>,
    purge: Vec<purge::PurgeRow>,
    codec: Vec<codec::CodecRow>,
}

fn default_ops(backend: &str, quick: bool) -> usize {
    match (backend, quick) {
        ("memory", false) => 20_000,
        ("memory", true) => 1_000,
        ("dynamodb", false) => 400,
        ("http", false) => 4_000,
        (_, false) => 2_000,
        (_, true) => 64,
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn median(samples: &mut [Sample]) -> &Sample {
    samples.sort_by(|a, b| a.ops_per_sec().total_cmp(&b.ops_per_sec()));
    &samples[samples.len() / 2]
}

/// Round trips per operation, counted on a sequential pass (so nothing is pipelined).
async fn trips_per_op(counted: &Counted, tag: &str, n: usize) -> Result<(f64, f64), BoxError> {
    let target: &Arc<dyn Target> = &counted.target;
    // Warm up: connections made, scripts and statements cached.
    for i in 0..5 {
        target.execute(&format!("{tag}-warm-{i}")).await?;
        target.execute(&format!("{tag}-warm-{i}")).await?;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // A short pause after each operation lets background work of the client (sqlx's
    // release ping) finish on the same connection, instead of the pool opening another.
    let pause = || tokio::time::sleep(Duration::from_millis(2));
    let before = (counted.trips)();
    for i in 0..n {
        let done = target.execute(&format!("{tag}-{i}")).await?;
        pause().await;
        if done != Done::Executed {
            return Err("a fresh key was not executed".into());
        }
    }
    let fresh = ((counted.trips)() - before) as f64 / n as f64;
    let before = (counted.trips)();
    for i in 0..n {
        let done = target.execute(&format!("{tag}-{i}")).await?;
        pause().await;
        if done != Done::Replayed {
            return Err("a completed key was not replayed".into());
        }
    }
    let replay = ((counted.trips)() - before) as f64 / n as f64;
    Ok((fresh, replay))
}

async fn measure(backend: &Backend, args: &Args, report: &mut Report) -> Result<(), BoxError> {
    let ops = args
        .ops
        .unwrap_or_else(|| default_ops(backend.name, args.quick));
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 5 }).max(1);
    let run_id = std::process::id();
    let n = if args.quick { 10 } else { 100 };
    let (idem_fresh, idem_replay) =
        trips_per_op(&backend.idem_counted, &format!("{run_id}-idem-trips"), n).await?;
    let (raw_fresh, raw_replay) =
        trips_per_op(&backend.raw_counted, &format!("{run_id}-raw-trips"), n).await?;
    report.round_trips.push(Trips {
        backend: backend.name,
        unit: backend.trip_unit,
        idem_fresh,
        idem_replay,
        raw_fresh,
        raw_replay,
    });
    for workload in Workload::ALL {
        for concurrency in [1, 16] {
            let (mut idem, mut raw) = (Vec::new(), Vec::new());
            for round in 0..rounds {
                // Alternate which goes first, so drift in the machine's load hits both.
                let order: [(bool, &Arc<dyn Target>); 2] = if round % 2 == 0 {
                    [(true, &backend.idem), (false, &backend.raw)]
                } else {
                    [(false, &backend.raw), (true, &backend.idem)]
                };
                for (is_idem, target) in order {
                    let namespace = format!(
                        "{run_id}-{}-{concurrency}-{round}-{}-",
                        workload.name(),
                        if is_idem { "idem" } else { "raw" }
                    );
                    let sample =
                        workload::run(Arc::clone(target), workload, concurrency, ops, namespace)
                            .await?;
                    if is_idem {
                        idem.push(sample)
                    } else {
                        raw.push(sample)
                    }
                }
            }
            let (idem, raw) = (median(&mut idem).clone(), median(&mut raw).clone());
            let row = Measurement {
                backend: backend.name,
                workload,
                concurrency,
                ops_per_round: ops,
                rounds,
                idem_ops_per_sec: idem.ops_per_sec(),
                raw_ops_per_sec: raw.ops_per_sec(),
                ratio: idem.ops_per_sec() / raw.ops_per_sec(),
                idem_p50_us: micros(idem.percentile(0.50)),
                idem_p99_us: micros(idem.percentile(0.99)),
                raw_p50_us: micros(raw.percentile(0.50)),
                raw_p99_us: micros(raw.percentile(0.99)),
            };
            eprintln!(
                "  {:<9} {:<10} c={:<2} idem {:>9.0}/s raw {:>9.0}/s ratio {:.2}",
                row.backend,
                workload.name(),
                concurrency,
                row.idem_ops_per_sec,
                row.raw_ops_per_sec,
                row.ratio
            );
            report.measurements.push(row);
        }
    }
    Ok(())
}

/// The address of a server-backed backend, or `None` to skip it (an error when
/// `IDEM_REQUIRE_SERVICES=1`).
fn service(variable: &str) -> Result<Option<String>, BoxError> {
    match std::env::var(variable) {
        Ok(value) if !value.is_empty() => Ok(Some(value)),
        _ if std::env::var("IDEM_REQUIRE_SERVICES").is_ok_and(|v| v == "1") => Err(format!(
            "{variable} is not set and IDEM_REQUIRE_SERVICES=1: run scripts/services.sh start"
        )
        .into()),
        _ => {
            eprintln!(
                "!!! SKIPPED: {variable} is not set; start the services with scripts/services.sh start"
            );
            Ok(None)
        }
    }
}

fn print(report: &Report) {
    println!(
        "\nidem-bench: {} cores{}",
        report.cores,
        if report.quick {
            ", quick mode (smoke run, not a measurement)"
        } else {
            ""
        }
    );
    println!(
        "\n| backend | workload | clients | idem ops/s | raw ops/s | idem / raw | idem p50 / p99 (µs) | raw p50 / p99 (µs) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for m in &report.measurements {
        println!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.0} / {:.0} | {:.0} / {:.0} |",
            m.backend,
            m.workload.name(),
            m.concurrency,
            m.idem_ops_per_sec,
            m.raw_ops_per_sec,
            m.ratio,
            m.idem_p50_us,
            m.idem_p99_us,
            m.raw_p50_us,
            m.raw_p99_us
        );
    }
    println!("\n| backend | counted as | idem fresh | idem replay | raw fresh | raw replay |");
    println!("|---|---|---:|---:|---:|---:|");
    for t in &report.round_trips {
        println!(
            "| {} | {} per op | {:.2} | {:.2} | {:.2} | {:.2} |",
            t.backend, t.unit, t.idem_fresh, t.idem_replay, t.raw_fresh, t.raw_replay
        );
    }
    if let Some(floor) = &report.memory_floor {
        println!(
            "\nmemory store, Store level: {:.0} claim+complete pairs/s on one core; {:.0} pairs/s with 16 tasks on distinct keys over {} threads",
            floor.pairs_per_sec_one_core, floor.pairs_per_sec_16_tasks, floor.threads
        );
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut report = Report {
        cores,
        quick: args.quick,
        measurements: Vec::new(),
        round_trips: Vec::new(),
        memory_floor: None,
        purge: Vec::new(),
        codec: Vec::new(),
    };
    let dir = std::env::temp_dir().join(format!("idem-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let idem = match &args.idem {
        Some(path) => path.clone(),
        None if args.purge.is_some() || args.quick => purge::sibling_idem()?,
        None => PathBuf::new(),
    };
    if let Some(records) = args.purge {
        report.purge = purge::run(&args.backends, records, &idem, &dir).await?;
        let _ = std::fs::remove_dir_all(&dir);
        purge::print(&report.purge);
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
            println!("\nJSON written to {}", path.display());
        }
        return Ok(());
    }
    if args.codec {
        report.codec = codec::run(&args.backends, args.quick, &dir).await?;
        let _ = std::fs::remove_dir_all(&dir);
        codec::print(&report.codec);
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
            println!("\nJSON written to {}", path.display());
        }
        return Ok(());
    }
    for name in &args.backends {
        eprintln!("{name}:");
        let backend = match name.as_str() {
            "memory" => backends::memory().await?,
            "http" => backends::http().await?,
            "sqlite" => backends::sqlite(&dir).await?,
            "postgres" => match service("IDEM_TEST_POSTGRES_URL")? {
                Some(url) => backends::postgres(&url).await?,
                None => continue,
            },
            "redis" => match service("IDEM_TEST_REDIS_URL")? {
                Some(url) => backends::redis(&url).await?,
                None => continue,
            },
            "dynamodb" => match service("IDEM_TEST_DYNAMODB_ENDPOINT")? {
                Some(endpoint) => backends::dynamodb(&endpoint).await?,
                None => continue,
            },
            other => return Err(format!("unknown backend {other}").into()),
        };
        measure(&backend, &args, &mut report).await?;
    }
    if args.backends.iter().any(|b| b == "memory") {
        // A working set of 200 000 records per round (a store holding more is slower per
        // pair: the map outgrows the caches), fresh store per round, median of the rounds.
        let (n, rounds) = if args.quick {
            (20_000, 1)
        } else {
            (200_000, 5)
        };
        // The floor runs on runtimes of its own, off this one's threads.
        let floor = tokio::task::spawn_blocking(move || -> Result<MemoryFloor, String> {
            Ok(MemoryFloor {
                records_per_round: n,
                pairs_per_sec_one_core: floor::one_core(n, rounds).map_err(|e| e.to_string())?,
                pairs_per_sec_16_tasks: floor::many_tasks(n, 16, cores, rounds)
                    .map_err(|e| e.to_string())?,
                threads: cores,
            })
        })
        .await??;
        report.memory_floor = Some(floor);
    }
    if args.quick {
        report.purge = purge::run(&args.backends, 200, &idem, &dir).await?;
        report.codec = codec::run(&args.backends, true, &dir).await?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    print(&report);
    if !report.purge.is_empty() {
        purge::print(&report.purge);
    }
    codec::print(&report.codec);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
        println!("\nJSON written to {}", path.display());
    }
    Ok(())
}
