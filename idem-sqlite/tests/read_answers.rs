//! Claims that write nothing (a replay, a mismatch, another attempt in flight, a retried
//! claim's own lease) are answered without the database's write lock, so they do not wait
//! behind a writer in another process; claims that write still take it.

mod common;

use std::time::Duration;

use idem_core::{
    Fingerprint, Key, Store, StoreError,
    store::{ClaimOutcome, ClaimRequest, WriteOutcome},
};
use idem_sqlite::SqliteStore;
use rusqlite::{Connection, TransactionBehavior};

const LEASE: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

fn key(name: &str) -> Key {
    Key::new("acct_7/POST /payments", name).unwrap()
}

fn request(key: &Key, body: &str) -> ClaimRequest {
    ClaimRequest::new(key.clone(), Fingerprint::of_bytes(body), LEASE, DAY)
}

/// A store whose writes give up at once when another connection holds the write lock.
fn impatient_store(path: &std::path::Path) -> SqliteStore {
    SqliteStore::builder(path)
        .busy_timeout(Duration::from_millis(1))
        .build()
        .unwrap()
}

/// Another process's writer: holds the write lock until dropped.
fn hold_write_lock(conn: &mut Connection) -> rusqlite::Transaction<'_> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap()
}

#[tokio::test]
async fn answers_that_write_nothing_do_not_wait_for_another_writer() {
    let path = common::fresh_db_path();
    let store = impatient_store(&path);

    let done = key("done");
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request(&done, "500")).await.unwrap()
    else {
        panic!("a new key is claimed");
    };
    assert_eq!(
        store.complete(&lease, b"receipt").await.unwrap(),
        WriteOutcome::Applied
    );
    let running = key("running");
    let running_claim = request(&running, "500");
    let ClaimOutcome::Claimed {
        lease: running_lease,
        ..
    } = store.claim(&running_claim).await.unwrap()
    else {
        panic!("a new key is claimed");
    };

    let mut other = Connection::open(&path).unwrap();
    let lock = hold_write_lock(&mut other);

    // Answered from a read while the lock is held elsewhere.
    match store.claim(&request(&done, "500")).await.unwrap() {
        ClaimOutcome::Replay { response, .. } => assert_eq!(response, b"receipt"),
        other => panic!("expected the replay, got {other:?}"),
    }
    assert!(matches!(
        store.claim(&request(&done, "900")).await.unwrap(),
        ClaimOutcome::Mismatch
    ));
    assert!(matches!(
        store.claim(&request(&running, "500")).await.unwrap(),
        ClaimOutcome::InFlight { .. }
    ));
    match store.claim(&running_claim).await.unwrap() {
        ClaimOutcome::Claimed { lease, .. } => assert_eq!(lease, running_lease),
        other => panic!("a retried claim gets its own lease back, got {other:?}"),
    }

    // A claim that writes still needs the lock: this one waits for it and gives up.
    let err = store.claim(&request(&key("new"), "500")).await.unwrap_err();
    assert!(matches!(err, StoreError::Busy { .. }), "{err:?}");

    drop(lock);
    assert!(matches!(
        store.claim(&request(&key("new"), "500")).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
}

#[tokio::test]
async fn an_expired_record_read_first_is_claimed_under_the_lock() {
    let path = common::fresh_db_path();
    let clock = idem_core::ManualClock::new();
    let store = SqliteStore::builder(&path)
        .clock(clock.clone())
        .build()
        .unwrap();
    let done = key("done");
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request(&done, "500")).await.unwrap()
    else {
        panic!("a new key is claimed");
    };
    assert_eq!(
        store.complete(&lease, b"receipt").await.unwrap(),
        WriteOutcome::Applied
    );

    // Past its retention the record is absent: the read finds nothing to answer and the
    // claim starts it afresh, with another fingerprint too.
    clock.advance(DAY + Duration::from_secs(1));
    match store.claim(&request(&done, "900")).await.unwrap() {
        ClaimOutcome::Claimed { resumed, .. } => assert!(!resumed),
        other => panic!("an expired record is claimed afresh, got {other:?}"),
    }
}
