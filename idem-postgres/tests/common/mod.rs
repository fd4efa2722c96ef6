//! A fresh table per store, so test cases run in parallel without seeing each other.

use std::time::Duration;

use idem_postgres::PostgresStore;
use idem_postgres::sqlx::postgres::PgPoolOptions;
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_testkit::Namespace;

/// The server's address, or `None` to skip (a failure under `IDEM_REQUIRE_SERVICES=1`).
#[allow(dead_code)] // each test binary uses what it needs
pub(crate) fn url() -> Option<String> {
    idem_testkit::service_url("IDEM_TEST_POSTGRES_URL")
}

/// A migrated store on `table`, emptied first (a name may survive from an earlier run),
/// over a pool of `connections`.
pub(crate) async fn store_in(url: &str, table: &str, connections: u32) -> PostgresStore {
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await
        .expect("connect to the test PostgreSQL");
    let store = PostgresStore::builder(pool)
        .table(table)
        .expect("a valid table name")
        .build();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {}",
        quoted(table)
    )))
    .execute(store.pool())
    .await
    .expect("drop a stale table");
    store.migrate().await.expect("migrate");
    store
}

/// `table`'s name as SQL, each part quoted.
fn quoted(table: &str) -> String {
    table
        .split('.')
        .map(|part| format!("\"{part}\""))
        .collect::<Vec<_>>()
        .join(".")
}

/// Adds the four CHECK constraints that tables made by an older idem carry (a known
/// state, a 32-byte fingerprint, a 16-byte attempt, a token of at least 1): a statement
/// that wrote a value idem never writes fails on such a table.
#[allow(dead_code)]
pub(crate) async fn add_older_checks(store: &PostgresStore, table: &str) {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "ALTER TABLE {}
            ADD CHECK (octet_length(fingerprint) = 32),
            ADD CHECK (state IN ('in_progress', 'completed', 'failed')),
            ADD CHECK (token >= 1),
            ADD CHECK (octet_length(attempt) = 16)",
        quoted(table)
    )))
    .execute(store.pool())
    .await
    .expect("add the older CHECK constraints");
}

/// A store on a table no other test uses.
#[allow(dead_code)]
pub(crate) async fn fresh_store(url: &str, connections: u32) -> PostgresStore {
    store_in(url, Namespace::fresh().as_str(), connections).await
}

/// Waits (boundedly) until another session waits for a lock that the session `holder`
/// (its backend's process id, `SELECT pg_backend_pid()`) holds.
#[allow(dead_code)]
pub(crate) async fn wait_until_blocked_by(store: &PostgresStore, holder: i32) {
    for _ in 0..3000 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(holder)
        .fetch_one(store.pool())
        .await
        .expect("read pg_stat_activity");
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no session waited for the lock that session {holder} holds");
}

/// The process id of `session`'s backend, for [`wait_until_blocked_by`].
#[allow(dead_code)]
pub(crate) async fn backend_pid(session: &mut sqlx::PgConnection) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(session)
        .await
        .expect("read the backend's process id")
}

/// A transaction that holds the row lock of `scope`/`key` in `table` (as a session that
/// is about to write the row holds it), and its backend's process id.
#[allow(dead_code)]
pub(crate) async fn lock_row(
    store: &PostgresStore,
    table: &str,
    scope: &str,
    key: &str,
) -> (sqlx::Transaction<'static, sqlx::Postgres>, i32) {
    let mut holder = store.pool().begin().await.expect("begin");
    let locked = sqlx::query(AssertSqlSafe(format!(
        "SELECT 1 FROM {} WHERE scope = $1 AND key = $2 FOR UPDATE",
        quoted(table)
    )))
    .bind(scope)
    .bind(key)
    .execute(&mut *holder)
    .await
    .expect("lock the row");
    assert_eq!(
        locked.rows_affected(),
        1,
        "{scope}/{key}: the row is locked"
    );
    let pid = backend_pid(&mut holder).await;
    (holder, pid)
}
