//! The proxy's own purge of expired records, when `purge_interval` asks for one.

use std::sync::Arc;
use std::time::Duration;

use idem_core::Store;
use tokio_util::sync::CancellationToken;

/// Purges expired records every `every`, in batches, until a shutdown.
pub(super) async fn purge_loop(store: Arc<dyn Store>, every: Duration, token: CancellationToken) {
    const BATCH: usize = 1000;
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let mut purged = 0;
        // Bounded: a store that keeps a backlog finishes it over the next rounds.
        for _ in 0..100 {
            // A shutdown does not wait for a store that hangs.
            let batch = tokio::select! {
                () = token.cancelled() => return,
                batch = store.purge_expired(BATCH) => batch,
            };
            match batch {
                Ok(n) => {
                    purged += n;
                    if n < BATCH {
                        break;
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "purging expired records failed; trying again next round");
                    break;
                }
            }
            if token.is_cancelled() {
                return;
            }
        }
        if purged > 0 {
            tracing::info!(purged, "expired records purged");
        }
    }
}
