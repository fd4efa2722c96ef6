//! Raw baseline for SQLite: the same two statements on a dedicated connection thread, as
//! the store runs them.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::oneshot;

use crate::target::{BoxError, Done, RESPONSE, Target};

type Job = Box<dyn FnOnce(&Connection) + Send>;

pub(crate) struct RawSqlite {
    jobs: mpsc::Sender<Job>,
    /// Hops to the connection thread: the in-process counterpart of a round trip.
    pub(crate) calls: Arc<AtomicU64>,
}

impl RawSqlite {
    pub(crate) fn open(path: &Path) -> Result<Self, BoxError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;
             CREATE TABLE IF NOT EXISTS raw (k TEXT PRIMARY KEY, state TEXT NOT NULL, response BLOB) WITHOUT ROWID;",
        )?;
        let (jobs, inbox) = mpsc::channel::<Job>();
        std::thread::spawn(move || {
            for job in inbox {
                job(&conn);
            }
        });
        Ok(Self {
            jobs,
            calls: Arc::default(),
        })
    }

    async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, BoxError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(Box::new(move |conn| {
                let _ = tx.send(job(conn));
            }))
            .map_err(|_| "connection thread gone")?;
        Ok(rx.await??)
    }
}

#[async_trait]
impl Target for RawSqlite {
    async fn execute(&self, key: &str) -> Result<Done, BoxError> {
        let k = key.to_owned();
        // Claim: insert, or read the row that is there; one hop to the connection thread,
        // as each of the store's transitions is.
        let (state, inserted): (String, bool) = self
            .run(move |conn| {
                let inserted = conn.execute(
                    "INSERT INTO raw (k, state) VALUES (?1, 'p') ON CONFLICT (k) DO NOTHING",
                    params![k],
                )? == 1;
                if inserted {
                    return Ok(("p".to_owned(), true));
                }
                let state = conn
                    .query_row("SELECT state FROM raw WHERE k = ?1", params![k], |row| {
                        row.get(0)
                    })
                    .optional()?
                    .unwrap_or_default();
                Ok((state, false))
            })
            .await?;
        if state == "c" {
            return Ok(Done::Replayed);
        }
        if !inserted {
            return Ok(Done::Busy);
        }
        let k = key.to_owned();
        self.run(move |conn| {
            conn.execute(
                "UPDATE raw SET state = 'c', response = ?2 WHERE k = ?1",
                params![k, RESPONSE],
            )
        })
        .await?;
        Ok(Done::Executed)
    }
}
