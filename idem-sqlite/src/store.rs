//! `SqliteStore`: the state machine applied inside `BEGIN IMMEDIATE` transactions.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::machine::{self, Transition};
use idem_core::{
    Clock, Key, Record, Store, StoreError, SystemClock, Timestamp, key::StepName, record::Lease,
    store::ClaimOutcome, store::ClaimRequest, store::Completion, store::Operation,
    store::RenewOutcome, store::WriteOutcome,
};
use rusqlite::{Connection, OpenFlags, TransactionBehavior, params};

use crate::connection::ConnectionThread;
use crate::errors::{RowError, map};
use crate::{rows, schema};

const SELECT_PURGEABLE: &str = include_str!("../sql/select_purgeable.sql");
const DELETE_RECORD: &str = include_str!("../sql/delete_record.sql");
const DELETE_STEPS: &str = include_str!("../sql/delete_steps.sql");

/// How long a transition waits for another connection's write lock by default.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// An idem [`Store`] in a SQLite database: a file shared by any number of processes, or
/// memory.
///
/// - Every transition is one `BEGIN IMMEDIATE` transaction that reads the record, applies
///   the state machine ([`idem_core::machine`]) and writes the result, so concurrent
///   claims from threads or processes serialise on SQLite's write lock.
/// - A claim first reads in a transaction that takes no lock (WAL mode): a replay, a
///   mismatch or another attempt in flight is answered there, without waiting for a
///   writer on another connection or in another process. Only a claim that writes takes
///   the write lock. The store's own calls still run one at a time on its connection, so
///   a replay queued behind this store's own write waits for that write.
/// - File databases use WAL mode, `synchronous = FULL` (a committed result survives a power
///   cut) and a busy timeout (default 5 s, then a retryable [`StoreError::Busy`]).
/// - rusqlite is blocking, so each store owns one connection on a thread of its own; async
///   callers never block the executor. Clones share that connection.
/// - Time is this process's clock (injectable with [`SqliteStoreBuilder::clock`]), so
///   processes sharing a file should run on machines with synchronised clocks.
///
/// ```
/// use idem_core::{Fingerprint, Idempotency, Key, done};
/// use idem_sqlite::SqliteStore;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// # let dir = std::env::temp_dir().join(format!("idem-sqlite-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// let store = SqliteStore::open(dir.join("idem.db"))?;
/// let idem = Idempotency::new(store);
/// let key = Key::new("acct_42/payments.create", "order-1187")?;
/// let outcome = idem
///     .execute(&key, Fingerprint::of_bytes("amount=500"), |_ctx| async {
///         done("charged".to_string())
///     })
///     .await?;
/// # let _ = outcome;
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    connection: ConnectionThread,
    clock: Arc<dyn Clock>,
    location: Arc<str>,
}

/// Settings for opening a [`SqliteStore`]; see [`SqliteStore::builder`].
#[must_use = "call open() to open the store"]
pub struct SqliteStoreBuilder {
    path: Option<PathBuf>,
    busy_timeout: Duration,
    clock: Arc<dyn Clock>,
}

