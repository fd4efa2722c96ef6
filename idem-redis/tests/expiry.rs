//! The key's own expiry (`PEXPIREAT`) follows the record's: a result stored late keeps its
//! key exactly until its new expiry, and a retried write leaves it alone.

mod common;

use std::time::Duration;

use idem_core::{
    Fingerprint, Key, Store, store::ClaimOutcome, store::ClaimRequest, store::WriteOutcome,
};
use idem_redis::redis;

#[tokio::test]
async fn a_result_stored_late_keeps_its_key_until_its_new_expiry() {
    let Some(url) = idem_testkit::service_url(common::STANDALONE) else {
        return;
    };
    let (store, prefix, conn) = common::standalone_and_connection(&url).await;
    let retention = Duration::from_millis(200);
    for (name, failed) in [("completed", false), ("failed", true)] {
        let key = Key::new("expiry", name).unwrap();
        let hash = format!("{prefix}{{6:expiry:{name}}}");
        let request = ClaimRequest::new(
            key.clone(),
            Fingerprint::of_bytes("x"),
            Duration::from_secs(3600),
            retention,
        );
        let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await.unwrap() else {
            panic!("{name}: a fresh claim")
        };
        // The lease holds the record past its retention; the work ends after it.
        tokio::time::sleep(retention + Duration::from_millis(100)).await;
        let finish = || async {
            if failed {
                store.fail(&lease, b"r").await.unwrap()
            } else {
                store.complete(&lease, b"r").await.unwrap()
            }
        };
        assert_eq!(finish().await, WriteOutcome::Applied);
        let (expires, key_expires) = expiries(conn.clone(), &hash).await;
        let record = store
            .get(&key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name}: the result stored late is there"));
        let expires = expires.expect("the hash keeps its expiry");
        assert_eq!(
            u64::try_from(expires).unwrap(),
            record.expires_at.as_unix_millis()
        );
        assert!(
            record
                .expires_at
                .saturating_duration_since(record.created_at)
                >= 2 * retention,
            "{name}: kept one retention after it was stored: {record:?}"
        );
        assert_eq!(
            key_expires, expires,
            "{name}: the key expires when the record does"
        );
        // A retry of the landed write writes nothing, the key's expiry included.
        assert_eq!(finish().await, WriteOutcome::Applied);
        assert_eq!(
            expiries(conn.clone(), &hash).await,
            (Some(expires), key_expires)
        );
    }
}

/// A takeover moves the record's expiry to a retention past its new lease, and the key's
/// own expiry with it: the key of a record whose old expiry comes before the new lease
/// ends must not vanish under the new owner.
#[tokio::test]
async fn a_takeover_keeps_its_key_until_its_new_expiry() {
    let Some(url) = idem_testkit::service_url(common::STANDALONE) else {
        return;
    };
    let (store, prefix, conn) = common::standalone_and_connection(&url).await;
    let key = Key::new("expiry", "takeover").unwrap();
    let hash = format!("{prefix}{{6:expiry:takeover}}");
    let (short, retention) = (Duration::from_millis(300), Duration::from_secs(30));
    let request =
        |lease| ClaimRequest::new(key.clone(), Fingerprint::of_bytes("x"), lease, retention);
    let ClaimOutcome::Claimed { .. } = store.claim(&request(short)).await.unwrap() else {
        panic!("a fresh claim")
    };
    // The lease has ended; the record is kept until its retention ends.
    tokio::time::sleep(short + Duration::from_millis(50)).await;
    let taken = store
        .claim(&request(Duration::from_secs(3600)))
        .await
        .unwrap();
    let ClaimOutcome::Claimed { lease, resumed, .. } = taken else {
        panic!("a takeover: {taken:?}")
    };
    assert!(
        resumed && lease.token == 2,
        "a takeover: resumed {resumed}, token {}",
        lease.token
    );
    let (expires, key_expires) = expiries(conn, &hash).await;
    let expires = expires.expect("the hash keeps its expiry");
    assert_eq!(key_expires, expires, "the key lives as long as the record");
    assert!(
        u64::try_from(expires).unwrap() >= lease.lease_until.as_unix_millis(),
        "a retention past the new lease"
    );
}

/// A fresh claim's key lives until its lease ends or its record expires, whichever is
/// later: a lease longer than the retention must not lose its key while it runs, and a
/// key its owner never finishes must still go away on its own.
#[tokio::test]
async fn a_fresh_claim_keeps_its_key_until_its_lease_or_its_expiry_ends_whichever_is_later() {
    let Some(url) = idem_testkit::service_url(common::STANDALONE) else {
        return;
    };
    let (store, prefix, conn) = common::standalone_and_connection(&url).await;
    let (short, long) = (Duration::from_secs(60), Duration::from_secs(3600));
    for (name, lease, retention) in [
        ("lease-longer", long, short),
        ("retention-longer", short, long),
    ] {
        let key = Key::new("expiry", name).unwrap();
        let hash = format!("{prefix}{{6:expiry:{name}}}");
        let request = ClaimRequest::new(key, Fingerprint::of_bytes("x"), lease, retention);
        let ClaimOutcome::Claimed { lease: granted, .. } = store.claim(&request).await.unwrap()
        else {
            panic!("{name}: a fresh claim")
        };
        let (expires, key_expires) = expiries(conn.clone(), &hash).await;
        let expires = expires.expect("the hash keeps its expiry");
        let lease_ends = i64::try_from(granted.lease_until.as_unix_millis()).unwrap();
        assert_eq!(
            key_expires,
            expires.max(lease_ends),
            "{name}: the key lives until the later of the lease's end ({lease_ends}) and the \
             expiry ({expires})"
        );
    }
}

/// The record's expiry as its hash holds it (`e`, if any) and the key's own
/// (`PEXPIRETIME`), in Unix milliseconds.
async fn expiries(mut conn: redis::aio::MultiplexedConnection, hash: &str) -> (Option<i64>, i64) {
    let expires: Option<i64> = redis::cmd("HGET")
        .arg(hash)
        .arg("e")
        .query_async(&mut conn)
        .await
        .unwrap();
    let key_expires: i64 = redis::cmd("PEXPIRETIME")
        .arg(hash)
        .query_async(&mut conn)
        .await
        .unwrap();
    (expires, key_expires)
}
