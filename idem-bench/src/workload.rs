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

    fn key(self, namespace: &str, op: usize) -> String {
        match self {
            Workload::Fresh => format!("{namespace}f{op}"),
            Workload::Replay => format!("{namespace}r{op}"),
            Workload::Contended => format!("{namespace}c{}-{}", op / 64, op % 4),
            Workload::Mixed if op % 10 == 0 => format!("{namespace}m-fresh{op}"),
            Workload::Mixed => format!("{namespace}r{op}"),
        }
    }

    /// Keys that must be completed before the timed part.
    fn prepared(self, namespace: &str, ops: usize) -> Vec<String> {
        match self {
            Workload::Replay => (0..ops).map(|op| self.key(namespace, op)).collect(),
            Workload::Mixed => (0..ops)
                .filter(|op| op % 10 != 0)
                .map(|op| self.key(namespace, op))
                .collect(),
            Workload::Fresh | Workload::Contended => Vec::new(),
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

/// Prepares and times `ops` operations of `workload` with `concurrency` clients.
pub(crate) async fn run(
    target: Arc<dyn Target>,
    workload: Workload,
    concurrency: usize,
    ops: usize,
    namespace: String,
) -> Result<Sample, BoxError> {
    for key in workload.prepared(&namespace, ops) {
        target.execute(&key).await?;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let clients: Vec<_> = (0..concurrency)
        .map(|_| {
            let (target, next, namespace) =
                (Arc::clone(&target), Arc::clone(&next), namespace.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(ops / concurrency + 1);
                loop {
                    let op = next.fetch_add(1, Ordering::Relaxed);
                    if op >= ops {
                        return Ok::<_, BoxError>(latencies);
                    }
                    let key = workload.key(&namespace, op);
                    let began = Instant::now();
                    let done = target.execute(&key).await?;
                    latencies.push(began.elapsed());
                    if !workload.expects(op, done) {
                        return Err(format!("{}: op {op} ended {done:?}", workload.name()).into());
                    }
                }
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(ops);
    for client in clients {
        latencies.extend(client.await??);
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Ok(Sample {
        ops,
        elapsed,
        latencies,
    })
}
