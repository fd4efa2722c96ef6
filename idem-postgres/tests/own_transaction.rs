//! Completing inside the caller's sqlx transaction, and how errors are classified.

mod common;

use std::time::Duration;

use idem_core::{
    ClaimOutcome, ClaimRequest, Fingerprint, Key, Lease, State, Store, StoreError, WriteOutcome,
};
use idem_postgres::PostgresStore;
use idem_postgres::sqlx;

const LEASE: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

async fn setup(url: &str) -> (PostgresStore, String) {
    let store = common::fresh_store(url, 4).await;
    let ledger = format!("ledger_{}", std::process::id());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {ledger} (order_id text NOT NULL, cents bigint NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    (store, ledger)
}

async fn claim(store: &PostgresStore, key: &Key) -> Lease {
    let request = ClaimRequest::new(key.clone(), Fingerprint::of_bytes("500"), LEASE, DAY);
    match store.claim(&request).await.unwrap() {
        ClaimOutcome::Claimed { lease, .. } => lease,
        other => panic!("expected a claim, got {other:?}"),
    }
}

async fn debits(store: &PostgresStore, ledger: &str, order: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {ledger} WHERE order_id = $1"
    )))
    .bind(order)
    .fetch_one(store.pool())
    .await
    .unwrap()
}

async fn debit_and_complete(
    store: &PostgresStore,
    ledger: &str,
    order: &str,
    lease: &Lease,
    commit: bool,
) -> WriteOutcome {
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {ledger} VALUES ($1, 500)"
    )))
    .bind(order)
    .execute(&mut *tx)
    .await
    .unwrap();
    let outcome = store
        .complete_in(&mut tx, lease, b"\"receipt\"")
        .await
        .unwrap();
    if commit && outcome == WriteOutcome::Applied {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    outcome
}

#[tokio::test]
async fn business_rows_and_completion_commit_together() {
    let Some(url) = common::url() else { return };
    let (store, ledger) = setup(&url).await;
    let key = Key::new("shop/checkout", "order-1").unwrap();
    let lease = claim(&store, &key).await;
    assert_eq!(
        debit_and_complete(&store, &ledger, "order-1", &lease, true).await,
        WriteOutcome::Applied
    );
    assert_eq!(debits(&store, &ledger, "order-1").await, 1);
    let record = store.get(&key).await.unwrap().unwrap();
    assert_eq!(
        (record.state, record.response.as_deref()),
        (State::Completed, Some(&b"\"receipt\""[..]))
    );
    // The driver's own complete afterwards, by the same owner, finds it landed.
    assert_eq!(
        store.complete(&lease, b"\"receipt\"").await.unwrap(),
        WriteOutcome::Applied
    );
}

#[tokio::test]
async fn a_rollback_leaves_the_key_claimable_again() {
    let Some(url) = common::url() else { return };
    let (store, ledger) = setup(&url).await;
    let key = Key::new("shop/checkout", "order-2").unwrap();
    let lease = claim(&store, &key).await;
    assert_eq!(
        debit_and_complete(&store, &ledger, "order-2", &lease, false).await,
        WriteOutcome::Applied
    );
    assert_eq!(
        debits(&store, &ledger, "order-2").await,
        0,
        "the business row rolled back"
    );
    let record = store.get(&key).await.unwrap().unwrap();
    assert_eq!(
        (record.state, record.response),
        (State::InProgress, None),
        "so did the completion"
    );
    assert_eq!(store.release(&lease).await.unwrap(), WriteOutcome::Applied);
    let retry = ClaimRequest::new(key, Fingerprint::of_bytes("500"), LEASE, DAY);
    assert!(matches!(
        store.claim(&retry).await.unwrap(),
        ClaimOutcome::Claimed { resumed: true, .. }
    ));
}

#[tokio::test]
async fn a_stale_owner_cannot_complete_in_its_transaction() {
    let Some(url) = common::url() else { return };
    let (store, ledger) = setup(&url).await;
    let key = Key::new("shop/checkout", "order-3").unwrap();
    let stale = claim(&store, &key).await;
    assert_eq!(store.release(&stale).await.unwrap(), WriteOutcome::Applied);
    let _owner = claim(&store, &key).await;
    assert_eq!(
        debit_and_complete(&store, &ledger, "order-3", &stale, true).await,
        WriteOutcome::Fenced
    );
    assert_eq!(
        debits(&store, &ledger, "order-3").await,
        0,
        "the fenced debit was rolled back"
    );
}

#[tokio::test]
async fn a_missing_table_is_a_configuration_error() {
    let Some(url) = common::url() else { return };
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let store = PostgresStore::builder(pool)
        .table("never_migrated")
        .unwrap()
        .build();
    let request = ClaimRequest::new(
        Key::new("s", "k").unwrap(),
        Fingerprint::of_bytes("x"),
        LEASE,
        DAY,
    );
    let err = store.claim(&request).await.unwrap_err();
    assert!(matches!(err, StoreError::Misconfigured { .. }), "{err:?}");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error() {
    // Port 1 on loopback: nothing listens, the connection is refused at once.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy("postgres://postgres@127.0.0.1:1/postgres")
        .unwrap();
    let store = PostgresStore::new(pool);
    let request = ClaimRequest::new(
        Key::new("s", "k").unwrap(),
        Fingerprint::of_bytes("x"),
        LEASE,
        DAY,
    );
    let err = store.claim(&request).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
}
