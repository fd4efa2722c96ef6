//! How cost grows with the store: claim and replay throughput and latency with 10^4, 10^6
//! and 10^7 records already in it, and `purge_expired` on a store where half the records
//! are expired.
//!
//! Records are seeded inside the server, copied from one record the store wrote itself
//! (the template), so they are exactly what the store writes: PostgreSQL and SQLite with
//! one `INSERT .. SELECT` over a generated series per chunk, Redis with pipelined `HSET` of
//! the template's fields, DynamoDB with `BatchWriteItem` of the template's item. Every
//! other seeded record is expired (where the backend keeps expired records: Redis deletes
//! its own). The store grows from one size to the next; each size is measured as it is.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use idem_core::{Admin, Fingerprint, Key, Store, raw::storage_name};
use idem_dynamodb::DynamoDbStore;
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;
use serde::Serialize;

use crate::target::{BoxError, Done, IdemTarget, Target};
use crate::workload::{self, Workload};

/// The scope every scaling record is under (the same as the other workloads').
const SCOPE: &str = "bench/checkout";

/// The DynamoDB table of the scaling run, deleted when it ends.
const DYNAMODB_TABLE: &str = "idem_bench_scaling";

/// One measurement at one size.
#[derive(Clone, Serialize)]
pub(crate) struct ScaleRow {
    pub(crate) backend: &'static str,
    /// Records in the store when the measurement began (seeded, half of them expired
    /// where the backend keeps expired records).
    pub(crate) records: u64,
    pub(crate) workload: Workload,
    pub(crate) clients: usize,
    pub(crate) ops_per_sec: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
}

/// `purge_expired` at one size.
#[derive(Clone, Serialize)]
pub(crate) struct ScalePurge {
    pub(crate) backend: &'static str,
    pub(crate) records: u64,
    pub(crate) purged: usize,
    pub(crate) secs: f64,
    pub(crate) per_sec: f64,
}

/// Seeding to a size, and how long it took.
#[derive(Clone, Serialize)]
pub(crate) struct ScaleSeed {
    pub(crate) backend: &'static str,
    pub(crate) records: u64,
    pub(crate) secs: f64,
}

/// One operator's command (`idem stats`, `idem list`) at one size, spawn to exit.
#[derive(Clone, Serialize)]
pub(crate) struct ScaleOperator {
    pub(crate) backend: &'static str,
    pub(crate) records: u64,
    /// Which `idem` binary ran it: `after` (the one measured) or `before` (`--idem-before`).
    pub(crate) binary: &'static str,
    /// The command, as the operator types it (store flags left out).
    pub(crate) operation: &'static str,
    /// `None` when it was stopped at the time limit.
    pub(crate) secs: Option<f64>,
}

/// The `idem` binaries whose operator commands are timed: the one measured, and
/// optionally an earlier build to compare with.
#[derive(Clone, Debug, Default)]
pub(crate) struct OperatorBinaries {
    pub(crate) after: Option<std::path::PathBuf>,
    pub(crate) before: Option<std::path::PathBuf>,
    /// Each command is stopped after this long.
    pub(crate) limit: Duration,
}

#[derive(Default, Serialize)]
pub(crate) struct ScaleReport {
    pub(crate) rows: Vec<ScaleRow>,
    pub(crate) purges: Vec<ScalePurge>,
    pub(crate) seeds: Vec<ScaleSeed>,
    pub(crate) operators: Vec<ScaleOperator>,
}

/// Writes seeded records `seed-<from>` .. `seed-<to - 1>` as copies of the template.
#[async_trait]
trait Seeder: Send + Sync {
    /// Whether expired records stay until purged (false: the backend deletes them).
    fn keeps_expired(&self) -> bool;
    async fn seed(&self, from: u64, to: u64) -> Result<(), BoxError>;
    /// Removes what the run wrote, where it would outlive the run (a table, keys).
    async fn clean_up(&self) -> Result<(), BoxError> {
        Ok(())
    }
}

