//! How claims meet row locks on PostgreSQL. A claim that writes nothing takes none: a
//! replay and an in-flight answer come back while another session holds the record's row
//! lock. A claim whose write the record refuses once its lock is granted (the record
//! changed after the claim read it) answers from that record as it is now, and from no
//! other.

mod common;

use std::time::Duration;

use idem_core::store::{ClaimOutcome, ClaimRequest, WriteOutcome};
use idem_core::{Fingerprint, Key, Store};
use idem_postgres::{
    PostgresStore,
    sqlx::{self, AssertSqlSafe},
};
use idem_testkit::Namespace;

const HOUR: Duration = Duration::from_secs(3600);

/// Far above any answer read without a lock on a busy machine; a claim waiting for the
/// lock would wait until the holder's transaction ends.
const PATIENCE: Duration = Duration::from_secs(30);

/// A claim of `scope`/`name` with the test's fingerprint; each request carries an attempt
/// of its own, so a second claim is another caller's.
fn request(scope: &str, name: &str, lease: Duration) -> ClaimRequest {
    ClaimRequest::new(
        Key::new(scope, name).unwrap(),
        Fingerprint::of_bytes("500"),
        lease,
        HOUR,
    )
}

/// Claims `scope`/`name` afresh with `lease` and completes it with `response` (after
/// the lease ended, for a lease of zero: a result stored late).
async fn completed(
    store: &PostgresStore,
    scope: &str,
    name: &str,
    lease: Duration,
    response: &[u8],
) {
    let ClaimOutcome::Claimed { lease, .. } =
        store.claim(&request(scope, name, lease)).await.unwrap()
    else {
        panic!("{scope}/{name}: a fresh claim")
    };
    assert_eq!(
        store.complete(&lease, response).await.unwrap(),
        WriteOutcome::Applied
    );
}

#[tokio::test]
async fn replays_and_in_flight_answers_wait_for_no_row_lock() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh().as_str().to_owned();
    let store = common::store_in(&url, &table, 4).await;
    // A result whose lease has ended, as every result's does in time, and a record
    // whose owner is still working.
    completed(&store, "locks", "done", Duration::ZERO, b"paid").await;
    let ClaimOutcome::Claimed { .. } = store
        .claim(&request("locks", "working", HOUR))
        .await
        .unwrap()
    else {
        panic!("a fresh claim")
    };
    for name in ["done", "working"] {
        let (holder, _) = common::lock_row(&store, &table, "locks", name).await;
        let answer =
            tokio::time::timeout(PATIENCE, store.claim(&request("locks", name, HOUR))).await;
        holder.rollback().await.unwrap();
        let answer = answer
            .unwrap_or_else(|_| panic!("{name}: the claim waited for another session's row lock"))
            .unwrap();
        match name {
            "done" => assert!(
                matches!(&answer, ClaimOutcome::Replay { response, .. } if response == b"paid"),
                "{name}: {answer:?}"
            ),
            _ => assert!(
                matches!(answer, ClaimOutcome::InFlight { .. }),
                "{name}: {answer:?}"
            ),
        }
    }
}

/// A takeover's claim reads an abandoned record, then waits for its row lock while the
/// old owner's completion commits: its write no longer applies, no row comes back, and
/// the store's next read answers the stored result, not another record that shares the
/// key's scope or name.
#[tokio::test]
async fn a_takeover_that_loses_to_a_completion_answers_that_records_result() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh().as_str().to_owned();
    let store = common::store_in(&url, &table, 4).await;
    // Written first, so that a read that matched them would meet them first.
    completed(&store, "other", "k", HOUR, b"another scope's").await;
    completed(&store, "race", "j", HOUR, b"another key's").await;
    // The old owner's lease has ended: a claim would take the record over.
    let ClaimOutcome::Claimed { lease, .. } = store
        .claim(&request("race", "k", Duration::ZERO))
        .await
        .unwrap()
    else {
        panic!("a fresh claim")
    };
    let (mut owner, holder) = common::lock_row(&store, &table, "race", "k").await;
    let takeover = tokio::spawn({
        let store = store.clone();
        async move { store.claim(&request("race", "k", HOUR)).await }
    });
    common::wait_until_blocked_by(&store, holder).await;
    // The old owner's completion (as its own transaction would write it) commits.
    let done = sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{table}\" SET state = 'completed', response = $1 \
         WHERE scope = 'race' AND key = 'k' AND token = $2"
    )))
    .bind(&b"paid"[..])
    .bind(i64::try_from(lease.token).unwrap())
    .execute(&mut *owner)
    .await
    .unwrap();
    assert_eq!(done.rows_affected(), 1);
    owner.commit().await.unwrap();
    let answer = tokio::time::timeout(PATIENCE, takeover)
        .await
        .expect("the claim answers once the lock is released")
        .unwrap()
        .unwrap();
    assert!(
        matches!(&answer, ClaimOutcome::Replay { response, .. } if response == b"paid"),
        "the completed record's result: {answer:?}"
    );
}

