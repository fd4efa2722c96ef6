//! # idem-bench
//!
//! idem against the raw native operations, on every backend, with the same client and the
//! same concurrency, alternating the two so machine noise falls on both; and idem-http's
//! layer (memory store) against the bare handler over loopback HTTP. See BENCHMARKS.md.
//!
//! ```sh
//! eval "$(scripts/services.sh start)"
//! cargo run --release -p idem-bench -- --json target/bench.json
//! cargo run --release -p idem-bench -- --quick   # a smoke run (CI: a debug build)
//! cargo build --release -p idem-cli -p idem-bench
//! target/release/idem-bench --purge 100000 --backends sqlite,postgres,redis,dynamodb
//! cargo run --release -p idem-bench -- --codec --backends memory,sqlite,postgres
//! cargo run --release -p idem-bench -- --dynamodb-capacity --backends dynamodb
//! cargo run --release -p idem-bench -- --churn 10000000 --churn-seconds 600
//! ```
//!
//! ## Where things live
//!
//! - `workload.rs`: the workloads and their timing; `target.rs`: what a workload drives;
//!   `backends.rs`: each backend set up for idem and for the raw baseline, `raw/` the raw
//!   operations; `report.rs`: what a run measured and its printing; `charts.rs`: the SVG
//!   charts.
//! - Segments of their own: `server.rs` (server time per operation), `floor.rs` (the
//!   memory store's floor), `http.rs` (the HTTP layer), `codec.rs` (encryption),
//!   `purge.rs` (`idem purge`), `scaling.rs` (10^4 to 10^7 records, with operators'
//!   calls), `capacity.rs` (DynamoDB's capacity units per call), `churn.rs` (PostgreSQL
//!   with claims, completions and the purge at once); `proxy.rs` and
//!   `counting.rs` count round trips.

mod backends;
mod capacity;
mod charts;
mod churn;
mod codec;
mod counting;
mod floor;
mod http;
mod proxy;
mod purge;
mod raw;
mod report;
mod reverse_proxy;
mod scaling;
mod server;
mod slow_clients;
mod target;
mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use crate::backends::{Backend, Counted};
use crate::report::{HarnessCheck, Measurement, MemoryFloor, Report, ServerRow, Trips, print};
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
    /// Seconds per round: clients start operations until the time is up (default 1; quick
    /// mode 0.05).
    #[arg(long)]
    seconds: Option<f64>,
    /// Backends to run, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memory,sqlite,postgres,redis,dynamodb,http"
    )]
    backends: Vec<String>,
    /// Workloads to run, comma separated (default: all four).
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// Client counts to run, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    clients: Vec<usize>,
    /// Only the scaling run: claim and replay with this many records already in the store
    /// (comma separated, grown in order), and purge_expired with half of them expired.
    #[arg(long, value_delimiter = ',', value_name = "RECORDS")]
    scaling: Vec<u64>,
    /// The most records DynamoDB Local is seeded to in the scaling run.
    #[arg(long, default_value_t = 100_000)]
    scaling_dynamodb_max: u64,
    /// Write SVG charts of the results into this directory.
    #[arg(long, value_name = "DIR")]
    charts: Option<PathBuf>,
    /// Only redraw the charts (into --charts DIR) from these saved JSON reports, comma
    /// separated; for a backend in several, the last one's figures are drawn.
    #[arg(long, value_delimiter = ',', value_name = "JSON", requires = "charts")]
    redraw: Vec<PathBuf>,
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
    /// Only measure `idem proxy` against calling the upstream directly and against nginx
    /// (when installed), fresh and replayed, on the SQLite, PostgreSQL and Redis of
    /// --backends. Quick mode runs a small one, on SQLite, after its run.
    #[arg(long)]
    reverse_proxy: bool,
    /// Only measure the driver's own cost on the memory store (the last lines of a run with
    /// the memory backend): 200 000 keys per round, --rounds rounds (default 5).
    #[arg(long)]
    driver_floor: bool,
    /// Only measure `idem proxy`'s memory (its resident set and peak) with its default
    /// limits while this many slow clients hold connections: heads that never end, then
    /// protected bodies half sent and stalled; on SQLite. Quick mode runs 200.
    #[arg(long, value_name = "CLIENTS")]
    slow_clients: Option<usize>,
    /// Only measure DynamoDB's consumed capacity and latency per store call, fresh and
    /// replayed, with the default claim and with claims that read first, for stored
    /// results of 36 bytes to 350 KB (DynamoDB of --backends). Quick mode runs a small
    /// one after its run.
    #[arg(long)]
    dynamodb_capacity: bool,
    /// Only the PostgreSQL churn run: seed this many completed records whose expiries are
    /// spread over twice --churn-seconds, then run 16 clients executing fresh keys and a
    /// purger together, sampling the table (sizes, dead rows, autovacuum runs, expired
    /// records waiting) and the clients' latency. Quick mode runs a small one after its run.
    #[arg(long, value_name = "RECORDS")]
    churn: Option<u64>,
    /// How long the churn run lasts.
    #[arg(long, value_name = "SECONDS", default_value_t = 600.0)]
    churn_seconds: f64,
    /// How often the churn run samples.
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
    churn_sample: f64,
    /// The churn run without its purger: the same claims on the same table with no
    /// deletes, to compare with.
    #[arg(long)]
    churn_without_purge: bool,
    /// The `idem` binary for the purge and reverse proxy measurements (default: the one
    /// built beside this benchmark, `cargo build --release -p idem-cli` for a release
    /// build).
    #[arg(long, value_name = "PATH")]
    idem: Option<PathBuf>,
    /// An earlier build of `idem` whose operator commands the scaling run times too, for a
    /// before and after on the same records.
    #[arg(long, value_name = "PATH")]
    idem_before: Option<PathBuf>,
    /// The longest an operator command of the scaling run may take before it is stopped.
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0)]
    operator_limit: f64,
}

