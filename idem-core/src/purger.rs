//! A task that keeps deleting absent records, for stores whose expiry needs it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::driver::observe;
use crate::{Store, store::Expiry, store::Operation};

/// Deletes absent records continuously in the background: a batch at a time until none is
/// left, then again after a pause. For stores whose [`Store::expiry`] is
/// [`Expiry::Purge`]; on others it has nothing to do and [`Purger::spawn`] says so.
///
/// - Runs on the current Tokio runtime until [`Purger::stop`] is called or the purger is
///   dropped.
/// - A failed purge is logged and counted (`idem_store_errors_total`, operation
///   `purge_expired`) and tried again after the pause; it never stops the task.
/// - Deleted records are counted in `idem_purged_total`.
/// - Safe beside purgers in other processes: stores make `purge_expired` so.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use idem_core::{MemoryStore, Purger, Store};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// let purger = Purger::spawn(store, Duration::from_secs(60), 1_000).expect("the memory store needs purging");
/// purger.stop().await;
/// # });
/// ```
#[derive(Debug)]
pub struct Purger {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Purger {
    /// Starts purging `store` every `pause`, `batch` records per call, when its expiry is
    /// [`Expiry::Purge`]; `None` for stores that delete records themselves.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn spawn(store: Arc<dyn Store>, pause: Duration, batch: usize) -> Option<Self> {
        if store.expiry() != Expiry::Purge {
            return None;
        }
        let batch = batch.max(1);
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                let pause_now = match store.purge_expired(batch).await {
                    // A full batch: more may be waiting.
                    Ok(deleted) if deleted >= batch => {
                        observe::purged(deleted);
                        false
                    }
                    Ok(deleted) => {
                        observe::purged(deleted);
                        true
                    }
                    Err(err) => {
                        observe::store_error(Operation::PurgeExpired);
                        tracing::warn!(error = %err, "purging expired idempotency records failed");
                        true
                    }
                };
                let wait = if pause_now { pause } else { Duration::ZERO };
                tokio::select! {
                    // A stop, or the Purger dropped (the sender with it).
                    _ = stopped.changed() => return,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        });
        Some(Self { stop, task })
    }

    /// Stops the task and waits for it to end (a purge in progress finishes first).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
