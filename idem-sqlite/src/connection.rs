//! The thread that owns the SQLite connection, so blocking calls never run on the async
//! executor.

use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread;

use idem_core::{StoreError, store::Operation};
use rusqlite::Connection;
use tokio::sync::oneshot;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// Sends closures to a dedicated thread that owns one connection, in order. The thread
/// ends when the last handle is dropped.
#[derive(Clone, Debug)]
pub(crate) struct ConnectionThread {
    jobs: mpsc::Sender<Job>,
}

impl ConnectionThread {
    pub(crate) fn spawn(mut connection: Connection) -> std::io::Result<Self> {
        let (jobs, inbox) = mpsc::channel::<Job>();
        thread::Builder::new()
            .name("idem-sqlite".into())
            .spawn(move || {
                for job in inbox {
                    // A panicking job drops its reply (its caller sees an error); the
                    // connection stays usable because every job's transaction rolls back
                    // when dropped.
                    let _ = panic::catch_unwind(AssertUnwindSafe(|| job(&mut connection)));
                }
            })?;
        Ok(Self { jobs })
    }

    /// Runs `job` on the connection's thread and waits for its answer without blocking.
    pub(crate) async fn run<T, F>(&self, operation: Operation, job: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(move |connection| {
            // The caller may have gone (its future was dropped): nobody to answer.
            let _ = reply.send(job(connection));
        });
        let gone = || StoreError::Unavailable {
            operation,
            source: "the SQLite connection thread has stopped".into(),
        };
        self.jobs.send(job).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}
