//! The workloads and the runner that times them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::target::{BoxError, Done, Target};

/// What the clients do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Workload {
    /// `execute` on keys never seen before.
    Fresh,
    /// `execute` on keys already completed.
    Replay,
    /// All clients on four keys at a time (new keys every 64 operations).
    Contended,
    /// 90% replays, 10% fresh keys.
    Mixed,
}

impl Workload {
    pub(crate) const ALL: [Workload; 4] = [
        Workload::Fresh,
        Workload::Replay,
        Workload::Contended,
        Workload::Mixed,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::Fresh => "fresh",
            Workload::Replay => "replay",
            Workload::Contended => "contended",
            Workload::Mixed => "mixed",
        }
    }

    /// The key of operation `op`: fresh keys are new in every round (the namespace holds
    /// the round), replays cycle over `pool`, keys completed before the round.
    fn key(self, namespace: &str, pool: &[String], op: usize) -> String {
        match self {
            Workload::Fresh => format!("{namespace}f{op}"),
            Workload::Replay => pool[op % pool.len()].clone(),
            Workload::Contended => format!("{namespace}c{}-{}", op / 64, op % 4),
            Workload::Mixed if op % 10 == 0 => format!("{namespace}m-fresh{op}"),
            Workload::Mixed => pool[op % pool.len()].clone(),
        }
    }

    fn expects(self, op: usize, done: Done) -> bool {
        match self {
            Workload::Fresh => done == Done::Executed,
            Workload::Replay => done == Done::Replayed,
            Workload::Mixed => {
                done == if op % 10 == 0 {
                    Done::Executed
                } else {
                    Done::Replayed
                }
            }
            Workload::Contended => true,
        }
    }
}

/// Completes `count` keys under `namespace` with 16 clients, for the replay workloads.
pub(crate) async fn prepare(
    target: &Arc<dyn Target>,
    namespace: &str,
    count: usize,
) -> Result<Arc<Vec<String>>, BoxError> {
    let keys: Arc<Vec<String>> = Arc::new((0..count).map(|i| format!("{namespace}r{i}")).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..16)
        .map(|_| {
            let (target, keys, next) = (Arc::clone(target), Arc::clone(&keys), Arc::clone(&next));
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(key) = keys.get(i) else {
                        return Ok::<_, BoxError>(());
                    };
                    if target.execute(key).await? != Done::Executed {
                        return Err(format!("preparing: key {i} was not fresh").into());
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await??;
    }
    Ok(keys)
}

/// One timed run.
#[derive(Clone, Debug)]
pub(crate) struct Sample {
    pub(crate) ops: usize,
    pub(crate) elapsed: Duration,
    /// Sorted.
    pub(crate) latencies: Vec<Duration>,
}

impl Sample {
    pub(crate) fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub(crate) fn percentile(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let index = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[index.min(self.latencies.len() - 1)]
    }
}

/// Times `workload` with `concurrency` clients for `duration`: each client starts
/// operations until the time is up, and the round ends when the last one has finished.
pub(crate) async fn run(
    target: Arc<dyn Target>,
    workload: Workload,
    concurrency: usize,
    duration: Duration,
    pool: Arc<Vec<String>>,
    namespace: String,
) -> Result<Sample, BoxError> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + duration;
    let clients: Vec<_> = (0..concurrency)
        .map(|_| {
            let (target, next, namespace, pool) = (
                Arc::clone(&target),
                Arc::clone(&next),
                namespace.clone(),
                Arc::clone(&pool),
            );
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(4096);
                loop {
                    let began = Instant::now();
                    if began >= deadline {
                        return Ok::<_, BoxError>(latencies);
                    }
                    let op = next.fetch_add(1, Ordering::Relaxed);
                    let key = workload.key(&namespace, &pool, op);
                    let done = target.execute(&key).await?;
                    latencies.push(began.elapsed());
                    if !workload.expects(op, done) {
                        return Err(format!("{}: op {op} ended {done:?}", workload.name()).into());
                    }
                }
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for client in clients {
        latencies.extend(client.await??);
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Ok(Sample {
        ops: latencies.len(),
        elapsed,
        latencies,
    })
}