/// Completed keys prepared per target for the replay and mixed workloads (replays cycle
/// over them).
fn pool_size(backend: &str, quick: bool) -> usize {
    match (backend, quick) {
        (_, true) => 64,
        ("memory", false) => 50_000,
        ("dynamodb", false) => 1_000,
        (_, false) => 5_000,
    }
}

/// The `idem` binaries whose operator commands the scaling run times.
fn operator_binaries(args: &Args, idem: &std::path::Path) -> scaling::OperatorBinaries {
    scaling::OperatorBinaries {
        after: Some(idem.to_path_buf()),
        before: args.idem_before.clone(),
        limit: Duration::from_secs_f64(args.operator_limit.max(0.1)),
    }
}

/// Seconds per timed round.
fn round_seconds(args: &Args) -> f64 {
    args.seconds
        .unwrap_or(if args.quick { 0.05 } else { 1.0 })
        .max(0.001)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn median(samples: &mut [Sample]) -> &Sample {
    samples.sort_by(|a, b| a.ops_per_sec().total_cmp(&b.ops_per_sec()));
    &samples[samples.len() / 2]
}

/// Round trips per operation, counted on a sequential pass (so nothing is pipelined).
/// Per operation, fresh and replay: round trips, and bytes each way when proxied.
type TripsPerOp = ((f64, f64), (Option<(f64, f64)>, Option<(f64, f64)>));

async fn trips_per_op(counted: &Counted, tag: &str, n: usize) -> Result<TripsPerOp, BoxError> {
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
    let bytes = || counted.bytes.as_ref().map(|proxy| proxy.bytes());
    let per_op = |before: Option<(u64, u64)>, after: Option<(u64, u64)>| {
        before
            .zip(after)
            .map(|(b, a)| ((a.0 - b.0) as f64 / n as f64, (a.1 - b.1) as f64 / n as f64))
    };
    let (before, bytes_before) = ((counted.trips)(), bytes());
    for i in 0..n {
        let done = target.execute(&format!("{tag}-{i}")).await?;
        pause().await;
        if done != Done::Executed {
            return Err("a fresh key was not executed".into());
        }
    }
    let fresh = ((counted.trips)() - before) as f64 / n as f64;
    let fresh_bytes = per_op(bytes_before, bytes());
    let (before, bytes_before) = ((counted.trips)(), bytes());
    for i in 0..n {
        let done = target.execute(&format!("{tag}-{i}")).await?;
        pause().await;
        if done != Done::Replayed {
            return Err("a completed key was not replayed".into());
        }
    }
    let replay = ((counted.trips)() - before) as f64 / n as f64;
    let replay_bytes = per_op(bytes_before, bytes());
    Ok(((fresh, replay), (fresh_bytes, replay_bytes)))
}

async fn measure(backend: &Backend, args: &Args, report: &mut Report) -> Result<(), BoxError> {
    let seconds = round_seconds(args);
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 5 }).max(1);
    let run_id = std::process::id();
    let n = if args.quick { 10 } else { 100 };
    let ((idem_fresh, idem_replay), (idem_fresh_bytes, idem_replay_bytes)) =
        trips_per_op(&backend.idem_counted, &format!("{run_id}-idem-trips"), n).await?;
    let ((raw_fresh, raw_replay), (raw_fresh_bytes, raw_replay_bytes)) =
        trips_per_op(&backend.raw_counted, &format!("{run_id}-raw-trips"), n).await?;
    report.round_trips.push(Trips {
        backend: backend.name,
        unit: backend.trip_unit,
        idem_fresh,
        idem_replay,
        raw_fresh,
        raw_replay,
        idem_fresh_bytes,
        idem_replay_bytes,
        raw_fresh_bytes,
        raw_replay_bytes,
    });
    let pool = pool_size(backend.name, args.quick);
    let idem_pool = workload::prepare(&backend.idem, &format!("{run_id}-idem-pool-"), pool).await?;
    let raw_pool = workload::prepare(&backend.raw, &format!("{run_id}-raw-pool-"), pool).await?;
    let workloads: Vec<Workload> = Workload::ALL
        .into_iter()
        .filter(|w| args.workloads.is_empty() || args.workloads.iter().any(|n| n == w.name()))
        .collect();
    for &workload in &workloads {
        for &concurrency in &args.clients {
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
                    let pool = if is_idem { &idem_pool } else { &raw_pool };
                    let sample = workload::run(
                        Arc::clone(target),
                        workload,
                        concurrency,
                        Duration::from_secs_f64(seconds),
                        Arc::clone(pool),
                        namespace,
                    )
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
                seconds_per_round: seconds,
                ops: idem.ops,
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
    let duration = Duration::from_secs_f64(seconds);
    if backend.server.is_some() || backend.server_cpu.is_some() {
        for workload in [Workload::Fresh, Workload::Replay] {
            let sides = [
                ("idem", &backend.idem, &idem_pool),
                ("raw", &backend.raw, &raw_pool),
            ];
            for (side, target, pool) in sides {
                // One segment per round; the median segment (by the server's figure) is kept.
                let mut segments = Vec::new();
                for round in 0..rounds {
                    let namespace = format!("{run_id}-server-{}-{side}-{round}-", workload.name());
                    segments.push(
                        server_segment(backend, side, target, pool, workload, duration, namespace)
                            .await?,
                    );
                }
                segments.sort_by(|a, b| {
                    let figure = |row: &ServerRow| {
                        row.micros_per_op
                            .or(row.server_cpu_micros_per_op)
                            .unwrap_or(0.0)
                    };
                    figure(a).total_cmp(&figure(b))
                });
                let middle = segments.len() / 2;
                report.server_time.push(segments.swap_remove(middle));
            }
        }
    }
    if let Some(plain) = &backend.plain {
        let (mut plain_rates, mut harness_rates) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let ops = plain.replays(16, duration, Arc::clone(&raw_pool)).await?;
            plain_rates.push(ops as f64 / seconds);
            let namespace = format!("{run_id}-check-{round}-");
            let sample = workload::run(
                Arc::clone(&backend.raw),
                Workload::Replay,
                16,
                duration,
                Arc::clone(&raw_pool),
                namespace,
            )
            .await?;
            harness_rates.push(sample.ops_per_sec());
        }
        report.harness_check.push(HarnessCheck {
            backend: backend.name,
            plain_ops_per_sec: median_of(&mut plain_rates),
            harness_raw_ops_per_sec: median_of(&mut harness_rates),
        });
    }
    Ok(())
}