impl SqliteStoreBuilder {
    /// How long a transition waits for another connection's write lock before it fails
    /// with a retryable [`StoreError::Busy`] (default 5 s).
    ///
    /// A claim's first read waits under the same bound only where reads can be locked
    /// out: never in WAL mode (files), but in a database whose journal could not be set
    /// to WAL a reader waits for a writer's commit, and a claim may then wait twice.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// The clock transitions read (default: the system clock). Tests pass a
    /// [`ManualClock`](idem_core::ManualClock).
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Opens (creating when missing) the database and idem's tables.
    ///
    /// # Errors
    /// [`StoreError::Misconfigured`] when the file cannot be opened or was written by a
    /// newer idem; [`StoreError::Busy`] when another process holds the lock too long.
    pub fn build(self) -> Result<SqliteStore, StoreError> {
        let setup = |err| map(Operation::Setup, err);
        let (connection, location) = match &self.path {
            Some(path) => {
                let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
                    | OpenFlags::SQLITE_OPEN_CREATE
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX
                    | OpenFlags::SQLITE_OPEN_URI;
                let connection = Connection::open_with_flags(path, flags).map_err(setup)?;
                (connection, path.display().to_string())
            }
            None => (
                Connection::open_in_memory().map_err(setup)?,
                ":memory:".to_owned(),
            ),
        };
        connection.busy_timeout(self.busy_timeout).map_err(setup)?;
        if self.path.is_some() {
            // WAL lets readers run beside the writer; FULL makes each commit durable.
            connection
                .pragma_update(None, "journal_mode", "WAL")
                .map_err(setup)?;
            connection
                .pragma_update(None, "synchronous", "FULL")
                .map_err(setup)?;
        }
        let mut connection = connection;
        schema::migrate(&mut connection)?;
        let thread =
            ConnectionThread::spawn(connection).map_err(|err| StoreError::Unavailable {
                operation: Operation::Setup,
                source: err.into(),
            })?;
        Ok(SqliteStore {
            connection: thread,
            clock: self.clock,
            location: location.into(),
        })
    }
}

impl fmt::Debug for SqliteStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStoreBuilder")
            .field("path", &self.path)
            .field("busy_timeout", &self.busy_timeout)
            .field("clock", &self.clock)
            .finish()
    }
}