struct Setup {
    name: &'static str,
    target: Arc<dyn Target>,
    store: Arc<dyn Admin>,
    seeder: Box<dyn Seeder>,
    /// Most records this backend is seeded to.
    max: u64,
    /// The flags and environment that point `idem` at the same records.
    cli: Vec<String>,
    cli_env: Vec<(&'static str, &'static str)>,
}

/// The fingerprint every scaling record is claimed with, template and seeds alike.
fn fingerprint() -> Fingerprint {
    Fingerprint::of_bytes("idem-bench scaling")
}

fn setup_target<S: Admin + Clone + 'static>(store: &S) -> (Arc<dyn Target>, Arc<dyn Admin>) {
    (
        Arc::new(IdemTarget::with_fingerprint(store.clone(), fingerprint())),
        Arc::new(store.clone()),
    )
}

/// Runs the scaling measurement on `backends` at `sizes`.
pub(crate) async fn run(
    backends: &[String],
    sizes: &[u64],
    dynamodb_max: u64,
    seconds: f64,
    purge_budget: usize,
    dir: &Path,
    binaries: &OperatorBinaries,
) -> Result<ScaleReport, BoxError> {
    let mut report = ScaleReport::default();
    for name in backends {
        let Some(setup) = setup(name, dir, dynamodb_max).await? else {
            continue;
        };
        eprintln!("scaling {}:", setup.name);
        if setup.target.execute("template").await? != Done::Executed {
            return Err("the scaling template was not fresh".into());
        }
        let mut seeded = 0u64;
        // Seeded records purged so far (they no longer count).
        let mut purged_total = 0u64;
        // Sizes beyond what this backend is seeded to become its largest.
        let mut capped: Vec<u64> = sizes.iter().map(|&size| size.min(setup.max)).collect();
        capped.dedup();
        for size in capped {
            let started = Instant::now();
            let mut from = seeded;
            while from < size {
                let to = (from + 500_000).min(size);
                setup.seeder.seed(from, to).await?;
                from = to;
            }
            seeded = seeded.max(size);
            let records = seeded - purged_total;
            report.seeds.push(ScaleSeed {
                backend: setup.name,
                records,
                secs: started.elapsed().as_secs_f64(),
            });
            eprintln!(
                "  seeded to {records} records in {:.1} s",
                started.elapsed().as_secs_f64()
            );
            // Replays of live records spread over the whole store (even numbers are live).
            let pool: Arc<Vec<String>> = Arc::new(
                (0..4096u64)
                    .map(|i| {
                        let n = (i.wrapping_mul(2_654_435_761) % (size / 2).max(1)) * 2;
                        format!("seed-{n}")
                    })
                    .collect(),
            );
            for workload in [Workload::Fresh, Workload::Replay] {
                for clients in [1, 16] {
                    let namespace = format!("{}-{size}-{clients}-", std::process::id());
                    let sample = workload::run(
                        Arc::clone(&setup.target),
                        workload,
                        clients,
                        Duration::from_secs_f64(seconds),
                        Arc::clone(&pool),
                        namespace,
                    )
                    .await?;
                    let row = ScaleRow {
                        backend: setup.name,
                        records,
                        workload,
                        clients,
                        ops_per_sec: sample.ops_per_sec(),
                        p50_us: sample.percentile(0.5).as_secs_f64() * 1e6,
                        p99_us: sample.percentile(0.99).as_secs_f64() * 1e6,
                    };
                    eprintln!(
                        "  {records:>9} records {:<7} c={clients:<2} {:>8.0}/s p50 {:>6.0} µs p99 {:>6.0} µs",
                        workload.name(),
                        row.ops_per_sec,
                        row.p50_us,
                        row.p99_us
                    );
                    report.rows.push(row);
                }
            }
            report
                .operators
                .extend(operators(&setup, records, binaries).await?);
            if setup.seeder.keeps_expired() {
                let started = Instant::now();
                let mut purged = 0usize;
                // Bounded by count and by time: a throughput, not a cleanup.
                let limit = Duration::from_secs_f64((seconds * 10.0).max(2.0));
                while purged < purge_budget && started.elapsed() < limit {
                    let n = setup
                        .store
                        .purge_expired((purge_budget - purged).min(1000))
                        .await?;
                    if n == 0 {
                        break;
                    }
                    purged += n;
                }
                let secs = started.elapsed().as_secs_f64();
                purged_total += purged as u64;
                eprintln!(
                    "  purge_expired: {purged} records in {secs:.2} s ({:.0}/s)",
                    purged as f64 / secs.max(1e-9)
                );
                report.purges.push(ScalePurge {
                    backend: setup.name,
                    records,
                    purged,
                    secs,
                    per_sec: purged as f64 / secs.max(1e-9),
                });
            }
        }
        setup.seeder.clean_up().await?;
    }
    Ok(report)
}

