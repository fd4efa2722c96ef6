//! PostgreSQL under churn: a table of many records in which claims, completions and the
//! batched purge run together, with autovacuum on, sampled as it goes.
//!
//! The table is seeded (copies of one record the store wrote itself, as in the scaling
//! run) with completed records whose expiries are spread evenly over twice the run's
//! length from the moment seeding began, so records expire at a steady rate all through
//! the run (`records / (2 × seconds)` a second); those that expired while the table was
//! being seeded wait at the start. During the run 16 clients execute fresh keys as fast
//! as they can (their records outlive the run) and one purger calls `purge_expired`
//! without pause while it finds work (`--churn-without-purge` leaves it out, for the
//! same run without deletes). Every sample reads the server's own figures (table
//! and index sizes, live and dead rows, autovacuum runs) and the expired records still
//! waiting, beside the clients' throughput and latency and the purge's rate over the
//! sample.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use idem_core::Store;
use serde::Serialize;
use sqlx::Row;

use crate::target::{BoxError, Done, IdemTarget, Target};

/// The table of the churn run, dropped when it ends.
const TABLE: &str = "idem_bench_churn";

/// Records per seeding statement.
const SEED_CHUNK: u64 = 500_000;

/// Concurrent clients executing fresh keys.
const CLIENTS: usize = 16;

/// Records one `purge_expired` call may delete (the store deletes them 1 000 a statement).
const PURGE_CALL: usize = 10_000;

/// What the run was asked to do and how the server was set.
#[derive(Clone, Serialize)]
pub(crate) struct ChurnSetup {
    pub(crate) records: u64,
    pub(crate) seconds: f64,
    pub(crate) sample_seconds: f64,
    /// Seeded records expiring a second: `records / (2 × seconds)`.
    pub(crate) expiring_per_sec: f64,
    pub(crate) seed_secs: f64,
    /// Records that expired while the table was being seeded, waiting when the run began.
    pub(crate) expired_at_start: i64,
    /// Whether the purger ran.
    pub(crate) purge: bool,
    /// `autovacuum`, `autovacuum_vacuum_scale_factor`, `autovacuum_vacuum_cost_limit` ... as
    /// the server reported them.
    pub(crate) server_settings: Vec<(String, String)>,
}

/// One sample: the window since the previous one.
#[derive(Clone, Serialize)]
pub(crate) struct ChurnSample {
    /// Seconds since the run began, at the end of the window.
    pub(crate) at_secs: f64,
    /// The server's estimates (`pg_stat_user_tables`), which lag by a few seconds.
    pub(crate) live_rows: i64,
    pub(crate) dead_rows: i64,
    /// `pg_table_size`: the heap with its TOAST, free space and visibility maps.
    pub(crate) table_mb: f64,
    /// `pg_indexes_size`.
    pub(crate) indexes_mb: f64,
    /// Expired records no purge has deleted yet.
    pub(crate) expired_waiting: i64,
    /// Autovacuum runs of the table finished since it was created (seeding included).
    pub(crate) autovacuums: i64,
    /// Autoanalyze runs likewise: the statistics the planner chooses plans from.
    pub(crate) autoanalyzes: i64,
    pub(crate) executes_per_sec: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) max_us: f64,
    pub(crate) purged_per_sec: f64,
    /// `purge_expired` calls that ended in the window.
    pub(crate) purge_calls: u64,
    /// The slowest `purge_expired` call that ended in the window.
    pub(crate) slowest_purge_ms: f64,
}

#[derive(Clone, Serialize)]
pub(crate) struct ChurnReport {
    pub(crate) setup: ChurnSetup,
    pub(crate) samples: Vec<ChurnSample>,
}