/// One timed segment at 16 clients with the server's accounting read before and after.
async fn server_segment(
    backend: &Backend,
    side: &'static str,
    target: &Arc<dyn Target>,
    pool: &Arc<Vec<String>>,
    workload: Workload,
    duration: Duration,
    namespace: String,
) -> Result<ServerRow, BoxError> {
    if let Some(clock) = &backend.server {
        clock.reset().await?;
    }
    let server_cpu_before = match &backend.server_cpu {
        Some(clock) => Some(clock.cpu_micros()?),
        None => None,
    };
    let cpu_before = server::own_cpu_micros()?;
    let sample = workload::run(
        Arc::clone(target),
        workload,
        16,
        duration,
        Arc::clone(pool),
        namespace,
    )
    .await?;
    let client_cpu = server::own_cpu_micros()? - cpu_before;
    let server_cpu = match (&backend.server_cpu, server_cpu_before) {
        (Some(clock), Some(before)) => Some(clock.cpu_micros()? - before),
        _ => None,
    };
    let reading = match &backend.server {
        Some(clock) => Some(clock.read().await?),
        None => None,
    };
    let ops = sample.ops.max(1) as f64;
    Ok(ServerRow {
        backend: backend.name,
        workload,
        side,
        source: backend.server.as_ref().map_or("-", |clock| clock.source()),
        ops: sample.ops,
        micros_per_op: reading.as_ref().map(|r| r.micros / ops),
        server_cpu_micros_per_op: server_cpu.map(|micros| micros / ops),
        client_cpu_micros_per_op: client_cpu / ops,
        parts: reading
            .map(|r| r.parts)
            .unwrap_or_default()
            .into_iter()
            .take(4)
            .map(|(name, calls, micros)| (name, calls as f64 / ops, micros / ops))
            .collect(),
    })
}

