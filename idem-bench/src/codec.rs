//! What encryption at rest costs per `execute`: the same executions with the default
//! codec and with AES-256-GCM, alternating rounds, one task (the cost is CPU; concurrency
//! would only add scheduling noise).

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{
    Aes256GcmCodec, Fingerprint, Idempotency, Key, MemoryStore, Store, WorkError, codec::PlainCodec,
};
use serde::Serialize;

use crate::target::BoxError;

/// One row of the table: a backend, a response size and a workload, both codecs.
#[derive(Serialize)]
pub(crate) struct CodecRow {
    backend: &'static str,
    response_bytes: usize,
    workload: &'static str,
    ops_per_round: usize,
    rounds: usize,
    plain_us: f64,
    aes_us: f64,
}

/// Response sizes: a receipt id, and a response carrying a customer's details.
const SIZES: [usize; 2] = [64, 4096];

pub(crate) async fn run(
    backends: &[String],
    quick: bool,
    dir: &std::path::Path,
) -> Result<Vec<CodecRow>, BoxError> {
    let rounds = if quick { 1 } else { 5 };
    let mut rows = Vec::new();
    for name in backends {
        let (store, ops): (Arc<dyn Store>, usize) = match name.as_str() {
            "memory" => (
                Arc::new(MemoryStore::new()),
                if quick { 200 } else { 20_000 },
            ),
            "sqlite" => {
                let path = dir.join("codec.sqlite3");
                let store = idem_sqlite::SqliteStore::open(path)?;
                (Arc::new(store), if quick { 50 } else { 2_000 })
            }
            "postgres" => match std::env::var("IDEM_TEST_POSTGRES_URL") {
                Ok(url) => {
                    let pool = sqlx::postgres::PgPoolOptions::new()
                        .max_connections(2)
                        .connect(&url)
                        .await?;
                    let store = crate::backends::fresh_pg_store(pool, "idem_codec_bench").await?;
                    (Arc::new(store), if quick { 50 } else { 2_000 })
                }
                Err(_) => continue,
            },
            _ => continue,
        };
        eprintln!("codec: {name}");
        for size in SIZES {
            let mut plain = (Vec::new(), Vec::new());
            let mut aes = (Vec::new(), Vec::new());
            for round in 0..rounds {
                let tag = format!("{name}-{size}-{round}");
                let plain_driver = Idempotency::builder(Arc::clone(&store))
                    .codec(PlainCodec)
                    .build()?;
                let aes_driver = Idempotency::builder(Arc::clone(&store))
                    .codec(Aes256GcmCodec::new(1, [7; 32]))
                    .build()?;
                let (fresh, replay) = time(&plain_driver, &format!("p-{tag}"), size, ops).await?;
                plain.0.push(fresh);
                plain.1.push(replay);
                let (fresh, replay) = time(&aes_driver, &format!("a-{tag}"), size, ops).await?;
                aes.0.push(fresh);
                aes.1.push(replay);
            }
            for (workload, plain, aes) in [
                ("fresh", &mut plain.0, &mut aes.0),
                ("replay", &mut plain.1, &mut aes.1),
            ] {
                rows.push(CodecRow {
                    backend: backend_name(name),
                    response_bytes: size,
                    workload,
                    ops_per_round: ops,
                    rounds,
                    plain_us: median_us(plain, ops),
                    aes_us: median_us(aes, ops),
                });
            }
        }
    }
    Ok(rows)
}

fn backend_name(name: &str) -> &'static str {
    match name {
        "memory" => "memory",
        "sqlite" => "sqlite",
        _ => "postgres",
    }
}

/// Runs `ops` fresh executions, then replays each: the time of each pass.
async fn time(
    idem: &Idempotency<Arc<dyn Store>>,
    tag: &str,
    size: usize,
    ops: usize,
) -> Result<(Duration, Duration), BoxError> {
    let response = "x".repeat(size.saturating_sub(2));
    let keys: Vec<Key> = (0..ops)
        .map(|i| Key::new("bench/codec", format!("{tag}-{i}")))
        .collect::<Result<_, _>>()?;
    let mut passes = [Duration::ZERO; 2];
    for pass in &mut passes {
        let started = Instant::now();
        for key in &keys {
            let response = response.clone();
            idem.execute(key, Fingerprint::of_bytes("req"), |_ctx| async move {
                Ok::<_, WorkError<()>>(response)
            })
            .await?;
        }
        *pass = started.elapsed();
    }
    Ok((passes[0], passes[1]))
}

fn median_us(samples: &mut [Duration], ops: usize) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e6 / ops as f64
}

pub(crate) fn print(rows: &[CodecRow]) {
    if rows.is_empty() {
        return;
    }
    println!("\nEncryption at rest: µs per execute, one task, median of rounds");
    println!(
        "{:<9} {:>8} {:<7} {:>10} {:>10} {:>10}",
        "backend", "response", "work", "plain", "aes-gcm", "added"
    );
    for row in rows {
        println!(
            "{:<9} {:>7}B {:<7} {:>10.2} {:>10.2} {:>10.2}",
            row.backend,
            row.response_bytes,
            row.workload,
            row.plain_us,
            row.aes_us,
            row.aes_us - row.plain_us
        );
    }
}