impl SqliteStore {
    /// Opens (creating when missing) a database file with the default settings.
    ///
    /// A path that starts with `file:` is read as an SQLite URI (`file:data/idem.db`),
    /// so that SQLite's URI parameters can be given here; a `sqlite://` URL
    /// ([`SqliteLocation`](crate::SqliteLocation)) takes none.
    ///
    /// # Errors
    /// See [`SqliteStoreBuilder::build`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::builder(path).build()
    }

    /// A private in-memory database: gone when the last clone of the store is dropped.
    ///
    /// # Errors
    /// See [`SqliteStoreBuilder::build`].
    pub fn open_in_memory() -> Result<Self, StoreError> {
        Self::builder_in_memory().build()
    }

    /// Settings for a database file.
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            path: Some(path.as_ref().to_owned()),
            ..Self::builder_in_memory()
        }
    }

    /// Settings for a private in-memory database.
    pub fn builder_in_memory() -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            path: None,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            clock: Arc::new(SystemClock),
        }
    }

    /// Marks the key completed inside the caller's own transaction, so that business rows
    /// written in the same transaction and the key's completion commit together, or
    /// neither does.
    ///
    /// - `completion` comes from `Context::prepare_completion` (idem-core's driver)
    ///   inside the work: the bytes are exactly those the driver stores, and once the
    ///   transaction commits the driver answers with exactly that value (a heartbeat that
    ///   meanwhile finds the record completed does not turn it into a lost lease).
    /// - Same rules as [`Store::complete`]: fenced by the lease; `Fenced` changes nothing,
    ///   and the caller should roll back.
    /// - `tx` must be a transaction on the same database file, begun with
    ///   `TransactionBehavior::Immediate` so that the fence check and the write cannot
    ///   be interleaved with another writer.
    /// - If the transaction rolls back, the record stays in progress under the lease, and
    ///   is claimable again once the lease is released or expires.
    ///
    /// ```
    /// use idem_core::{Fingerprint, Idempotency, Key, WorkError, store::WriteOutcome};
    /// use idem_sqlite::SqliteStore;
    /// use rusqlite::{Connection, TransactionBehavior};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let dir = std::env::temp_dir().join(format!("idem-sqlite-doc-tx-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir)?;
    /// let path = dir.join("shop.db");
    /// let idem = Idempotency::new(SqliteStore::open(&path)?);
    /// let key = Key::new("shop/checkout", "order-7")?;
    ///
    /// let outcome = idem
    ///     .execute(&key, Fingerprint::of_bytes("amount=500"), |ctx| {
    ///         let store = idem.store().clone();
    ///         let path = path.clone();
    ///         async move {
    ///             let receipt = "debited order-7".to_string();
    ///             let completion = ctx.prepare_completion(&receipt)?;
    ///             let mut conn = Connection::open(&path).map_err(|e| WorkError::Retryable(e.to_string()))?;
    ///             conn.execute("CREATE TABLE IF NOT EXISTS ledger (order_id TEXT, cents INTEGER)", [])
    ///                 .map_err(|e| WorkError::Retryable(e.to_string()))?;
    ///             let tx = conn
    ///                 .transaction_with_behavior(TransactionBehavior::Immediate)
    ///                 .map_err(|e| WorkError::Retryable(e.to_string()))?;
    ///             tx.execute("INSERT INTO ledger VALUES ('order-7', 500)", [])
    ///                 .map_err(|e| WorkError::Retryable(e.to_string()))?;
    ///             match store.complete_in(&tx, &completion) {
    ///                 // The debit and the idempotency record land together.
    ///                 Ok(WriteOutcome::Applied) => tx.commit().map_err(|e| WorkError::Unknown(e.to_string()))?,
    ///                 // Another attempt owns the key: roll back, nothing happened here.
    ///                 _ => return Err(WorkError::Retryable("lost the key".to_string())),
    ///             }
    ///             Ok(receipt)
    ///         }
    ///     })
    ///     .await?;
    /// assert_eq!(outcome.value().as_deref(), Some("debited order-7"));
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// A [`StoreError`] when SQLite fails; roll the transaction back then.
    pub fn complete_in(
        &self,
        tx: &rusqlite::Transaction<'_>,
        completion: &Completion,
    ) -> Result<WriteOutcome, StoreError> {
        let lease = completion.lease();
        let outcome = rows::apply(tx, &lease.key, self.clock.now(), |record, now| {
            Ok(machine::complete(record, lease, completion.bytes(), now))
        })
        .map_err(|err| err.into_store_error(Operation::Complete))?;
        if outcome == WriteOutcome::Applied {
            completion.written();
        }
        Ok(outcome)
    }

    /// The store's clock.
    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Runs `job` on the store's connection thread.
    pub(crate) async fn run<T, F>(&self, operation: Operation, job: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.connection.run(operation, job).await
    }

    /// Runs one transition in its own `BEGIN IMMEDIATE` transaction on the store's thread.
    pub(crate) async fn transition<O, F>(
        &self,
        operation: Operation,
        key: &Key,
        step: F,
    ) -> Result<O, StoreError>
    where
        O: Send + 'static,
        F: FnOnce(Option<&Record>, Timestamp) -> Result<Transition<O>, StoreError> + Send + 'static,
    {
        let (key, clock) = (key.clone(), Arc::clone(&self.clock));
        self.connection
            .run(operation, move |connection| {
                apply_locked(connection, operation, &key, &*clock, step)
            })
            .await
    }
}