/// A fresh key that another transaction inserted and has not committed: the claim's first
/// form (`ON CONFLICT DO NOTHING`) waits for that transaction. Committed, the row is there
/// and the claim's second form answers it in flight, leaving it as written; rolled back,
/// the key is fresh and the claim takes it at token 1.
#[tokio::test]
async fn a_fresh_key_inserted_under_the_claim_is_answered_once_it_commits_or_rolls_back() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh().as_str().to_owned();
    let store = common::store_in(&url, &table, 4).await;
    for commit in [true, false] {
        let name = format!("inserted-{commit}");
        let mut other = store.pool().begin().await.unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{table}\" (scope, key, fingerprint, state, token, attempt, lease_until, created_at, expires_at)
             VALUES ('race', $1, $2, 'in_progress', 1, decode(repeat('ab', 16), 'hex'),
                     now() + interval '1 hour', now(), now() + interval '1 day')"
        )))
        .bind(&name)
        .bind(&Fingerprint::of_bytes("500").as_bytes()[..])
        .execute(&mut *other)
        .await
        .unwrap();
        let holder = common::backend_pid(&mut other).await;
        let claim = tokio::spawn({
            let store = store.clone();
            async move { store.claim(&request("race", &name, HOUR)).await }
        });
        common::wait_until_blocked_by(&store, holder).await;
        if commit {
            other.commit().await.unwrap();
        } else {
            other.rollback().await.unwrap();
        }
        let answer = tokio::time::timeout(PATIENCE, claim)
            .await
            .expect("the claim answers once the other transaction ends")
            .unwrap()
            .unwrap();
        match (commit, &answer) {
            (true, ClaimOutcome::InFlight { .. }) => {
                let attempt: Vec<u8> = sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT attempt FROM \"{table}\" WHERE scope = 'race' AND key = $1"
                )))
                .bind(format!("inserted-{commit}"))
                .fetch_one(store.pool())
                .await
                .unwrap();
                assert_eq!(
                    attempt,
                    vec![0xab; 16],
                    "the committed row is as it was written"
                );
            }
            (false, ClaimOutcome::Claimed { lease, .. }) => assert_eq!(lease.token, 1),
            _ => panic!("committed {commit}: {answer:?}"),
        }
    }
}

/// An absent record (retention over, no live lease) that a purge deletes while the claim
/// waits for its row lock: the claim's first form stops at the row, its second form waits
/// to write over it, and once the delete commits, PostgreSQL inserts anew. The claim takes
/// the key at token 1, a new lifetime, with nothing of the deleted record.
#[tokio::test]
async fn a_record_purged_while_a_claim_waits_for_its_row_lock_is_claimed_afresh() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh().as_str().to_owned();
    let store = common::store_in(&url, &table, 4).await;
    completed(&store, "race", "purged", HOUR, b"the old lifetime's").await;
    // Its retention over: absent, and a purge would delete it.
    let aged = sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{table}\" SET token = 7, \
         expires_at = now() - interval '1 hour', lease_until = now() - interval '1 hour' \
         WHERE scope = 'race' AND key = 'purged'"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    assert_eq!(aged.rows_affected(), 1);
    let (mut purger, holder) = common::lock_row(&store, &table, "race", "purged").await;
    let claim = tokio::spawn({
        let store = store.clone();
        async move { store.claim(&request("race", "purged", HOUR)).await }
    });
    common::wait_until_blocked_by(&store, holder).await;
    let deleted = sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM \"{table}\" WHERE scope = 'race' AND key = 'purged'"
    )))
    .execute(&mut *purger)
    .await
    .unwrap();
    assert_eq!(deleted.rows_affected(), 1);
    purger.commit().await.unwrap();
    let answer = tokio::time::timeout(PATIENCE, claim)
        .await
        .expect("the claim answers once the purge commits")
        .unwrap()
        .unwrap();
    let ClaimOutcome::Claimed {
        lease,
        resumed,
        steps,
        ..
    } = answer
    else {
        panic!("a fresh claim once the record is gone: {answer:?}")
    };
    assert_eq!(lease.token, 1, "a new lifetime starts at token 1");
    assert!(
        !resumed && steps.is_empty(),
        "nothing of the deleted record"
    );
    let (token, state, response): (i64, String, Option<Vec<u8>>) =
        sqlx::query_as(AssertSqlSafe(format!(
            "SELECT token, state, response FROM \"{table}\" WHERE scope = 'race' AND key = 'purged'"
        )))
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!((token, state.as_str(), response), (1, "in_progress", None));
}
