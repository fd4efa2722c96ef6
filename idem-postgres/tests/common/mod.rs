//! A fresh table per store, so test cases run in parallel without seeing each other.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_postgres::PostgresStore;
use idem_postgres::sqlx::postgres::PgPoolOptions;

/// The server's address, or `None` to skip (a failure under `IDEM_REQUIRE_SERVICES=1`).
#[allow(dead_code)] // each test binary uses what it needs
pub(crate) fn url() -> Option<String> {
    idem_testkit::service_url("IDEM_TEST_POSTGRES_URL")
}

/// A store on a table no other test uses, over a pool of `connections`.
pub(crate) async fn fresh_store(url: &str, connections: u32) -> PostgresStore {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await
        .expect("connect to the test PostgreSQL");
    let table = format!(
        "idem_t{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    let store = PostgresStore::builder(pool)
        .table(&table)
        .expect("a valid table name")
        .build();
    store.migrate().await.expect("migrate");
    store
}
