//! Completing inside the caller's own transaction: business rows and the key's completion
//! commit together, or neither does.

mod common;

use std::time::Duration;

use idem_core::{
    Context, Fingerprint, Heartbeat, Idempotency, Key, Outcome, State, Store, WorkError,
    record::Lease, store::ClaimOutcome, store::ClaimRequest, store::WriteOutcome,
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

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Receipt {
    order: String,
    cents: u64,
}

fn receipt(order: &str) -> Receipt {
    Receipt {
        order: order.into(),
        cents: 500,
    }
}

/// What the work does in each test: debit the ledger and complete the key in one
/// transaction; `after_complete` runs while the transaction is still open.
async fn debit_in_one_transaction<F, Fut>(
    store: &SqliteStore,
    path: &std::path::Path,
    ctx: &Context,
    order: &str,
    commit: bool,
    after_complete: F,
) -> Result<Receipt, WorkError<String>>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let receipt = receipt(order);
    let completion = ctx.prepare_completion(&receipt)?;
    let mut conn = ledger(path);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("INSERT INTO ledger VALUES (?1, 500)", [order])
        .unwrap();
    match store.complete_in(&tx, &completion).unwrap() {
        WriteOutcome::Applied => {}
        WriteOutcome::Fenced => {
            tx.rollback().unwrap();
            return Err(WorkError::Retryable("another attempt owns the key".into()));
        }
    }
    after_complete().await;
    if commit {
        tx.commit().unwrap();
        Ok(receipt)
    } else {
        tx.rollback().unwrap();
        Err(WorkError::Retryable("rolled back".into()))
    }
}

/// Executes the debit `times` times on `key`: the first runs, the others replay it.
async fn debit_then_replay(
    idem: &Idempotency<SqliteStore>,
    store: &SqliteStore,
    path: &std::path::Path,
    key: &Key,
    order: &str,
    times: usize,
) {
    for attempt in 0..times {
        let outcome = idem
            .execute(key, Fingerprint::of_bytes("500"), |ctx| {
                let (store, path) = (store.clone(), path.to_path_buf());
                let order = order.to_owned();
                async move {
                    debit_in_one_transaction(&store, &path, &ctx, &order, true, || async {}).await
                }
            })
            .await
            .unwrap();
        assert_eq!(
            outcome,
            Outcome::Completed {
                value: receipt(order),
                replayed: attempt > 0
            }
        );
    }
}

#[tokio::test]
async fn business_rows_and_completion_commit_together() {
    let path = common::fresh_db_path();
    let store = SqliteStore::open(&path).unwrap();
    let idem = Idempotency::new(store.clone());
    let key = Key::new("shop/checkout", "order-1").unwrap();
    debit_then_replay(&idem, &store, &path, &key, "order-1", 3).await;
    assert_eq!(debits(&ledger(&path)), 1, "one debit for three executions");
    let record = store.get(&key).await.unwrap().unwrap();
    assert_eq!(record.state, State::Completed);
    let stored: Receipt = serde_json::from_slice(record.response.as_deref().unwrap()).unwrap();
    assert_eq!(
        stored,
        receipt("order-1"),
        "the bytes the driver would store"
    );
}

#[tokio::test]
async fn a_rollback_leaves_the_key_claimable_again() {
    let path = common::fresh_db_path();
    let store = SqliteStore::open(&path).unwrap();
    let idem = Idempotency::new(store.clone());
    let key = Key::new("shop/checkout", "order-2").unwrap();
    let outcome = idem
        .execute(&key, Fingerprint::of_bytes("500"), |ctx| {
            let (store, path) = (store.clone(), path.clone());
            async move {
                debit_in_one_transaction(&store, &path, &ctx, "order-2", false, || async {}).await
            }
        })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Retryable("rolled back".into()));
    assert_eq!(debits(&ledger(&path)), 0, "the business row rolled back");
    // The completion rolled back too, and the release (no step was checkpointed) forgot
    // the key: nothing is left of the first try.
    assert_eq!(
        store.get(&key).await.unwrap(),
        None,
        "so did the completion"
    );
    // The driver released the key for the retryable error: a retry runs at once.
    let outcome = idem
        .execute(&key, Fingerprint::of_bytes("500"), |ctx| {
            let (store, path) = (store.clone(), path.clone());
            async move {
                assert!(
                    !ctx.resumed(),
                    "released and forgotten: the retry runs afresh"
                );
                debit_in_one_transaction(&store, &path, &ctx, "order-2", true, || async {}).await
            }
        })
        .await
        .unwrap();
    assert_eq!(outcome.value(), Some(receipt("order-2")));
    assert_eq!(debits(&ledger(&path)), 1);
}

