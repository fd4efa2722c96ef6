//! Completing inside the caller's own transaction: business rows and the key's completion
//! commit together, or neither does.

mod common;

use std::time::Duration;

use idem_core::{
    ClaimOutcome, ClaimRequest, Fingerprint, Idempotency, Key, Lease, State, Store, WorkError,
    WriteOutcome,
};
use idem_sqlite::SqliteStore;
use rusqlite::{Connection, TransactionBehavior};

const LEASE: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

fn ledger(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS ledger (order_id TEXT NOT NULL, cents INTEGER NOT NULL)",
    )
    .unwrap();
    conn
}

fn debits(conn: &Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM ledger", [], |row| row.get(0))
        .unwrap()
}

async fn claim(store: &SqliteStore, key: &Key) -> Lease {
    let request = ClaimRequest::new(key.clone(), Fingerprint::of_bytes("500"), LEASE, DAY);
    match store.claim(&request).await.unwrap() {
        ClaimOutcome::Claimed { lease, .. } => lease,
        other => panic!("expected a claim, got {other:?}"),
    }
}

#[tokio::test]
async fn business_rows_and_completion_commit_together() {
    let path = common::fresh_db_path();
    let store = SqliteStore::open(&path).unwrap();
    let key = Key::new("shop/checkout", "order-1").unwrap();
    let lease = claim(&store, &key).await;

    let mut conn = ledger(&path);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("INSERT INTO ledger VALUES ('order-1', 500)", [])
        .unwrap();
    assert_eq!(
        store.complete_in(&tx, &lease, b"\"receipt\"").unwrap(),
        WriteOutcome::Applied
    );
    tx.commit().unwrap();

    assert_eq!(debits(&conn), 1);
    let record = store.get(&key).await.unwrap().unwrap();
    assert_eq!(record.state, State::Completed);
    assert_eq!(record.response.as_deref(), Some(&b"\"receipt\""[..]));
    // The store's own complete, retried by the same owner, finds it landed.
    assert_eq!(
        store.complete(&lease, b"\"receipt\"").await.unwrap(),
        WriteOutcome::Applied
    );
}

#[tokio::test]
async fn a_rollback_leaves_the_key_claimable_again() {
    let path = common::fresh_db_path();
    let store = SqliteStore::open(&path).unwrap();
    let key = Key::new("shop/checkout", "order-2").unwrap();
    let lease = claim(&store, &key).await;

    let mut conn = ledger(&path);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("INSERT INTO ledger VALUES ('order-2', 500)", [])
        .unwrap();
    assert_eq!(
        store.complete_in(&tx, &lease, b"\"receipt\"").unwrap(),
        WriteOutcome::Applied
    );
    tx.rollback().unwrap();

    assert_eq!(debits(&conn), 0, "the business row rolled back");
    let record = store.get(&key).await.unwrap().unwrap();
    assert_eq!(
        (record.state, record.response),
        (State::InProgress, None),
        "so did the completion"
    );
    // The owner gives the key up (the driver does this for a retryable error) and a retry
    // claims it at once.
    assert_eq!(store.release(&lease).await.unwrap(), WriteOutcome::Applied);
    let retry = ClaimRequest::new(key.clone(), Fingerprint::of_bytes("500"), LEASE, DAY);
    assert!(matches!(
        store.claim(&retry).await.unwrap(),
        ClaimOutcome::Claimed { resumed: true, .. }
    ));
}

#[tokio::test]
async fn a_stale_owner_cannot_complete_in_its_transaction() {
    let path = common::fresh_db_path();
    let store = SqliteStore::open(&path).unwrap();
    let key = Key::new("shop/checkout", "order-3").unwrap();
    let stale = claim(&store, &key).await;
    assert_eq!(store.release(&stale).await.unwrap(), WriteOutcome::Applied);
    let _owner = claim(&store, &key).await;

    let mut conn = ledger(&path);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("INSERT INTO ledger VALUES ('order-3', 500)", [])
        .unwrap();
    // Fenced: the caller must roll back its business rows.
    assert_eq!(
        store.complete_in(&tx, &stale, b"\"stale\"").unwrap(),
        WriteOutcome::Fenced
    );
    tx.rollback().unwrap();
    assert_eq!(debits(&conn), 0);
}

#[tokio::test]
async fn the_driver_and_complete_in_agree_on_the_result() {
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Receipt {
        order: String,
        cents: u64,
    }
    let path = common::fresh_db_path();
    let store = SqliteStore::open(&path).unwrap();
    let idem = Idempotency::new(store.clone());
    let key = Key::new("shop/checkout", "order-4").unwrap();
    for _ in 0..3 {
        let (store, path) = (store.clone(), path.clone());
        let done = idem
            .execute(&key, Fingerprint::of_bytes("500"), |ctx| async move {
                let receipt = Receipt {
                    order: "order-4".into(),
                    cents: 500,
                };
                let bytes = serde_json::to_vec(&receipt).unwrap();
                let mut conn = ledger(&path);
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .unwrap();
                tx.execute("INSERT INTO ledger VALUES ('order-4', 500)", [])
                    .unwrap();
                match store.complete_in(&tx, &ctx.lease(), &bytes).unwrap() {
                    WriteOutcome::Applied => tx.commit().unwrap(),
                    WriteOutcome::Fenced => return Err(WorkError::Retryable(())),
                }
                Ok(receipt)
            })
            .await
            .unwrap();
        assert_eq!(
            done.value,
            Receipt {
                order: "order-4".into(),
                cents: 500
            }
        );
    }
    assert_eq!(debits(&ledger(&path)), 1, "one debit for three executions");
}
