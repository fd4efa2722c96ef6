//! Timed segments: clients start executions until the time is up; a segment ends when the
//! last one has finished.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::systems::{BoxError, Done, System};

/// What the clients do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// Keys never seen before: a claim, the work, the result stored.
    Fresh,
    /// Keys completed before the first round: the stored result returned.
    Replay,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Fresh => "fresh",
            Workload::Replay => "replay",
        }
    }

    fn expects(self) -> Done {
        match self {
            Workload::Fresh => Done::Executed,
            Workload::Replay => Done::Replayed,
        }
    }
}

/// The replay pool's key names (each system prefixes its own).
pub fn pool_key(i: usize) -> String {
    format!("r{i}")
}

/// Completes `count` pool keys with 16 clients.
pub async fn prepare(system: Arc<dyn System>, count: usize) -> Result<(), BoxError> {
    let next = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..16)
        .map(|_| {
            let (system, next) = (Arc::clone(&system), Arc::clone(&next));
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        return Ok::<_, BoxError>(());
                    }
                    let done = system.execute(&pool_key(i)).await?;
                    if done != Done::Executed {
                        return Err(format!("{}: pool key {i} was not fresh", system.name()).into());
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await??;
    }
    Ok(())
}

/// One timed segment.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Segment {
    pub ops: usize,
    pub seconds: f64,
    pub p50_micros: f64,
    pub p99_micros: f64,
}

impl Segment {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.seconds.max(1e-9)
    }
}

/// Runs `workload` on `system` with `clients` clients for `duration`. Fresh keys carry
/// `namespace`, so every segment's are new.
pub async fn segment(
    system: Arc<dyn System>,
    workload: Workload,
    clients: usize,
    duration: Duration,
    pool: usize,
    namespace: String,
) -> Result<Segment, BoxError> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (system, next, namespace) =
                (Arc::clone(&system), Arc::clone(&next), namespace.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(1 << 14);
                loop {
                    let began = Instant::now();
                    if began >= deadline {
                        return Ok::<_, BoxError>(latencies);
                    }
                    let op = next.fetch_add(1, Ordering::Relaxed);
                    let key = match workload {
                        Workload::Fresh => format!("{namespace}f{op}"),
                        Workload::Replay => pool_key(op % pool),
                    };
                    let done = system.execute(&key).await?;
                    latencies.push(began.elapsed());
                    if done != workload.expects() {
                        return Err(format!(
                            "{}: {} op {op} ended {done:?}",
                            system.name(),
                            workload.name()
                        )
                        .into());
                    }
                }
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let seconds = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |p: f64| {
        latencies
            .get(((latencies.len().saturating_sub(1)) as f64 * p).round() as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    Ok(Segment {
        ops: latencies.len(),
        seconds,
        p50_micros: at(0.5),
        p99_micros: at(0.99),
    })
}