fn median_of(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
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

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut report = Report {
        cores,
        quick: args.quick,
        measurements: Vec::new(),
        round_trips: Vec::new(),
        server_time: Vec::new(),
        harness_check: Vec::new(),
        memory_floor: None,
        purge: Vec::new(),
        codec: Vec::new(),
        scaling: scaling::ScaleReport::default(),
        reverse_proxy: Vec::new(),
        slow_clients: Vec::new(),
        dynamodb_capacity: Vec::new(),
        churn: None,
    };
    let dir = std::env::temp_dir().join(format!("idem-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let idem = match &args.idem {
        Some(path) => path.clone(),
        None if args.purge.is_some()
            || args.reverse_proxy
            || args.slow_clients.is_some()
            || args.quick
            || !args.scaling.is_empty() =>
        {
            purge::sibling_idem()?
        }
        None => PathBuf::new(),
    };
    if !args.redraw.is_empty() {
        let dir = args
            .charts
            .as_deref()
            .ok_or("--redraw needs --charts DIR")?;
        std::fs::create_dir_all(dir)?;
        for path in charts::redraw(dir, &args.redraw)? {
            println!("chart written to {}", path.display());
        }
        return Ok(());
    }
    if args.driver_floor {
        let rounds = args.rounds.unwrap_or(5);
        let driver = tokio::task::spawn_blocking(move || {
            floor::driver(200_000, rounds).map_err(|e| e.to_string())
        })
        .await??;
        floor::print_driver(&driver);
        return Ok(());
    }
    if let Some(records) = args.purge {
        report.purge = purge::run(&args.backends, records, &idem, &dir).await?;
        let _ = std::fs::remove_dir_all(&dir);
        purge::print(&report.purge);
        return finish(&args, &report);
    }
    if args.reverse_proxy {
        let stores = proxy_stores(&args.backends, &dir)?;
        let rounds = args.rounds.unwrap_or(3).max(1);
        let seconds = args.seconds.unwrap_or(3.0).max(0.01);
        report.reverse_proxy =
            reverse_proxy::run(&idem, &stores, &args.clients, seconds, rounds, &dir).await?;
        drop_proxy_tables(&stores).await;
        let _ = std::fs::remove_dir_all(&dir);
        reverse_proxy::print(&report.reverse_proxy);
        return finish(&args, &report);
    }
    if let Some(clients) = args.slow_clients {
        report.slow_clients = slow_clients::run(&idem, clients.max(1), &dir).await?;
        let _ = std::fs::remove_dir_all(&dir);
        slow_clients::print(&report.slow_clients);
        return finish(&args, &report);
    }
    if args.dynamodb_capacity {
        if args.backends.iter().any(|b| b == "dynamodb") {
            report.dynamodb_capacity = capacity::run(args.rounds.unwrap_or(200).max(1)).await?;
        }
        capacity::print(&report.dynamodb_capacity);
        return finish(&args, &report);
    }
    if let Some(records) = args.churn {
        report.churn = churn::run(
            records,
            args.churn_seconds,
            args.churn_sample,
            !args.churn_without_purge,
        )
        .await?;
        churn::print(&report.churn);
        return finish(&args, &report);
    }
    if args.codec {
        report.codec = codec::run(&args.backends, args.quick, &dir).await?;
        let _ = std::fs::remove_dir_all(&dir);
        codec::print(&report.codec);
        return finish(&args, &report);
    }
    if !args.scaling.is_empty() {
        report.scaling = scaling::run(
            &args.backends,
            &args.scaling,
            args.scaling_dynamodb_max,
            round_seconds(&args),
            if args.quick { 200 } else { 100_000 },
            &dir,
            &operator_binaries(&args, &idem),
        )
        .await?;
        let _ = std::fs::remove_dir_all(&dir);
        scaling::print(&report.scaling);
        return finish(&args, &report);
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
                fingerprint_ns: floor::fingerprint_ns(1_000_000, rounds),
                driver: floor::driver(n, rounds).map_err(|e| e.to_string())?,
            })
        })
        .await??;
        report.memory_floor = Some(floor);
    }
    if args.quick {
        report.purge = purge::run(&args.backends, 200, &idem, &dir).await?;
        report.codec = codec::run(&args.backends, true, &dir).await?;
        // A tiny scaling run, so the seeding and the purge measurement cannot rot.
        let seconds = round_seconds(&args);
        report.scaling = scaling::run(
            &args.backends,
            &[1_000, 10_000],
            1_000,
            seconds,
            200,
            &dir,
            &operator_binaries(&args, &idem),
        )
        .await?;
        // And the proxy on SQLite, so that its benchmark cannot rot either.
        let sqlite = proxy_stores(&["sqlite".to_owned()], &dir)?;
        report.reverse_proxy =
            reverse_proxy::run(&idem, &sqlite, &[1, 16], seconds, 1, &dir).await?;
        report.slow_clients = slow_clients::run(&idem, 200, &dir).await?;
        if args.backends.iter().any(|b| b == "dynamodb") {
            report.dynamodb_capacity = capacity::run(3).await?;
        }
        if args.backends.iter().any(|b| b == "postgres") {
            report.churn = churn::run(2_000, 1.0, 0.25, true).await?;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    print(&report);
    if !report.purge.is_empty() {
        purge::print(&report.purge);
    }
    codec::print(&report.codec);
    scaling::print(&report.scaling);
    reverse_proxy::print(&report.reverse_proxy);
    slow_clients::print(&report.slow_clients);
    capacity::print(&report.dynamodb_capacity);
    churn::print(&report.churn);
    finish(&args, &report)
}

/// Drops the PostgreSQL tables the proxy's benchmark made (`--table` after a postgres URL).
async fn drop_proxy_tables(stores: &[(String, Vec<String>)]) {
    for (name, flags) in stores {
        if name != "postgres" {
            continue;
        }
        let (Some(url), Some(table)) = (flags.get(1), flags.get(3)) else {
            continue;
        };
        if let Ok(pool) = sqlx::PgPool::connect(url).await {
            let drop = format!("DROP TABLE IF EXISTS \"{table}\"");
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
                .execute(&pool)
                .await;
        }
    }
}

/// The stores `idem proxy` runs on in its benchmark: the `idem` flags naming each, for
/// SQLite, PostgreSQL and Redis among `backends`.
fn proxy_stores(
    backends: &[String],
    dir: &std::path::Path,
) -> Result<Vec<(String, Vec<String>)>, BoxError> {
    let run = std::process::id();
    let mut stores = Vec::new();
    for name in backends {
        let flags = match name.as_str() {
            "sqlite" => vec![
                "--store".to_owned(),
                format!("sqlite://{}", dir.join("proxy.db").display()),
            ],
            "postgres" => match service("IDEM_TEST_POSTGRES_URL")? {
                Some(url) => vec![
                    "--store".to_owned(),
                    url,
                    "--table".to_owned(),
                    format!("idem_bench_proxy_{run}"),
                ],
                None => continue,
            },
            "redis" => match service("IDEM_TEST_REDIS_URL")? {
                Some(url) => vec![
                    "--store".to_owned(),
                    url,
                    "--prefix".to_owned(),
                    format!("idem-bench-proxy-{run}:"),
                ],
                None => continue,
            },
            _ => continue,
        };
        stores.push((name.clone(), flags));
    }
    Ok(stores)
}

/// Writes the JSON report and the charts, where asked for.
fn finish(args: &Args, report: &Report) -> Result<(), BoxError> {
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(report)?)?;
        println!("\nJSON written to {}", path.display());
    }
    if let Some(dir) = &args.charts {
        std::fs::create_dir_all(dir)?;
        let written = charts::write(dir, &report.measurements, &report.scaling)?;
        for path in written {
            println!("chart written to {}", path.display());
        }
    }
    Ok(())
}
