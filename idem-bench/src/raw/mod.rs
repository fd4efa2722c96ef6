//! The raw baselines: per backend, the least a hand-written "insert if absent, then store
//! the result" costs with the same client. A fresh key takes two round trips (claim, then
//! complete); a key already completed takes one (the claim attempt returns the stored row).

pub(crate) mod dynamodb;
pub(crate) mod memory;
pub(crate) mod postgres;
pub(crate) mod redis;
pub(crate) mod sqlite;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::target::BoxError;

/// The same native replay as a raw baseline, in the plainest loop a user would write:
/// no trait object, no latency recording, keys formatted before the clock starts. If the
/// harness's raw baseline falls well short of this, the harness is what is measured.
#[async_trait]
pub(crate) trait PlainLoop: Send + Sync {
    /// Replays of `pool` (keys completed through this baseline) by `clients` loops for
    /// `duration`; the operations done. Every answer is checked to be a replay.
    async fn replays(
        &self,
        clients: usize,
        duration: Duration,
        pool: Arc<Vec<String>>,
    ) -> Result<u64, BoxError>;
}

/// Runs `clients` copies of `one` (client number, then operation number) until `duration`
/// is up; the operations done.
pub(crate) async fn plain_loops<F, Fut>(
    clients: usize,
    duration: Duration,
    one: F,
) -> Result<u64, BoxError>
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), BoxError>> + Send,
{
    let deadline = Instant::now() + duration;
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let one = one.clone();
            tokio::spawn(async move {
                let mut done = 0u64;
                while Instant::now() < deadline {
                    one(client, done).await?;
                    done += 1;
                }
                Ok::<_, BoxError>(done)
            })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(total)
}