/// What an operator asks of a store this size, each command timed once from spawn to
/// exit with each binary: the counts, the first page, a page of a scope prefix every
/// record matches and of one none does (the listing read to its end for nothing), and
/// stuck work (none here: the seeded records are finished).
async fn operators(
    setup: &Setup,
    records: u64,
    binaries: &OperatorBinaries,
) -> Result<Vec<ScaleOperator>, BoxError> {
    const COMMANDS: [(&str, &[&str]); 5] = [
        ("stats", &["stats"]),
        ("list", &["list"]),
        (
            "list --scope-prefix bench/",
            &["list", "--scope-prefix", "bench/"],
        ),
        (
            "list --scope-prefix nobody/",
            &["list", "--scope-prefix", "nobody/"],
        ),
        ("list --stuck 1m", &["list", "--stuck", "1m"]),
    ];
    let mut rows = Vec::new();
    for (binary, path) in [("after", &binaries.after), ("before", &binaries.before)] {
        let Some(path) = path else { continue };
        for (operation, args) in COMMANDS {
            let mut command = std::process::Command::new(path);
            command
                .args(args)
                .args(&setup.cli)
                .envs(setup.cli_env.iter().copied())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            let limit = binaries.limit;
            let secs = tokio::task::spawn_blocking(move || timed(command, limit)).await??;
            eprintln!(
                "  {binary:<6} idem {operation:<28} {}",
                secs.map_or_else(
                    || format!("stopped after {limit:?}"),
                    |s| format!("{s:.3} s")
                )
            );
            rows.push(ScaleOperator {
                backend: setup.name,
                records,
                binary,
                operation,
                secs,
            });
        }
    }
    Ok(rows)
}

