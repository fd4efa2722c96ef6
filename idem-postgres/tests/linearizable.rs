//! Concurrent histories on one table, through two stores with pools of their own, are
//! explained by the state machine, on the server's clock.
//!
//! `now()` is read when a statement starts, before it waits for a row lock that another
//! statement holds (through its commit's fsync), and a takeover's `ON CONFLICT` compares
//! it again after the wait: two writes may take effect in one order with times in the
//! other (`Checker::moments_in_any_order`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_core::Store;
use idem_postgres::PostgresStore;
use idem_postgres::sqlx::postgres::PgPoolOptions;
use idem_testkit::Namespace;
use idem_testkit::linearizability::{Checker, Workload, assert_linearizable};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn histories_on_one_table_are_linearizable() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh();
    let first = common::store_in(&url, table.as_str(), 4).await;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&url)
        .await
        .expect("connect to the test PostgreSQL");
    let second = PostgresStore::builder(pool)
        .table(table.as_str())
        .expect("a valid table name")
        .build();
    let stores: [Arc<dyn Store>; 2] = [Arc::new(first), Arc::new(second)];
    let workload = Workload::default().operations(3_000);
    let checker = Checker::default().moments_in_any_order();
    let checked = assert_linearizable(&stores, &workload, checker).await;
    println!("{checked:?}");
}
