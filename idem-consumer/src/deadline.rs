//! A limit on how long work runs: from its start to its end only, so that the store calls
//! around it (the claim, the result's write) always finish.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Tracks one execution's work, for [`WorkDeadline::expired`].
#[derive(Default)]
pub(crate) struct WorkDeadline {
    started: tokio::sync::Notify,
    finished: AtomicBool,
}

impl WorkDeadline {
    /// `work`, marking its start and its end.
    pub(crate) fn wrap<'a, F: Future + 'a>(
        &'a self,
        work: F,
    ) -> impl Future<Output = F::Output> + 'a {
        self.started.notify_one();
        async move {
            let output = work.await;
            self.finished.store(true, Ordering::SeqCst);
            output
        }
    }

    /// Completes (with `limit`) once the work has run `limit` without ending; never
    /// without a limit, for work that never started (a replay), or for work that ended.
    pub(crate) async fn expired(&self, limit: Option<Duration>) -> Duration {
        let Some(limit) = limit else {
            return std::future::pending().await;
        };
        self.started.notified().await;
        tokio::time::sleep(limit).await;
        if self.finished.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        limit
    }
}
