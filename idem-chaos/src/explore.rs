//! `idem-chaos explore`: idem-testkit's systematic fault explorer, run against the
//! memory store, SQLite, and the test servers (see `idem_testkit::explore`).
//!
//! Unlike a chaos run, nothing here is random in the network: the explorer wraps the
//! store itself and injects one or two faults per run at numbered store calls and await
//! points, then checks every promise on a ledger kept outside the store.

use std::convert::Infallible;
use std::time::Duration;

use idem_core::MemoryStore;
use idem_dynamodb::aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use idem_dynamodb::aws_sdk_dynamodb::{Client, Config};
use idem_testkit::explore::{DEFAULT_SEED, Explorer, Mode, Report, Target};

use crate::backends;
use crate::run::BoxError;

/// What `explore` runs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Backends: `memory`, `sqlite`, `postgres`, `redis`, `dynamodb`.
    pub backends: Vec<String>,
    /// Draws the pairs and the samples (default [`DEFAULT_SEED`]).
    pub seed: Option<u64>,
    /// Many more runs: 2 000 pairs per scenario on memory and SQLite (instead of 60),
    /// 1 000 sampled runs on a server (instead of 48).
    pub long: bool,
    /// Overrides the pairs per scenario (memory, SQLite) or the sampled runs (servers).
    pub runs: Option<usize>,
}

/// The environment variable holding a server backend's test address.
fn variable(backend: &str) -> Option<&'static str> {
    match backend {
        "postgres" => Some("IDEM_TEST_POSTGRES_URL"),
        "redis" => Some("IDEM_TEST_REDIS_URL"),
        "dynamodb" => Some("IDEM_TEST_DYNAMODB_ENDPOINT"),
        _ => None,
    }
}

/// Explores each backend in turn and answers its report.
///
/// - memory and SQLite (on a virtual clock): every single fault at every fault point of
///   every scenario's fault-free run, then sampled pairs (the only runs that fault a
///   takeover);
/// - PostgreSQL, Redis, DynamoDB (real time, short leases): sampled runs, their addresses
///   from `IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_REDIS_URL`, `IDEM_TEST_DYNAMODB_ENDPOINT`
///   (`scripts/services.sh start`), on loopback only.
///
/// # Errors
/// An unknown backend, an unset or off-loopback address, or an exploration that could
/// not run; what the runs found is in the reports.
pub fn explore(settings: &Settings) -> Result<Vec<Report>, BoxError> {
    let seed = settings.seed.unwrap_or(DEFAULT_SEED);
    let mut reports = Vec::new();
    for backend in &settings.backends {
        let (target, mode) = match backend.as_str() {
            "memory" | "sqlite" => {
                let pairs = settings
                    .runs
                    .unwrap_or(if settings.long { 2_000 } else { 60 });
                (local(backend), Mode::exhaustive_with_pairs(seed, pairs))
            }
            _ => {
                let runs = settings
                    .runs
                    .unwrap_or(if settings.long { 1_000 } else { 48 });
                (server(backend)?, Mode::sampled(seed, runs))
            }
        };
        eprintln!("idem-chaos explore: {backend}, {mode:?}");
        let report = Explorer::new(target).mode(mode).progress(true).run()?;
        reports.push(report);
    }
    Ok(reports)
}

fn local(backend: &str) -> Target {
    if backend == "sqlite" {
        Target::virtual_time("sqlite", |clock| async move {
            idem_sqlite::SqliteStore::builder_in_memory()
                .clock(clock)
                .build()
        })
    } else {
        Target::virtual_time("memory", |clock| async move {
            Ok::<_, Infallible>(MemoryStore::with_clock(clock))
        })
    }
}

fn server(backend: &str) -> Result<Target, BoxError> {
    let variable = variable(backend).ok_or_else(|| {
        format!("unknown backend {backend} (memory, sqlite, postgres, redis, dynamodb)")
    })?;
    let url = std::env::var(variable)
        .map_err(|_| format!("{variable} is unset: eval \"$(scripts/services.sh start)\""))?;
    backends::address(&url)?;
    // One namespace per exploration: its runs tell themselves apart by key.
    let namespace = format!("explore_{}_{}", std::process::id(), now_ms());
    Ok(match backend {
        "postgres" => Target::real_time("postgres", move || {
            let (url, namespace) = (url.clone(), namespace.clone());
            async move {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(8)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect(&url)
                    .await?;
                let store = idem_postgres::PostgresStore::builder(pool)
                    .table(&namespace)?
                    .build();
                store.migrate().await?;
                Ok::<_, BoxError>(store)
            }
        }),
        "redis" => Target::real_time("redis", move || {
            let (url, prefix) = (url.clone(), format!("{namespace}:"));
            async move {
                Ok::<_, BoxError>(
                    idem_redis::RedisStore::standalone(&url)
                        .await?
                        .with_prefix(&prefix)?,
                )
            }
        }),
        _ => Target::real_time("dynamodb", move || {
            let (endpoint, table) = (url.clone(), namespace.clone());
            async move {
                let client = dynamodb_client(&endpoint);
                idem_dynamodb::create_table(&client, &table).await?;
                // No skew margin: DynamoDB Local runs on this machine's clock.
                Ok::<_, BoxError>(
                    idem_dynamodb::DynamoDbStore::builder(client, &table)?
                        .skew_margin(Duration::ZERO)
                        .build(),
                )
            }
        }),
    })
}

fn dynamodb_client(endpoint: &str) -> Client {
    let config = Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "explore",
            "explore",
            None,
            None,
            "idem-chaos",
        ))
        .build();
    Client::from_conf(config)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
