//! `idem purge` on many expired records, per backend: the records are written through the
//! store (claim, then complete, with a retention of 1 ms, so each is expired as soon as it
//! is written), then the built `idem` binary purges them, timed from spawn to exit, and the
//! store is counted again to prove nothing is left.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{
    Admin, Fingerprint, Key, store::ClaimOutcome, store::ClaimRequest, store::WriteOutcome,
};
use idem_dynamodb::DynamoDbStore;
use idem_postgres::PostgresStore;
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;

use crate::target::BoxError;

/// Writers seeding at once.
const SEEDERS: usize = 32;

/// One backend's purge.
#[derive(Serialize)]
pub(crate) struct PurgeRow {
    pub(crate) backend: &'static str,
    pub(crate) records: usize,
    /// Expired records the store counted before the purge.
    pub(crate) expired_before: u64,
    pub(crate) seed_secs: f64,
    /// Wall time of the `idem purge` process, spawn to exit.
    pub(crate) purge_secs: f64,
    /// What `idem purge` said it deleted.
    pub(crate) purged: u64,
    /// Records the store still held afterwards.
    pub(crate) left: u64,
}

/// A store to seed, and the flags that point `idem` at the same records.
struct PurgeTarget {
    name: &'static str,
    store: Arc<dyn Admin>,
    args: Vec<String>,
    env: Vec<(&'static str, &'static str)>,
}

/// The `idem` binary built beside this one (`cargo build --release -p idem-cli` beside a
/// release build, without `--release` beside a debug one).
pub(crate) fn sibling_idem() -> Result<PathBuf, BoxError> {
    let path = std::env::current_exe()?.with_file_name("idem");
    if path.exists() {
        return Ok(path);
    }
    let build = if cfg!(debug_assertions) {
        "cargo build -p idem-cli"
    } else {
        "cargo build --release -p idem-cli"
    };
    Err(format!(
        "no `idem` binary at {}: build it first with `{build}`, or pass --idem PATH",
        path.display()
    )
    .into())
}

async fn target(name: &str, dir: &Path) -> Result<Option<PurgeTarget>, BoxError> {
    let run = std::process::id();
    let target = match name {
        "sqlite" => {
            let path = dir.join("purge.db");
            let _ = std::fs::remove_file(&path);
            PurgeTarget {
                name: "sqlite",
                store: Arc::new(SqliteStore::open(&path)?),
                args: vec!["--store".into(), format!("sqlite://{}", path.display())],
                env: vec![],
            }
        }
        "postgres" => {
            let Some(url) = crate::service("IDEM_TEST_POSTGRES_URL")? else {
                return Ok(None);
            };
            let pool = PgPoolOptions::new()
                .max_connections(16)
                .connect(&url)
                .await?;
            let table = "idem_bench_purge";
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
                .execute(&pool)
                .await?;
            let store = PostgresStore::builder(pool).table(table)?.build();
            store.migrate().await?;
            PurgeTarget {
                name: "postgres",
                store: Arc::new(store),
                args: vec!["--store".into(), url, "--table".into(), table.into()],
                env: vec![],
            }
        }
        "redis" => {
            let Some(url) = crate::service("IDEM_TEST_REDIS_URL")? else {
                return Ok(None);
            };
            let prefix = format!("idem-bench-purge-{run}:");
            PurgeTarget {
                name: "redis",
                store: Arc::new(RedisStore::standalone(&url).await?.with_prefix(&prefix)?),
                args: vec!["--store".into(), url, "--prefix".into(), prefix],
                env: vec![],
            }
        }
        "dynamodb" => {
            let Some(endpoint) = crate::service("IDEM_TEST_DYNAMODB_ENDPOINT")? else {
                return Ok(None);
            };
            let client = crate::backends::dynamodb_client(&endpoint);
            idem_dynamodb::create_table(&client, "idem_bench").await?;
            let prefix = format!("purge-{run}#");
            PurgeTarget {
                name: "dynamodb",
                store: Arc::new(
                    DynamoDbStore::builder(client, "idem_bench")?
                        .prefix(&prefix)?
                        .build(),
                ),
                args: vec![
                    "--store".into(),
                    format!("dynamodb://idem_bench?region=us-east-1&endpoint={endpoint}"),
                    "--prefix".into(),
                    prefix,
                ],
                env: vec![
                    ("AWS_ACCESS_KEY_ID", "bench"),
                    ("AWS_SECRET_ACCESS_KEY", "bench"),
                ],
            }
        }
        // The memory store and the HTTP layer have nothing for `idem` to point at.
        _ => return Ok(None),
    };
    Ok(Some(target))
}

/// Writes `records` expired records through the store.
async fn seed(store: &Arc<dyn Admin>, records: usize) -> Result<(), BoxError> {
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..SEEDERS {
        let store = Arc::clone(store);
        writers.spawn(async move {
            for i in (writer..records).step_by(SEEDERS) {
                let key = Key::new("bench/purge", format!("order-{i}"))?;
                let request = ClaimRequest::new(
                    key,
                    Fingerprint::of_bytes(i.to_be_bytes()),
                    Duration::from_secs(60),
                    Duration::from_millis(1),
                );
                let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await? else {
                    return Err::<(), BoxError>(format!("order-{i} was not fresh").into());
                };
                if store.complete(&lease, b"{\"receipt\":\"r\"}").await? != WriteOutcome::Applied {
                    return Err(format!("order-{i} was fenced").into());
                }
            }
            Ok(())
        });
    }
    while let Some(done) = writers.join_next().await {
        done??;
    }
    Ok(())
}

/// Seeds, purges with the `idem` binary at `idem`, and counts what is left, per backend.
pub(crate) async fn run(
    backends: &[String],
    records: usize,
    idem: &Path,
    dir: &Path,
) -> Result<Vec<PurgeRow>, BoxError> {
    let mut rows = Vec::new();
    for name in backends {
        let Some(target) = target(name, dir).await? else {
            continue;
        };
        eprintln!("purge, {}: seeding {records} expired records", target.name);
        let started = Instant::now();
        seed(&target.store, records).await?;
        let seed_secs = started.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let expired_before = target.store.stats(0).await?.absent;

        let mut command = Command::new(idem);
        command
            .arg("purge")
            .args(&target.args)
            .envs(target.env.iter().copied());
        let started = Instant::now();
        let output = tokio::task::spawn_blocking(move || command.output()).await??;
        let purge_secs = started.elapsed().as_secs_f64();
        let said = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            return Err(format!(
                "idem purge on {} failed ({}): {said}{}",
                target.name,
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )
            .into());
        }
        let purged = said
            .strip_prefix("purged ")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let left = target.store.stats(0).await?.total;
        eprintln!("  {}", said.trim_end());
        if left != 0 {
            return Err(format!("{}: {left} records left after the purge", target.name).into());
        }
        rows.push(PurgeRow {
            backend: target.name,
            records,
            expired_before,
            seed_secs,
            purge_secs,
            purged,
            left,
        });
    }
    Ok(rows)
}

pub(crate) fn print(rows: &[PurgeRow]) {
    println!(
        "\n| backend | expired records written | counted expired before | `idem purge` wall time (s) | deleted by `idem purge` | records/s | left after |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        println!(
            "| {} | {} | {} | {:.2} | {} | {} | {} |",
            row.backend,
            row.records,
            row.expired_before,
            row.purge_secs,
            row.purged,
            if row.purged == 0 {
                "-".to_owned()
            } else {
                format!("{:.0}", row.purged as f64 / row.purge_secs)
            },
            row.left
        );
    }
}
