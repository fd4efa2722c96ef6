//! The SQLite side of the effects: the `ledger` the workers apply orders to, the `runs`
//! the scheduled job writes, and the one transaction that holds an effect and, with idem,
//! the key's completion.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{BoxError, Context, store::WriteOutcome};
use idem_sqlite::SqliteStore;
use idem_sqlite::rusqlite::{Connection, Transaction, TransactionBehavior, params};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Mode;

/// One row per effect: an order applied, a slot run. `pid` is the process that wrote it.
const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
CREATE TABLE IF NOT EXISTS ledger (
    effect   INTEGER PRIMARY KEY,
    order_id TEXT    NOT NULL,
    cents    INTEGER NOT NULL,
    pid      INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    run      INTEGER PRIMARY KEY,
    slot_ms  INTEGER NOT NULL,
    pid      INTEGER NOT NULL
);
";

/// How long a write waits for another process's lock: every worker of a queue writes to
/// the same file, and SQLite lets one write at a time.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens (creating when missing) a database with the ledger's tables.
pub(crate) fn open(path: &Path) -> Result<Connection, idem_sqlite::rusqlite::Error> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

/// Makes a fresh database at `path` for `mode` (removing what an earlier run in `--dir`
/// left): the ledger's tables, and with idem the store's, before any child opens the
/// file. Returns the parent's connection, to watch and audit.
pub(crate) fn create(path: &Path, mode: Mode) -> Result<Connection, BoxError> {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let conn = open(path).map_err(|err| format!("cannot create {}: {err}", path.display()))?;
    if mode == Mode::Protected {
        SqliteStore::open(path)
            .map_err(|err| format!("cannot create idem's tables in {}: {err}", path.display()))?;
    }
    Ok(conn)
}

/// A process's handle on its ledger: the connection its effects are written on, and with
/// idem the store on the same file, whose completion joins the effect's transaction.
#[derive(Clone)]
pub(crate) struct Ledger {
    conn: Arc<Mutex<Connection>>,
    store: Option<SqliteStore>,
}

/// What applying an order returns, and what idem stores and replays.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub(crate) struct Receipt {
    /// The order.
    pub(crate) order: String,
    /// Its amount.
    pub(crate) cents: u64,
    /// The ledger row that applied it.
    pub(crate) effect: i64,
}

impl Ledger {
    /// The ledger at `path`; `store` (an idem store on the same file) for protected work.
    pub(crate) fn open(
        path: &Path,
        store: Option<SqliteStore>,
    ) -> Result<Self, idem_sqlite::rusqlite::Error> {
        Ok(Self {
            conn: Arc::new(Mutex::new(open(path)?)),
            store,
        })
    }

    /// Runs `write` in one `BEGIN IMMEDIATE` transaction and, inside an execution
    /// (`ctx`), marks the key completed in that same transaction: the effect and idem's
    /// record commit together or not at all, so a kill at any point leaves either both
    /// (a redelivery replays) or neither (a redelivery takes over and applies it).
    ///
    /// `None` when idem fenced the completion: another process took the key over after
    /// this one's lease ran out, and the effect is rolled back.
    pub(crate) async fn commit<T>(
        &self,
        ctx: Option<Context>,
        write: impl FnOnce(&Transaction<'_>) -> idem_sqlite::rusqlite::Result<T> + Send + 'static,
    ) -> Result<Option<T>, BoxError>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = conn
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let value = write(&tx)?;
            if let (Some(store), Some(ctx)) = (store, ctx) {
                let completion = ctx.prepare_completion(&value)?;
                if store.complete_in(&tx, &completion)? == WriteOutcome::Fenced {
                    return Ok(None);
                }
            }
            tx.commit()?;
            Ok(Some(value))
        })
        .await?
    }
}

/// Applies an order: one row in the ledger.
pub(crate) fn apply_order(
    tx: &Transaction<'_>,
    order: &str,
    cents: u64,
) -> idem_sqlite::rusqlite::Result<Receipt> {
    tx.execute(
        "INSERT INTO ledger (order_id, cents, pid) VALUES (?1, ?2, ?3)",
        params![order, cents as i64, std::process::id()],
    )?;
    Ok(Receipt {
        order: order.to_owned(),
        cents,
        effect: tx.last_insert_rowid(),
    })
}

/// Runs a slot of the scheduled job: one row in `runs`.
pub(crate) fn run_slot(tx: &Transaction<'_>, slot_ms: u64) -> idem_sqlite::rusqlite::Result<u64> {
    tx.execute(
        "INSERT INTO runs (slot_ms, pid) VALUES (?1, ?2)",
        params![slot_ms as i64, std::process::id()],
    )?;
    Ok(slot_ms)
}
