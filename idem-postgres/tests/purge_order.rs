//! The purge deletes the records that expired first, whatever order they lie in on disk.
//! Unordered, its batch came from wherever the plan began, and on a large table whose
//! statistics counted many expired rows that was a read of the table from its first page.
//! A purge larger than the store's batch deletes its limit exactly, and ends.

mod common;

use std::time::Duration;

use idem_core::{
    Fingerprint, Key, Store,
    store::{ClaimOutcome, ClaimRequest, WriteOutcome},
};
use idem_postgres::PostgresStore;
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_testkit::Namespace;

/// A completed record of `name`, kept a day.
async fn completed(store: &PostgresStore, name: &str) {
    let key = Key::new("acct_1/POST /payments", name).unwrap();
    let request = ClaimRequest::new(
        key,
        Fingerprint::of_bytes("500"),
        Duration::from_secs(30),
        Duration::from_secs(86_400),
    );
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await.unwrap() else {
        panic!("a new key is claimed");
    };
    assert_eq!(
        store.complete(&lease, b"receipt").await.unwrap(),
        WriteOutcome::Applied
    );
}

#[tokio::test]
async fn the_purge_deletes_the_oldest_expiry_first() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh();
    let table = table.as_str();
    let store = common::store_in(&url, table, 4).await;
    let names = ["a", "b", "c"];
    for name in names {
        completed(&store, name).await;
    }
    // Expired an hour, two and three ago, written in that order: each update writes a new
    // row version at the table's end, so on disk the latest expiry comes first.
    for (name, hours) in [("c", 1), ("b", 2), ("a", 3)] {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "UPDATE \"{table}\" SET expires_at = now() - interval '{hours} hours' WHERE key = '{name}'"
        )))
        .execute(store.pool())
        .await
        .unwrap();
    }
    let left = || async {
        let rows: Vec<(String,)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT key FROM \"{table}\" ORDER BY key"
        )))
        .fetch_all(store.pool())
        .await
        .unwrap();
        rows.into_iter().map(|(key,)| key).collect::<Vec<_>>()
    };
    assert_eq!(store.purge_expired(1).await.unwrap(), 1);
    assert_eq!(left().await, ["b", "c"], "the oldest expiry went first");
    assert_eq!(store.purge_expired(1).await.unwrap(), 1);
    assert_eq!(left().await, ["c"]);
    assert_eq!(store.purge_expired(5).await.unwrap(), 1);
    assert!(left().await.is_empty());
}

/// Past one batch (the store deletes 1 000 a statement), a purge deletes exactly its limit
/// and ends once it is met: a batch counted from the wrong side would delete more, and a
/// loop that asked for an empty batch would never end.
#[tokio::test]
async fn a_purge_across_batches_deletes_exactly_its_limit_and_ends() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh();
    let table = table.as_str();
    let store = common::store_in(&url, table, 4).await;
    for i in 0..2_500 {
        completed(&store, &format!("k{i}")).await;
    }
    sqlx::raw_sql(AssertSqlSafe(format!(
        "UPDATE \"{table}\" SET expires_at = now() - interval '1 hour'"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    let store = &store;
    let purge = |limit| async move {
        tokio::time::timeout(Duration::from_secs(60), store.purge_expired(limit))
            .await
            .expect("a purge ends once its limit is met")
            .unwrap()
    };
    assert_eq!(purge(1_500).await, 1_500, "a limit of a batch and a half");
    assert_eq!(purge(5_000).await, 1_000, "what was left");
    assert_eq!(purge(5_000).await, 0);
}