/// Runs the churn measurement, or `None` without a PostgreSQL to run it on.
pub(crate) async fn run(
    records: u64,
    seconds: f64,
    sample_seconds: f64,
    purge: bool,
) -> Result<Option<ChurnReport>, BoxError> {
    // Checked before seeding: a bad duration found later would leave the table behind.
    for (name, value) in [
        ("--churn-seconds", seconds),
        ("--churn-sample", sample_seconds),
    ] {
        if !(value.is_finite() && value > 0.0 && value <= 86_400.0) {
            return Err(format!(
                "{name} must be a number of seconds above 0 and at most a day, not {value}"
            )
            .into());
        }
    }
    let Some(url) = crate::service("IDEM_TEST_POSTGRES_URL")? else {
        return Ok(None);
    };
    // The clients' pool (16 connections, one per client), and one of its own for the
    // purger and the sampler, so that neither waits for a client's connection.
    let clients_pool = crate::backends::pg_pool(&url).await?;
    let pool = crate::backends::pg_pool(&url).await?;
    let store = crate::backends::fresh_pg_store(clients_pool, TABLE).await?;
    let purger = idem_postgres::PostgresStore::builder(pool.clone())
        .table(TABLE)?
        .build();
    let result = measure(
        &pool,
        store,
        purger,
        records,
        seconds,
        sample_seconds,
        purge,
    )
    .await;
    let drop = format!("DROP TABLE IF EXISTS {TABLE}");
    let dropped = sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
        .execute(&pool)
        .await;
    // The measurement's own error first: a table left behind is the lesser news.
    let report = result?;
    dropped?;
    Ok(Some(report))
}

