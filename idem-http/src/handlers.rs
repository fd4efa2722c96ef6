//! The handlers that outlived their request, for a graceful shutdown to wait for.

use std::future::Future;

use tokio_util::task::TaskTracker;

/// The handlers a layer runs in tasks of their own: those whose client went away (a
/// disconnect, a timeout layer above), each running on to store its response for the
/// client's retry, and those streaming a response, writing on while their client reads.
/// A graceful shutdown waits for them after the server stopped taking requests, so that
/// none is cut off between its effect and its record.
///
/// Handlers still answering a connected client with a whole response are the server's to
/// wait for (axum's and hyper's graceful shutdown wait for open connections).
///
/// ```no_run
/// use axum::{Router, routing::post};
/// use idem_core::{Idempotency, MemoryStore};
/// use idem_http::IdempotencyLayer;
///
/// # async fn run() -> std::io::Result<()> {
/// let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| Ok(idem_http::scope::path(parts).to_owned()));
/// let handlers = layer.handlers();
/// let app: Router = Router::new().route("/payments", post(|| async { "charged" })).layer(layer);
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// axum::serve(listener, app)
///     .with_graceful_shutdown(async { let _ = tokio::signal::ctrl_c().await; })
///     .await?;
/// handlers.wait().await; // every detached handler stored its answer
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Handlers {
    tracker: TaskTracker,
    /// Those whose client went away, among them.
    orphans: TaskTracker,
}

impl Handlers {
    /// Waits until the handlers detached so far have finished, and any detached while
    /// one of them still runs.
    ///
    /// - Several waits may run at once; each returns once no handler runs, and a wait
    ///   cancelled (by a timeout, say) leaves the others waiting as before.
    /// - The layer may serve on after a wait: handlers detached later are tracked and
    ///   waited for by the next `wait`.
    pub async fn wait(&self) {
        // Closing only lets `wait` return once the tracker is empty: a closed tracker
        // still tracks what is detached later, so it is never reopened (reopening under a
        // second waiter would leave that waiter waiting forever).
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// How many handlers run in tasks of their own now.
    pub fn running(&self) -> usize {
        self.tracker.len()
    }

    /// How many of them run for a client that went away: work no request counts any
    /// more, which a server that bounds its requests at once may count as its own.
    ///
    /// ```
    /// # let layer = idem_http::IdempotencyLayer::new(idem_core::Idempotency::new(idem_core::MemoryStore::new()), |parts| Ok(idem_http::scope::path(parts).to_owned()));
    /// let handlers = layer.handlers();
    /// assert_eq!(handlers.orphaned(), 0);
    /// assert!(handlers.orphaned() <= handlers.running());
    /// ```
    pub fn orphaned(&self) -> usize {
        self.orphans.len()
    }

    /// [`detach`](Self::detach) for a handler whose client went away.
    pub(crate) fn detach_orphan<F>(&self, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.detach(self.orphans.track_future(work));
    }

    /// Runs `work` to its end in a task of its own, counted until it ends.
    pub(crate) fn detach<F>(&self, work: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(self.tracker.track_future(work));
            }
            // No runtime (the last one shut down): nothing can run the rest. The key stays
            // held until its lease ends, then a retry takes over.
            Err(_) => tracing::warn!("no runtime to finish a handler whose client went away"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::Handlers;

    /// Detaches a handler that runs until the returned sender is used or dropped.
    fn detach_gated(handlers: &Handlers) -> oneshot::Sender<()> {
        let (release, released) = oneshot::channel::<()>();
        handlers.detach(async move {
            let _ = released.await;
        });
        release
    }

    #[tokio::test]
    async fn a_wait_cancelled_beside_another_leaves_the_other_to_return() {
        let handlers = Handlers::default();
        let release = detach_gated(&handlers);
        let other = handlers.wait();
        tokio::pin!(other);
        // Both waits start while the handler runs; the second is then cancelled.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut other)
                .await
                .is_err()
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(50), handlers.wait())
                .await
                .is_err()
        );
        drop(release);
        tokio::time::timeout(Duration::from_secs(10), other)
            .await
            .expect("the wait left running returns once the last handler ends");
        assert_eq!(handlers.running(), 0);
    }

    #[tokio::test]
    async fn a_handler_detached_after_a_wait_is_waited_for_by_the_next() {
        let handlers = Handlers::default();
        tokio::time::timeout(Duration::from_secs(10), handlers.wait())
            .await
            .expect("a wait with no handler returns at once");
        let release = detach_gated(&handlers);
        assert_eq!(handlers.running(), 1);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), handlers.wait())
                .await
                .is_err(),
            "a wait returned while a handler still ran"
        );
        drop(release);
        tokio::time::timeout(Duration::from_secs(10), handlers.wait())
            .await
            .expect("the wait returns once the handler ends");
        assert_eq!(handlers.running(), 0);
    }
}