#[tokio::test]
async fn a_stale_owner_cannot_complete_in_its_transaction() {
    let path = common::fresh_db_path();
    let store = SqliteStore::open(&path).unwrap();
    let idem = Idempotency::new(store.clone());
    let key = Key::new("shop/checkout", "order-3").unwrap();
    let outcome = idem
        .execute(&key, Fingerprint::of_bytes("500"), |ctx| {
            let (store, path, key) = (store.clone(), path.clone(), key.clone());
            async move {
                // Meanwhile the lease ends and another attempt takes the key over.
                assert_eq!(
                    store.release(&ctx.lease()).await.unwrap(),
                    WriteOutcome::Applied
                );
                let _owner = claim(&store, &key).await;
                debit_in_one_transaction(&store, &path, &ctx, "order-3", true, || async {}).await
            }
        })
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Retryable("another attempt owns the key".into()),
        "fenced: the business rows were rolled back"
    );
    assert_eq!(debits(&ledger(&path)), 0);
}

/// A heartbeat that ticks between `complete_in` and `COMMIT` must neither stall
/// the work (its renewal waits for the write lock the work holds) nor turn the committed
/// result into a lost lease.
#[tokio::test]
async fn a_heartbeat_inside_the_transaction_neither_stalls_nor_loses_the_result() {
    let path = common::fresh_db_path();
    // A busy timeout longer than the test's own bound: a renewal that stalls the work
    // would show as a hang, not as a slow pass.
    let store = SqliteStore::builder(&path)
        .busy_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(5))
        .heartbeat(Heartbeat::Every(Duration::from_millis(20)))
        .build()
        .unwrap();
    let key = Key::new("shop/checkout", "order-5").unwrap();
    let execution = idem.execute(&key, Fingerprint::of_bytes("500"), |ctx| {
        let (store, path) = (store.clone(), path.clone());
        async move {
            debit_in_one_transaction(&store, &path, &ctx, "order-5", true, || {
                // Several beats fall inside the open transaction.
                tokio::time::sleep(Duration::from_millis(150))
            })
            .await
        }
    });
    let outcome = tokio::time::timeout(Duration::from_secs(10), execution)
        .await
        .expect("the work was stalled by a heartbeat waiting for its own lock")
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            value: receipt("order-5"),
            replayed: false
        },
        "the result committed in the work's transaction is the answer"
    );
    assert_eq!(debits(&ledger(&path)), 1);
}

#[tokio::test]
async fn an_encrypted_completion_in_the_callers_transaction_is_ciphertext_and_replays() {
    let path = common::fresh_db_path();
    let store = SqliteStore::open(&path).unwrap();
    let idem = Idempotency::builder(store.clone())
        .codec(idem_core::Aes256GcmCodec::new(1, [5; 32]))
        .build()
        .unwrap();
    let key = Key::new("shop/checkout", "order-sealed").unwrap();
    debit_then_replay(&idem, &store, &path, &key, "order-sealed", 2).await;
    let record = store.get(&key).await.unwrap().unwrap();
    let stored = record.response.unwrap();
    assert!(
        !stored.windows(12).any(|w| w == b"order-sealed"),
        "the completion written in the caller's transaction is encrypted too"
    );
    assert_eq!(debits(&ledger(&path)), 1);
}

/// The driver answers with the result the work's transaction committed, without a
/// completion of its own: here the work goes on past the result's retention, so the record
/// has expired by the time it returns, and a completion sent then would find no lease to
/// fence it by.
#[tokio::test]
async fn the_committed_result_is_the_answer_after_its_record_expired() {
    let path = common::fresh_db_path();
    let store = SqliteStore::open(&path).unwrap();
    let idem = Idempotency::builder(store.clone())
        // Long enough for the work's set-up on a busy machine (the record must still be
        // this owner's when the work completes it), and no heartbeat to move it.
        .lease(Duration::from_secs(1))
        .retention(Duration::from_secs(1))
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let key = Key::new("shop/checkout", "order-6").unwrap();
    let outcome = idem
        .execute(&key, Fingerprint::of_bytes("500"), |ctx| {
            let (store, path) = (store.clone(), path.clone());
            async move {
                let receipt =
                    debit_in_one_transaction(&store, &path, &ctx, "order-6", true, || async {})
                        .await?;
                tokio::time::sleep(Duration::from_millis(1_300)).await;
                Ok(receipt)
            }
        })
        .await
        .expect("the committed result is the answer");
    assert_eq!(
        outcome,
        Outcome::Completed {
            value: receipt("order-6"),
            replayed: false
        }
    );
    assert_eq!(debits(&ledger(&path)), 1);
}
