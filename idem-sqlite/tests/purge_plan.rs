//! The purge reads its batch from the expiry index, oldest first, also after `ANALYZE`
//! gathered statistics that could make a scan of the whole table look cheaper.

mod common;

use std::time::Duration;

use idem_core::{
    Fingerprint, Key, Store,
    store::{ClaimOutcome, ClaimRequest},
};
use idem_sqlite::SqliteStore;
use rusqlite::Connection;

const SELECT_PURGEABLE: &str = include_str!("../sql/select_purgeable.sql");

#[tokio::test]
async fn the_purge_reads_the_expiry_index_after_analyze() {
    let path = common::fresh_db_path();
    let store = SqliteStore::open(&path).unwrap();
    // Many records expiring at once (1 ms), so the statistics say most rows match.
    for i in 0..500 {
        let key = Key::new("acct_1/POST /payments", format!("k{i}")).unwrap();
        let request = ClaimRequest::new(
            key,
            Fingerprint::of_bytes("500"),
            Duration::from_secs(30),
            Duration::from_millis(1),
        );
        let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await.unwrap() else {
            panic!("a new key is claimed");
        };
        let _ = store.complete(&lease, b"receipt").await.unwrap();
    }
    let conn = Connection::open(&path).unwrap();
    conn.execute_batch("ANALYZE").unwrap();
    let plan: Vec<String> = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {SELECT_PURGEABLE}"))
        .unwrap()
        .query_map(rusqlite::params![i64::MAX, 1000], |row| row.get(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        plan.iter()
            .any(|step| step.contains("USING INDEX idem_records_expires_at")),
        "{plan:?}"
    );
    assert!(
        !plan.iter().any(|step| step.contains("TEMP B-TREE")),
        "no sort: the index gives the order: {plan:?}"
    );
}
