//! A complete retried while its first try still holds the row lock: once the first try
//! commits, the retry finds its own result and answers Applied, not Fenced.

mod common;

use std::sync::{Arc, Mutex};

use idem_core::{Fingerprint, Heartbeat, Idempotency, Key, Outcome, State, Store, WorkError};
use idem_core::{StoreError, store::WriteOutcome};
use idem_postgres::PostgresStore;

/// Runs the work: complete inside a transaction holding the row lock, the same complete
/// retried on another connection meanwhile, then `commit` or roll back the first. Answers
/// what the retry answered.
async fn retry_beside_an_open_first_try(commit: bool) -> (PostgresStore, Key, WriteOutcome) {
    let url = common::url().expect("checked by the caller");
    let store = common::fresh_store(&url, 4).await;
    let idem = Idempotency::builder(store.clone())
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let key = Key::new("race", "retried-complete").unwrap();
    let retried: Arc<Mutex<Option<Result<WriteOutcome, StoreError>>>> = Arc::default();
    let outcome = idem
        .execute(&key, Fingerprint::of_bytes("500"), |ctx| {
            let (store, retried) = (store.clone(), Arc::clone(&retried));
            async move {
                let completion = ctx.prepare_completion(&"paid".to_owned())?;
                // The first try lands inside a transaction that holds the row lock...
                let mut tx = store.pool().begin().await.unwrap();
                assert_eq!(
                    store.complete_in(&mut tx, &completion).await.unwrap(),
                    WriteOutcome::Applied
                );
                let holder = common::backend_pid(&mut tx).await;
                // ...while the same complete, retried on another connection (its first
                // answer lost, say), waits for that lock.
                let retry = tokio::spawn({
                    let (store, lease) = (store.clone(), completion.lease().clone());
                    let bytes = completion.bytes().to_vec();
                    async move { store.complete(&lease, &bytes).await }
                });
                common::wait_until_blocked_by(&store, holder).await;
                if commit {
                    tx.commit().await.unwrap();
                } else {
                    tx.rollback().await.unwrap();
                }
                *retried.lock().unwrap() = Some(retry.await.unwrap());
                Ok::<_, WorkError<String>>("paid".to_owned())
            }
        })
        .await
        .unwrap();
    assert!(
        matches!(&outcome, Outcome::Completed { value, replayed: false } if value == "paid"),
        "{outcome:?}"
    );
    let retried = retried.lock().unwrap().take().expect("the retry ran");
    (store, key, retried.expect("the retry reached the store"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_complete_that_waited_for_its_first_try_is_applied() {
    if common::url().is_none() {
        return;
    }
    let (store, key, retried) = retry_beside_an_open_first_try(true).await;
    assert_eq!(
        retried,
        WriteOutcome::Applied,
        "a retried complete whose first try landed must be Applied"
    );
    let record = store.get(&key).await.unwrap().unwrap();
    assert_eq!(record.state, State::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_that_waited_for_a_rolled_back_try_writes_itself() {
    if common::url().is_none() {
        return;
    }
    let (store, key, retried) = retry_beside_an_open_first_try(false).await;
    assert_eq!(retried, WriteOutcome::Applied);
    let record = store.get(&key).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        State::Completed,
        "the retry stored the result"
    );
    assert_eq!(record.response.as_deref(), Some(&b"\"paid\""[..]));
}