/// Stops the clients and the purger however the measurement ends, an error included.
struct StopOnDrop {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn measure(
    pool: &sqlx::PgPool,
    store: idem_postgres::PostgresStore,
    purger_store: idem_postgres::PostgresStore,
    records: u64,
    seconds: f64,
    sample_seconds: f64,
    purge: bool,
) -> Result<ChurnReport, BoxError> {
    let seconds = seconds.max(0.1);
    let sample_seconds = sample_seconds.clamp(0.05, seconds);
    let target: Arc<dyn Target> = Arc::new(IdemTarget::new(store.clone()));
    if target.execute("template").await? != Done::Executed {
        return Err("the churn template was not fresh".into());
    }
    let spread = 2.0 * seconds;
    let seeding = Instant::now();
    let base: f64 = sqlx::query_scalar("SELECT extract(epoch FROM now())::float8")
        .fetch_one(pool)
        .await?;
    let mut from = 0;
    while from < records {
        let to = (from + SEED_CHUNK).min(records);
        seed(pool, from, to, records, base, spread).await?;
        from = to;
    }
    let seed_secs = seeding.elapsed().as_secs_f64();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("ANALYZE {TABLE}")))
        .execute(pool)
        .await?;
    let setup = ChurnSetup {
        records,
        seconds,
        sample_seconds,
        expiring_per_sec: records as f64 / spread,
        seed_secs,
        expired_at_start: table_figures(pool).await?.expired_waiting,
        purge,
        server_settings: settings(pool).await?,
    };
    eprintln!(
        "  churn: {records} records seeded in {seed_secs:.1} s; {seconds} s of churn, \
         {:.0} records expiring a second",
        setup.expiring_per_sec
    );

    let stop = Arc::new(AtomicBool::new(false));
    // Each execute's latency, pushed as it ends, so every one lands in its own window.
    let latencies = Arc::new(Mutex::new(Vec::<Duration>::with_capacity(1 << 16)));
    let next = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (target, stop, latencies, next) = (
                Arc::clone(&target),
                Arc::clone(&stop),
                Arc::clone(&latencies),
                Arc::clone(&next),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let op = next.fetch_add(1, Ordering::Relaxed);
                    let began = Instant::now();
                    if target.execute(&format!("churn-{op}")).await? != Done::Executed {
                        return Err::<(), BoxError>(format!("churn key {op} was not fresh").into());
                    }
                    lock(&latencies).push(began.elapsed());
                }
                Ok(())
            })
        })
        .collect();
    let purged = Arc::new(AtomicU64::new(0));
    let slowest_purge_us = Arc::new(AtomicU64::new(0));
    let purge_calls = Arc::new(AtomicU64::new(0));
    let purger = {
        let (stop, purged, slowest, calls) = (
            Arc::clone(&stop),
            Arc::clone(&purged),
            Arc::clone(&slowest_purge_us),
            Arc::clone(&purge_calls),
        );
        tokio::spawn(async move {
            while purge && !stop.load(Ordering::Relaxed) {
                let began = Instant::now();
                let deleted = purger_store.purge_expired(PURGE_CALL).await?;
                slowest.fetch_max(began.elapsed().as_micros() as u64, Ordering::Relaxed);
                calls.fetch_add(1, Ordering::Relaxed);
                purged.fetch_add(deleted as u64, Ordering::Relaxed);
                if deleted < PURGE_CALL {
                    // Caught up: what expires next is a moment away.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Ok::<(), BoxError>(())
        })
    };

    let guard = StopOnDrop {
        stop: Arc::clone(&stop),
        tasks: clients
            .iter()
            .map(|client| client.abort_handle())
            .chain([purger.abort_handle()])
            .collect(),
    };
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(seconds);
    let mut samples = Vec::new();
    let mut window_start = started;
    let mut purged_before = 0;
    while window_start < end {
        let window_end = (window_start + Duration::from_secs_f64(sample_seconds)).min(end);
        tokio::time::sleep_until(window_end.into()).await;
        let now = Instant::now();
        let window = now.duration_since(window_start).as_secs_f64().max(1e-9);
        window_start = now;
        let mut window_latencies = std::mem::take(&mut *lock(&latencies));
        let purged_now = purged.load(Ordering::Relaxed);
        window_latencies.sort_unstable();
        let table = table_figures(pool).await?;
        let sample = ChurnSample {
            at_secs: now.duration_since(started).as_secs_f64(),
            live_rows: table.live_rows,
            dead_rows: table.dead_rows,
            table_mb: table.table_bytes as f64 / 1e6,
            indexes_mb: table.index_bytes as f64 / 1e6,
            expired_waiting: table.expired_waiting,
            autovacuums: table.autovacuums,
            autoanalyzes: table.autoanalyzes,
            executes_per_sec: window_latencies.len() as f64 / window,
            p50_us: percentile_us(&window_latencies, 0.50),
            p99_us: percentile_us(&window_latencies, 0.99),
            max_us: percentile_us(&window_latencies, 1.0),
            purged_per_sec: (purged_now - purged_before) as f64 / window,
            purge_calls: purge_calls.swap(0, Ordering::Relaxed),
            slowest_purge_ms: slowest_purge_us.swap(0, Ordering::Relaxed) as f64 / 1e3,
        };
        purged_before = purged_now;
        eprintln!(
            "  churn {:>6.0} s: {:>9} live {:>8} dead, {:>7.0} MB table {:>7.0} MB indexes, \
             {:>8} expired waiting, {:>6.0} executes/s p99 {:>6.0} µs, {:>6.0} purged/s",
            sample.at_secs,
            sample.live_rows,
            sample.dead_rows,
            sample.table_mb,
            sample.indexes_mb,
            sample.expired_waiting,
            sample.executes_per_sec,
            sample.p99_us,
            sample.purged_per_sec
        );
        samples.push(sample);
        // A client or the purger that stopped early failed: end now and report why.
        if clients.iter().any(|client| client.is_finished()) || purge && purger.is_finished() {
            break;
        }
    }
    // A normal end: the tasks see `stop` and finish their current call.
    let mut guard = guard;
    guard.tasks.clear();
    drop(guard);
    for client in clients {
        client.await??;
    }
    purger.await??;
    // Records expired all through the run: a purger that deleted none is broken.
    if purge && records > 0 && purged.load(Ordering::Relaxed) == 0 {
        return Err("the churn run's purger deleted no expired record".into());
    }
    Ok(ChurnReport { setup, samples })
}

/// Seeds `seed-<from>` .. `seed-<to - 1>`; record `g` expires `g / records × spread`
/// seconds after `base` (Unix seconds).
async fn seed(
    pool: &sqlx::PgPool,
    from: u64,
    to: u64,
    records: u64,
    base: f64,
    spread: f64,
) -> Result<(), BoxError> {
    let insert = format!(
        "INSERT INTO {TABLE} (scope, key, fingerprint, state, token, attempt,
             lease_until, created_at, expires_at, response, steps, resumed)
         SELECT t.scope, 'seed-' || g, t.fingerprint, t.state, t.token, t.attempt,
             t.lease_until, t.created_at,
             to_timestamp($5::float8 + g::float8 / $3::float8 * $4::float8),
             t.response, t.steps, t.resumed
         FROM {TABLE} t, generate_series($1::bigint, $2::bigint - 1) g
         WHERE t.key = 'template'"
    );
    sqlx::query(sqlx::AssertSqlSafe(insert))
        .bind(from as i64)
        .bind(to as i64)
        .bind(records as f64)
        .bind(spread)
        .bind(base)
        .execute(pool)
        .await?;
    Ok(())
}