/// One `BEGIN IMMEDIATE` transaction: reads `key`'s record, applies `step` and writes what
/// it returns.
fn apply_locked<O>(
    connection: &mut Connection,
    operation: Operation,
    key: &Key,
    clock: &dyn Clock,
    step: impl FnOnce(Option<&Record>, Timestamp) -> Result<Transition<O>, StoreError>,
) -> Result<O, StoreError> {
    let run = || -> Result<O, RowError> {
        let tx = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Read the clock once the write lock is held, so time moves forward with the
        // order of transactions.
        let outcome = rows::apply(&tx, key, clock.now(), step)?;
        tx.commit()?;
        Ok(outcome)
    };
    run().map_err(|err| err.into_store_error(operation).for_key(key))
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("location", &self.location)
            .field("clock", &self.clock)
            .finish()
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let request = request.clone();
        let clock = Arc::clone(&self.clock);
        self.connection
            .run(Operation::Claim, move |connection| {
                let key = request.key.clone();
                // First in a read transaction, which takes no lock in WAL mode: a claim
                // that writes nothing (a replay, a mismatch, another attempt in flight, a
                // retried claim's own lease) is answered from it without waiting for the
                // write lock another process may hold. The clock is read after the
                // snapshot began, and no lease or retention seen live at that later time
                // can have ended before it. A refusal (a takeover at the last token) is
                // about a lease seen ended, which another process may have renewed or
                // finished since the snapshot: the locked read decides it.
                let mut answer = || -> Result<Option<ClaimOutcome>, RowError> {
                    let tx = connection.transaction()?;
                    let existing = rows::read(&tx, &key)?;
                    let Ok(Transition { outcome, write }) =
                        machine::claim(existing.as_ref(), &request, clock.now())
                    else {
                        return Ok(None);
                    };
                    Ok(write.is_none().then_some(outcome))
                };
                match answer() {
                    Ok(Some(outcome)) => return Ok(outcome),
                    Ok(None) => {}
                    Err(err) => return Err(err.into_store_error(Operation::Claim).for_key(&key)),
                }
                // It writes: again under the write lock, from a read that no other writer
                // can change before this transaction commits.
                apply_locked(
                    connection,
                    Operation::Claim,
                    &key,
                    &*clock,
                    move |record, now| {
                        machine::claim(record, &request, now).map_err(StoreError::from)
                    },
                )
            })
            .await
    }

    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        let (lease, response) = (lease.clone(), response.to_vec());
        let key = lease.key.clone();
        self.transition(Operation::Complete, &key, move |record, now| {
            Ok(machine::complete(record, &lease, &response, now))
        })
        .await
    }

    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        let (lease, response) = (lease.clone(), response.to_vec());
        let key = lease.key.clone();
        self.transition(Operation::Fail, &key, move |record, now| {
            Ok(machine::fail(record, &lease, &response, now))
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        let lease = lease.clone();
        let key = lease.key.clone();
        self.transition(Operation::Release, &key, move |record, now| {
            Ok(machine::release(record, &lease, now))
        })
        .await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        let lease = lease.clone();
        let key = lease.key.clone();
        self.transition(Operation::Renew, &key, move |record, now| {
            Ok(machine::renew(record, &lease, extend, now))
        })
        .await
    }

    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        let (lease, step, value) = (lease.clone(), step.clone(), value.to_vec());
        let key = lease.key.clone();
        self.transition(Operation::Checkpoint, &key, move |record, now| {
            Ok(machine::checkpoint(record, &lease, &step, &value, now))
        })
        .await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let (key, clock) = (key.clone(), Arc::clone(&self.clock));
        self.connection
            .run(Operation::Get, move |connection| {
                // One read transaction: the record and its steps from one snapshot, even
                // while another process writes between the two reads.
                let mut read = || -> Result<Option<Record>, crate::errors::RowError> {
                    let tx = connection.transaction()?;
                    rows::read(&tx, &key)
                };
                let record =
                    read().map_err(|err| err.into_store_error(Operation::Get).for_key(&key))?;
                Ok(machine::visible(record.as_ref(), clock.now()).cloned())
            })
            .await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let clock = Arc::clone(&self.clock);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.connection
            .run(Operation::PurgeExpired, move |connection| {
                let mut purge = || -> Result<usize, rusqlite::Error> {
                    let tx =
                        connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
                    let now = i64::try_from(clock.now().as_unix_millis()).unwrap_or(i64::MAX);
                    let doomed: Vec<(String, String)> = tx
                        .prepare_cached(SELECT_PURGEABLE)?
                        .query_map(params![now, limit], |row| Ok((row.get(0)?, row.get(1)?)))?
                        .collect::<Result<_, _>>()?;
                    for (scope, key) in &doomed {
                        tx.prepare_cached(DELETE_RECORD)?
                            .execute(params![scope, key])?;
                        tx.prepare_cached(DELETE_STEPS)?
                            .execute(params![scope, key])?;
                    }
                    tx.commit()?;
                    Ok(doomed.len())
                };
                purge().map_err(|err| map(Operation::PurgeExpired, err))
            })
            .await
    }
}
