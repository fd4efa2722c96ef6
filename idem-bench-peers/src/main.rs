//! idem against its peers on one Redis.
//!
//! Each system runs trivial work once per key (fresh) or returns its stored result
//! (replay), at 1 and 16 clients, in timed segments. Within a round every system runs each
//! cell once, in an order that rotates from round to round, so drift in the machine's
//! load falls on all of them; each system's throughput is read against the raw loop's in
//! the same rounds. Redis's own time per execution comes from `INFO commandstats` (top-level
//! commands only: a script's inner calls are inside its figure) and its process CPU from
//! `INFO cpu`, read around each segment.
//!
//! ```sh
//! eval "$(scripts/services.sh start redis)"
//! cargo run --release --ignore-rust-version --manifest-path idem-bench-peers/Cargo.toml -- \
//!     --redis "$IDEM_TEST_REDIS_URL" --rounds 3
//! ```

mod report;
mod rounds;
mod server_time;
mod systems;

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use redis::aio::ConnectionManager;

use crate::report::{Cell, Measured};
use crate::rounds::Workload;
use crate::server_time::Counters;
use crate::systems::{BoxError, IdemSystem, PeerSystem, RawSystem, System};

#[derive(Parser, Debug)]
#[command(about = "idem against the `idempotent` crate and a raw loop, on one Redis")]
struct Args {
    /// The Redis to run against (127.0.0.1 only: it is written to and its statistics read).
    #[arg(
        long,
        env = "IDEM_TEST_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    redis: String,
    /// Rounds per cell; each system runs once per round.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds per segment.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Client counts.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16])]
    clients: Vec<usize>,
    /// Workloads.
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = [Workload::Fresh, Workload::Replay])]
    workloads: Vec<Workload>,
    /// Keys completed before the first round, per system, for the replays.
    #[arg(long, default_value_t = 5000)]
    pool: usize,
    /// Write every segment as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Only these systems (for profiling one): idem, idempotent, raw.
    #[arg(long, value_delimiter = ',', default_values_t = ["idem".to_owned(), "idempotent".to_owned(), "raw".to_owned()])]
    systems: Vec<String>,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    if args.rounds == 0 || args.seconds <= 0.0 || args.pool == 0 || args.clients.contains(&0) {
        return Err("--rounds, --seconds, --pool and every --clients must be above zero".into());
    }
    let run = std::process::id();
    let systems: Vec<Arc<dyn System>> = vec![
        Arc::new(IdemSystem::connect(&args.redis, &format!("peers{run}:idem:")).await?),
        Arc::new(PeerSystem::connect(&args.redis, &format!("peers{run}-idempotent")).await?),
        Arc::new(RawSystem::connect(&args.redis, &format!("peers{run}:raw:")).await?),
    ];
    let systems: Vec<Arc<dyn System>> = systems
        .into_iter()
        .filter(|system| args.systems.iter().any(|name| name == system.name()))
        .collect();
    if systems.is_empty() {
        return Err("--systems names none of idem, idempotent, raw".into());
    }
    let stats = ConnectionManager::new(redis::Client::open(args.redis.as_str())?).await?;
    let version: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut stats.clone())
        .await?;
    let version = version
        .lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    eprintln!(
        "Redis {version} at {}; {} rounds of {} s",
        args.redis, args.rounds, args.seconds
    );

    if args.workloads.contains(&Workload::Replay) {
        for system in &systems {
            rounds::prepare(Arc::clone(system), args.pool).await?;
        }
    }

    let duration = Duration::from_secs_f64(args.seconds);
    let mut cells = Vec::new();
    for &workload in &args.workloads {
        for &clients in &args.clients {
            let mut cell = Cell::new(workload, clients);
            for round in 0..args.rounds {
                for i in 0..systems.len() {
                    let system = &systems[(i + round) % systems.len()];
                    let before = Counters::read(&stats).await?;
                    let segment = rounds::segment(
                        Arc::clone(system),
                        workload,
                        clients,
                        duration,
                        args.pool,
                        format!("{}-{clients}-{round}-", workload.name()),
                    )
                    .await?;
                    let server = Counters::read(&stats).await?.since(&before);
                    cell.push(system.name(), round, Measured::new(segment, &server));
                }
            }
            eprintln!("{}", cell.line());
            cells.push(cell);
        }
    }
    println!(
        "Redis {version}, {} rounds of {} s per cell\n",
        args.rounds, args.seconds
    );
    println!("{}", report::table(&cells));
    if let Some(path) = args.json {
        std::fs::write(
            &path,
            serde_json::to_vec_pretty(&report::json(&version, &cells))?,
        )?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