struct TableFigures {
    live_rows: i64,
    dead_rows: i64,
    table_bytes: i64,
    index_bytes: i64,
    expired_waiting: i64,
    autovacuums: i64,
    autoanalyzes: i64,
}

async fn table_figures(pool: &sqlx::PgPool) -> Result<TableFigures, BoxError> {
    let query = format!(
        "SELECT s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.autoanalyze_count,
             pg_table_size('{TABLE}'), pg_indexes_size('{TABLE}'),
             (SELECT count(*) FROM {TABLE} WHERE expires_at <= now())
         FROM pg_stat_user_tables s WHERE s.relname = '{TABLE}'"
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(query))
        .fetch_one(pool)
        .await?;
    Ok(TableFigures {
        live_rows: row.try_get(0)?,
        dead_rows: row.try_get(1)?,
        autovacuums: row.try_get(2)?,
        autoanalyzes: row.try_get(3)?,
        table_bytes: row.try_get(4)?,
        index_bytes: row.try_get(5)?,
        expired_waiting: row.try_get(6)?,
    })
}

/// The server's vacuum settings, as the run saw them.
async fn settings(pool: &sqlx::PgPool) -> Result<Vec<(String, String)>, BoxError> {
    let rows = sqlx::query(
        "SELECT name, setting FROM pg_settings
         WHERE name IN ('autovacuum', 'autovacuum_naptime', 'autovacuum_vacuum_scale_factor',
             'autovacuum_vacuum_cost_limit', 'autovacuum_vacuum_cost_delay',
             'autovacuum_vacuum_insert_scale_factor', 'fsync', 'shared_buffers', 'server_version')
         ORDER BY name",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

fn percentile_us(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)].as_secs_f64() * 1e6
}

/// Prints the samples as a table.
pub(crate) fn print(report: &Option<ChurnReport>) {
    let Some(report) = report else {
        return;
    };
    let setup = &report.setup;
    println!(
        "\nPostgreSQL churn: {} records seeded in {:.1} s ({} expired by the start), {:.0} \
         expiring a second, {} clients executing fresh keys {} for {:.0} s",
        setup.records,
        setup.seed_secs,
        setup.expired_at_start,
        setup.expiring_per_sec,
        CLIENTS,
        if setup.purge {
            "and one purger"
        } else {
            "and no purge"
        },
        setup.seconds
    );
    for (name, value) in &setup.server_settings {
        println!("  {name} = {value}");
    }
    println!(
        "\n| at (s) | live rows (est.) | dead rows (est.) | table MB | indexes MB | expired waiting | \
         autovacuums / autoanalyzes done | executes/s | p50 / p99 / max (µs) | purged/s | \
         purge calls | slowest purge call (ms) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in &report.samples {
        println!(
            "| {:.0} | {} | {} | {:.0} | {:.0} | {} | {} / {} | {:.0} | {:.0} / {:.0} / {:.0} | {:.0} | {} | {:.0} |",
            s.at_secs,
            s.live_rows,
            s.dead_rows,
            s.table_mb,
            s.indexes_mb,
            s.expired_waiting,
            s.autovacuums,
            s.autoanalyzes,
            s.executes_per_sec,
            s.p50_us,
            s.p99_us,
            s.max_us,
            s.purged_per_sec,
            s.purge_calls,
            s.slowest_purge_ms
        );
    }
}

/// The latencies' lock; a client that panicked while holding it left whole entries only.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
