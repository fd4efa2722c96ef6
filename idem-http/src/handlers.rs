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
    /// Waits until every handler detached so far (and any detached meanwhile) has
    /// finished. One waiter at a time: a second, concurrent `wait` may not return until
    /// the first has.
    pub async fn wait(&self) {
        /// Opens the tracker again however the wait ends (a timeout may cancel it): the
        /// layer may serve on after a wait.
        struct Reopen<'a>(&'a TaskTracker);
        impl Drop for Reopen<'_> {
            fn drop(&mut self) {
                self.0.reopen();
            }
        }
        let _reopen = Reopen(&self.tracker);
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
