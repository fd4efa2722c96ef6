//! Concurrent histories on one database file, through several stores (each with its own
//! connections, as separate processes would have), are explained by the state machine.

mod common;

use std::sync::Arc;

use idem_core::Store;
use idem_sqlite::SqliteStore;
use idem_testkit::linearizability::{Checker, Workload, assert_linearizable};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn histories_over_one_file_are_linearizable() {
    let path = common::fresh_db_path();
    let stores: Vec<Arc<dyn Store>> = (0..3)
        .map(|_| Arc::new(SqliteStore::open(&path).expect("a database file")) as Arc<dyn Store>)
        .collect();
    let workload = Workload::default().operations(3_000);
    // The clock is read once the write lock is held, but the write is seen only after
    // the commit's fsync: a read from another connection meanwhile comes before it in
    // the order with a later time. Moments in any order, each within its call's window.
    let checked = assert_linearizable(
        &stores,
        &workload,
        Checker::default().moments_in_any_order(),
    )
    .await;
    println!("{checked:?}");
}