/// Runs `command` to its end, or kills it after `limit` (`None`); a failure is an error
/// naming the command only (its flags hold the store's URL).
fn timed(mut command: std::process::Command, limit: Duration) -> Result<Option<f64>, BoxError> {
    let started = Instant::now();
    let mut child = command.spawn()?;
    loop {
        if let Some(status) = child.try_wait()? {
            let secs = started.elapsed().as_secs_f64();
            if !status.success() {
                let args: Vec<_> = command.get_args().take(3).collect();
                return Err(format!("idem {args:?}... failed ({status})").into());
            }
            return Ok(Some(secs));
        }
        if started.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

async fn setup(name: &str, dir: &Path, dynamodb_max: u64) -> Result<Option<Setup>, BoxError> {
    let run = std::process::id();
    Ok(Some(match name {
        "sqlite" => {
            let path = dir.join("scaling.db");
            let _ = std::fs::remove_file(&path);
            let store = SqliteStore::open(&path)?;
            let (target, store) = setup_target(&store);
            Setup {
                name: "sqlite",
                target,
                store,
                seeder: Box::new(SqliteSeeder { path: path.clone() }),
                max: u64::MAX,
                cli: vec!["--store".into(), format!("sqlite://{}", path.display())],
                cli_env: vec![],
            }
        }
        "postgres" => {
            let Some(url) = crate::service("IDEM_TEST_POSTGRES_URL")? else {
                return Ok(None);
            };
            // The same pool as the other measurements: no health-check ping per acquire.
            let pool = crate::backends::pg_pool(&url).await?;
            let store = crate::backends::fresh_pg_store(pool.clone(), "idem_bench_scaling").await?;
            let (target, store) = setup_target(&store);
            Setup {
                name: "postgres",
                target,
                store,
                seeder: Box::new(PostgresSeeder { pool }),
                max: u64::MAX,
                cli: vec![
                    "--store".into(),
                    url.clone(),
                    "--table".into(),
                    "idem_bench_scaling".into(),
                ],
                cli_env: vec![],
            }
        }
        "redis" => {
            let Some(url) = crate::service("IDEM_TEST_REDIS_URL")? else {
                return Ok(None);
            };
            let prefix = format!("bench:{run}:scaling:");
            let store = RedisStore::standalone(&url).await?.with_prefix(&prefix)?;
            let (target, store) = setup_target(&store);
            let connection =
                redis::aio::ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
            Setup {
                name: "redis",
                target,
                store,
                cli: vec![
                    "--store".into(),
                    url.clone(),
                    "--prefix".into(),
                    prefix.clone(),
                ],
                cli_env: vec![],
                seeder: Box::new(RedisSeeder { connection, prefix }),
                max: u64::MAX,
            }
        }
        "dynamodb" => {
            let Some(endpoint) = crate::service("IDEM_TEST_DYNAMODB_ENDPOINT")? else {
                return Ok(None);
            };
            let client = crate::backends::dynamodb_client(&endpoint);
            // A table of its own: purge_expired scans the table, and the other
            // measurements' items would be scanned too.
            let _ = client
                .delete_table()
                .table_name(DYNAMODB_TABLE)
                .send()
                .await;
            idem_dynamodb::create_table(&client, DYNAMODB_TABLE).await?;
            let prefix = format!("{run}#scaling#");
            let store = DynamoDbStore::builder(client.clone(), DYNAMODB_TABLE)?
                .prefix(&prefix)?
                .build();
            let (target, store) = setup_target(&store);
            Setup {
                name: "dynamodb",
                target,
                store,
                cli: vec![
                    "--store".into(),
                    format!("dynamodb://{DYNAMODB_TABLE}?region=us-east-1&endpoint={endpoint}"),
                    "--prefix".into(),
                    prefix.clone(),
                ],
                cli_env: vec![
                    ("AWS_ACCESS_KEY_ID", "bench"),
                    ("AWS_SECRET_ACCESS_KEY", "bench"),
                ],
                seeder: Box::new(DynamoDbSeeder { client, prefix }),
                max: dynamodb_max,
            }
        }
        _ => return Ok(None),
    }))
}

struct PostgresSeeder {
    pool: sqlx::PgPool,
}

#[async_trait]
impl Seeder for PostgresSeeder {
    fn keeps_expired(&self) -> bool {
        true
    }

    async fn seed(&self, from: u64, to: u64) -> Result<(), BoxError> {
        sqlx::query(
            "INSERT INTO idem_bench_scaling (scope, key, fingerprint, state, token, attempt,
                 lease_until, created_at, expires_at, response, steps, resumed)
             SELECT t.scope, 'seed-' || g, t.fingerprint, t.state, t.token, t.attempt,
                 t.lease_until, t.created_at,
                 CASE WHEN g % 2 = 1 THEN now() - interval '1 hour' ELSE t.expires_at END,
                 t.response, t.steps, t.resumed
             FROM idem_bench_scaling t, generate_series($1::bigint, $2::bigint - 1) g
             WHERE t.scope = $3 AND t.key = 'template'",
        )
        .bind(from as i64)
        .bind(to as i64)
        .bind(SCOPE)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn clean_up(&self) -> Result<(), BoxError> {
        sqlx::raw_sql("DROP TABLE IF EXISTS idem_bench_scaling")
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

struct SqliteSeeder {
    path: std::path::PathBuf,
}

#[async_trait]
impl Seeder for SqliteSeeder {
    fn keeps_expired(&self) -> bool {
        true
    }

    async fn seed(&self, from: u64, to: u64) -> Result<(), BoxError> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || -> Result<(), BoxError> {
            let connection = rusqlite::Connection::open(path)?;
            connection.busy_timeout(Duration::from_secs(30))?;
            connection.execute(
                "WITH RECURSIVE g(n) AS (SELECT ?1 UNION ALL SELECT n + 1 FROM g WHERE n + 1 < ?2)
                 INSERT INTO idem_records (scope, key, fingerprint, state, token, attempt,
                     lease_until, created_at, expires_at, response)
                 SELECT t.scope, 'seed-' || g.n, t.fingerprint, t.state, t.token, t.attempt,
                     t.lease_until, t.created_at,
                     CASE WHEN g.n % 2 = 1 THEN 0 ELSE t.expires_at END, t.response
                 FROM g, idem_records t
                 WHERE t.scope = ?3 AND t.key = 'template'",
                rusqlite::params![from as i64, to as i64, SCOPE],
            )?;
            Ok(())
        })
        .await?
    }
}

struct RedisSeeder {
    connection: redis::aio::ConnectionManager,
    prefix: String,
}

impl RedisSeeder {
    fn name(&self, key: &str) -> Result<String, BoxError> {
        let key = Key::new(SCOPE, key)?;
        Ok(format!(
            "{}{{{}}}",
            self.prefix,
            storage_name::key_name(&key)
        ))
    }
}

#[async_trait]
impl Seeder for RedisSeeder {
    fn keeps_expired(&self) -> bool {
        false
    }

    async fn seed(&self, from: u64, to: u64) -> Result<(), BoxError> {
        let mut conn = self.connection.clone();
        let template = self.name("template")?;
        let fields: Vec<(Vec<u8>, Vec<u8>)> = redis::cmd("HGETALL")
            .arg(&template)
            .query_async(&mut conn)
            .await?;
        let expires: i64 = redis::cmd("PEXPIRETIME")
            .arg(&template)
            .query_async(&mut conn)
            .await?;
        if fields.is_empty() || expires <= 0 {
            return Err("the Redis scaling template is missing or has no expiry".into());
        }
        let mut n = from;
        while n < to {
            let end = (n + 5_000).min(to);
            let mut pipe = redis::pipe();
            for i in n..end {
                let name = self.name(&format!("seed-{i}"))?;
                pipe.cmd("HSET").arg(&name).arg(&fields).ignore();
                pipe.cmd("PEXPIREAT").arg(&name).arg(expires).ignore();
            }
            let () = pipe.query_async(&mut conn).await?;
            n = end;
        }
        Ok(())
    }

    async fn clean_up(&self) -> Result<(), BoxError> {
        let mut conn = self.connection.clone();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{}*", self.prefix))
                .arg("COUNT")
                .arg(10_000)
                .query_async(&mut conn)
                .await?;
            if !keys.is_empty() {
                let () = redis::cmd("UNLINK")
                    .arg(keys)
                    .query_async(&mut conn)
                    .await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}

struct DynamoDbSeeder {
    client: aws_sdk_dynamodb::Client,
    prefix: String,
}

#[async_trait]
impl Seeder for DynamoDbSeeder {
    fn keeps_expired(&self) -> bool {
        true
    }

    async fn clean_up(&self) -> Result<(), BoxError> {
        self.client
            .delete_table()
            .table_name(DYNAMODB_TABLE)
            .send()
            .await?;
        Ok(())
    }

    async fn seed(&self, from: u64, to: u64) -> Result<(), BoxError> {
        let name = |key: &str| -> Result<String, BoxError> {
            Ok(storage_name::namespaced_key_name(
                &self.prefix,
                &Key::new(SCOPE, key)?,
            ))
        };
        let pk = name("template")?;
        let template = self
            .client
            .get_item()
            .table_name(DYNAMODB_TABLE)
            .key("pk", AttributeValue::S(pk.clone()))
            .consistent_read(true)
            .send()
            .await?
            .item
            .ok_or("the DynamoDB scaling template is missing: its partition key format changed")?;
        let item = |i: u64| -> Result<HashMap<String, AttributeValue>, BoxError> {
            let mut item = template.clone();
            item.insert("pk".into(), AttributeValue::S(name(&format!("seed-{i}"))?));
            if i % 2 == 1 {
                item.insert("ea".into(), AttributeValue::N("1".into()));
                item.insert("ttl".into(), AttributeValue::N("1".into()));
            }
            Ok(item)
        };
        let mut batches = Vec::new();
        let mut n = from;
        while n < to {
            let end = (n + 25).min(to);
            let mut requests = Vec::new();
            for i in n..end {
                requests.push(
                    WriteRequest::builder()
                        .put_request(PutRequest::builder().set_item(Some(item(i)?)).build()?)
                        .build(),
                );
            }
            batches.push(requests);
            n = end;
        }
        // Eight batches in flight at a time.
        for chunk in batches.chunks(8) {
            let sends: Vec<_> = chunk
                .iter()
                .map(|requests| {
                    let send = self
                        .client
                        .batch_write_item()
                        .request_items(DYNAMODB_TABLE, requests.clone())
                        .send();
                    tokio::spawn(send)
                })
                .collect();
            for sent in sends {
                let out = sent.await??;
                if out
                    .unprocessed_items
                    .is_some_and(|left| left.values().any(|v| !v.is_empty()))
                {
                    return Err("DynamoDB Local left seeded items unprocessed".into());
                }
            }
        }
        Ok(())
    }
}

/// Prints the scaling tables (nothing when there was no scaling run).
pub(crate) fn print(report: &ScaleReport) {
    if report.rows.is_empty() {
        return;
    }
    println!("\n| backend | records | workload | clients | ops/s | p50 / p99 (µs) |");
    println!("|---|---:|---|---:|---:|---:|");
    for row in &report.rows {
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.0} / {:.0} |",
            row.backend,
            row.records,
            row.workload.name(),
            row.clients,
            row.ops_per_sec,
            row.p50_us,
            row.p99_us
        );
    }
    println!("\n| backend | records | seeding (s) | purge_expired: purged | s | records/s |");
    println!("|---|---:|---:|---:|---:|---:|");
    for seed in &report.seeds {
        let purge = report
            .purges
            .iter()
            .find(|p| p.backend == seed.backend && p.records == seed.records);
        match purge {
            Some(p) => println!(
                "| {} | {} | {:.1} | {} | {:.2} | {:.0} |",
                seed.backend, seed.records, seed.secs, p.purged, p.secs, p.per_sec
            ),
            None => println!(
                "| {} | {} | {:.1} | - (expires its own records) | - | - |",
                seed.backend, seed.records, seed.secs
            ),
        }
    }
    if report.operators.is_empty() {
        return;
    }
    println!("\n| backend | records | `idem` command | binary | seconds, spawn to exit |");
    println!("|---|---:|---|---|---:|");
    for row in &report.operators {
        println!(
            "| {} | {} | `{}` | {} | {} |",
            row.backend,
            row.records,
            row.operation,
            row.binary,
            row.secs
                .map_or_else(|| "stopped at the limit".to_string(), |s| format!("{s:.3}"))
        );
    }
}
