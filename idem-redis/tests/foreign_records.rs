//! Records idem did not write, planted in a hash by hand: never absent, never a panic,
//! always a typed error naming the key's hash.

mod common;

use std::sync::Arc;

use std::time::Duration;

use idem_core::{
    Admin, Key, Store, StoreError, admin::ListQuery, record::AttemptId, store::ClaimOutcome,
    store::ClaimRequest,
};

use idem_testkit::assert_foreign_record_is_refused;

#[tokio::test]
async fn foreign_records_are_refused_not_absent() {
    let Some(url) = idem_testkit::service_url(common::STANDALONE) else {
        return;
    };
    let prefix = common::unique_prefix();
    let store: Arc<dyn Admin> = Arc::new(common::standalone_in(&url, &prefix).await);
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // The fingerprint the checks claim with, so a claim reaches the takeover, where a token
    // at its maximum must stop it.
    let fingerprint = idem_core::Fingerprint::of_bytes("foreign")
        .as_bytes()
        .to_vec();
    let good: Vec<(&str, Vec<u8>)> = vec![
        ("f", fingerprint),
        ("s", b"in_progress".to_vec()),
        ("t", b"1".to_vec()),
        ("a", vec![0; 16]),
        ("l", b"1".to_vec()),
        ("c", b"1".to_vec()),
        ("e", b"4102444800000".to_vec()),
        ("z", b"0".to_vec()),
    ];
    let with = |field: &'static str, value: Option<&[u8]>| {
        good.iter()
            .filter(|(name, _)| *name != field)
            .cloned()
            .chain(value.map(|value| (field, value.to_vec())))
            .collect::<Vec<_>>()
    };
    let cases = [
        ("an unknown state", with("s", Some(b"paused"))),
        ("a token that is text", with("t", Some(b"abc"))),
        (
            "a token beyond 2^53 - 1",
            with("t", Some(b"9007199254740993")),
        ),
        ("a missing expiry", with("e", None)),
        ("a lease end that is a fraction", with("l", Some(b"1.5"))),
        ("a fingerprint of 5 bytes", with("f", Some(b"12345"))),
        ("a missing fingerprint", with("f", None)),
        ("a missing state", with("s", None)),
        ("an attempt of 5 bytes", with("a", Some(b"12345"))),
        ("a missing attempt", with("a", None)),
        ("a token of 0", with("t", Some(b"0"))),
        ("a negative lease end", with("l", Some(b"-5"))),
    ];
    // Finished records take the claim's replay path, which reads only what it answers from:
    // that must be validated too.
    let finished = |field: &'static str, value: &[u8]| {
        let mut fields = with(field, Some(value));
        fields.retain(|(name, _)| *name != "s");
        fields.push(("s", b"completed".to_vec()));
        fields
    };
    let cases = cases.into_iter().chain([
        (
            "a completed record with a fingerprint of 5 bytes",
            finished("f", b"12345"),
        ),
        (
            "a completed record whose expiry is text",
            finished("e", b"soon"),
        ),
        (
            "a completed record whose expiry is a fraction",
            finished("e", b"4102444800000.5"),
        ),
        (
            "a completed record whose expiry is negative",
            finished("e", b"-5"),
        ),
    ]);
    for (n, (what, fields)) in cases.enumerate() {
        let key = Key::new("foreign", format!("case-{n}")).unwrap();
        let name = format!("{prefix}{{7:foreign:case-{n}}}");
        let _: () = redis::cmd("HSET")
            .arg(&name)
            .arg(fields)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_foreign_record_is_refused(Arc::clone(&store), &key, what).await;
        if what == "a missing state" {
            // The error names the field that is wrong, not the fingerprint beside it.
            let request = ClaimRequest::new(
                key.clone(),
                idem_core::Fingerprint::of_bytes("foreign"),
                Duration::from_secs(60),
                Duration::from_secs(3600),
            );
            let claimed = store.claim(&request).await;
            let source = match &claimed {
                Err(StoreError::Corrupt {
                    source: Some(source),
                    ..
                }) => source.to_string(),
                other => panic!("{what}: {other:?}"),
            };
            assert!(source.contains("state"), "{what}: {source}");
        }
    }

    // A token at its maximum is readable, but a takeover would have no next token: the
    // claim stops with Corrupt instead of handing out a token that does not grow.
    let key = Key::new("foreign", "at-max").unwrap();
    let name = format!("{prefix}{{7:foreign:at-max}}");
    let _: () = redis::cmd("HSET")
        .arg(&name)
        .arg(with("t", Some(b"9007199254740991")))
        .query_async(&mut conn)
        .await
        .unwrap();
    let request = idem_core::store::ClaimRequest::new(
        key.clone(),
        idem_core::Fingerprint::of_bytes("foreign"),
        std::time::Duration::from_secs(60),
        std::time::Duration::from_secs(3600),
    );
    let claimed = store.claim(&request).await;
    assert!(
        matches!(&claimed, Err(err @ idem_core::StoreError::Corrupt { .. }) if err.to_string().contains(&key.short_hash().to_string())),
        "{claimed:?}"
    );
    let shown = store.get(&key).await.unwrap().expect("still readable");
    assert_eq!(shown.token, idem_core::raw::MAX_TOKEN);

    // An operator's count and listing skip what they cannot read (the sixteen hashes above,
    // and a key of the store's layout that is not a hash) instead of failing on it.
    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}{{7:foreign:a-string}}"))
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let stats = store.stats(10).await.unwrap();
    assert_eq!((stats.total, stats.unreadable), (1, 17), "{stats:?}");
    let page = store.list(&ListQuery::new()).await.unwrap();
    let listed: Vec<&Key> = page
        .records
        .iter()
        .map(|listed| &listed.record.key)
        .collect();
    assert_eq!(listed, vec![&key]);
}

/// A hash's fields, as `HSET` takes them.
type Fields = Vec<(&'static str, Vec<u8>)>;

/// A hash without its fingerprint that still holds a step: a claim must neither start
/// afresh over it (keeping the step) nor hand that step to a takeover as work already done.
#[tokio::test]
async fn a_hash_without_its_fingerprint_never_hands_out_stale_steps() {
    let Some(url) = idem_testkit::service_url(common::STANDALONE) else {
        return;
    };
    let (store, prefix, mut conn) = common::standalone_and_connection(&url).await;
    let fingerprint = idem_core::Fingerprint::of_bytes("stale");
    // One hash with every field but the fingerprint, one with nothing but a step.
    let seeded: [(&str, Fields); 2] = [
        (
            "no-fingerprint",
            vec![
                ("s", b"in_progress".to_vec()),
                ("t", b"3".to_vec()),
                ("a", vec![0; 16]),
                ("l", b"1".to_vec()),
                ("c", b"1".to_vec()),
                ("e", b"4102444800000".to_vec()),
                ("z", b"0".to_vec()),
                ("step:debit", b"done".to_vec()),
            ],
        ),
        ("only-a-step", vec![("step:debit", b"done".to_vec())]),
    ];
    for (name, fields) in seeded {
        let key = Key::new("stale", name).unwrap();
        let hash = format!("{prefix}{{5:stale:{name}}}");
        let _: () = redis::cmd("HSET")
            .arg(&hash)
            .arg(fields)
            .query_async(&mut conn)
            .await
            .unwrap();
        // A lease of zero, so the next claim is a takeover at once.
        let request = |attempt| {
            ClaimRequest::new(
                key.clone(),
                fingerprint,
                Duration::ZERO,
                Duration::from_secs(3600),
            )
            .with_attempt(attempt)
        };
        match store.claim(&request(AttemptId::random())).await {
            Ok(ClaimOutcome::Claimed { .. }) => {
                let taken = store.claim(&request(AttemptId::random())).await;
                let Ok(ClaimOutcome::Claimed { steps, .. }) = taken else {
                    panic!("{name}: the takeover answered {taken:?}");
                };
                assert!(
                    steps.is_empty(),
                    "{name}: a takeover of a record claimed afresh answered steps that never \
                     ran in it: {steps:?}"
                );
                panic!("{name}: a hash idem did not write was claimed afresh");
            }
            Err(StoreError::Corrupt { .. }) => {}
            other => panic!("{name}: claim must answer Corrupt, not {other:?}"),
        }
        let step: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(&hash)
            .arg("step:debit")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            step.as_deref(),
            Some(&b"done"[..]),
            "{name}: the refused hash is left for an operator to read"
        );
        assert!(
            matches!(store.get(&key).await, Err(StoreError::Corrupt { .. })),
            "{name}: get must answer Corrupt"
        );
    }
}

/// An in-progress record past its expiry that Redis still holds (its time to live removed by hand;
/// Redis itself keeps one only through the millisecond its expiry comes) is absent: a
/// claim starts afresh over it, and none of its steps is kept for a later takeover.
#[tokio::test]
async fn an_expired_in_progress_record_redis_still_holds_is_claimed_afresh_without_its_steps() {
    let Some(url) = idem_testkit::service_url(common::STANDALONE) else {
        return;
    };
    let (store, prefix, mut conn) = common::standalone_and_connection(&url).await;
    let fingerprint = idem_core::Fingerprint::of_bytes("expired");
    let key = Key::new("expired", "held").unwrap();
    let hash = format!("{prefix}{{7:expired:held}}");
    let fields: Fields = vec![
        ("f", fingerprint.as_bytes().to_vec()),
        ("s", b"in_progress".to_vec()),
        ("t", b"3".to_vec()),
        ("a", vec![0; 16]),
        ("l", b"1".to_vec()),
        ("c", b"1".to_vec()),
        ("e", b"2".to_vec()),
        ("z", b"0".to_vec()),
        ("step:debit", b"done".to_vec()),
    ];
    let _: () = redis::cmd("HSET")
        .arg(&hash)
        .arg(fields)
        .query_async(&mut conn)
        .await
        .unwrap();
    let request = ClaimRequest::new(
        key.clone(),
        fingerprint,
        Duration::from_secs(60),
        Duration::from_secs(3600),
    );
    let claimed = store.claim(&request).await.unwrap();
    let ClaimOutcome::Claimed {
        lease,
        resumed,
        steps,
        ..
    } = claimed
    else {
        panic!("{claimed:?}")
    };
    assert_eq!((lease.token, resumed), (1, false), "a fresh record");
    assert!(steps.is_empty(), "{steps:?}");
    let kept: bool = redis::cmd("HEXISTS")
        .arg(&hash)
        .arg("step:debit")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!kept, "the earlier lifetime's step is gone");

    // The same for a completion: a record held past its expiry with its lease ended is
    // absent, so the owner's late result is fenced and the record deleted.
    let _: () = redis::cmd("HSET")
        .arg(&hash)
        .arg(&[("l", "1"), ("e", "2")])
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("PERSIST")
        .arg(&hash)
        .query_async(&mut conn)
        .await
        .unwrap();
    let completed = store.complete(&lease, b"late").await.unwrap();
    assert_eq!(completed, idem_core::store::WriteOutcome::Fenced);
    let exists: bool = redis::cmd("EXISTS")
        .arg(&hash)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!exists, "an absent record is deleted");
}

/// Records at the last token (2^53 - 1, planted by hand): read, replayed and answered in
/// flight, but never taken over or released; once absent, claimed afresh from token 1.
#[tokio::test]
async fn a_record_at_the_last_token_is_read_but_never_taken_over() {
    use idem_testkit::{LastTokenRecords, assert_the_last_token_is_never_passed};
    let Some(url) = idem_testkit::service_url(common::STANDALONE) else {
        return;
    };
    let (store, prefix, mut conn) = common::standalone_and_connection(&url).await;
    let now = idem_core::Timestamp::now().as_unix_millis();
    let hour = 3_600_000;
    let fingerprint = LastTokenRecords::fingerprint();
    let mut plant = async |key: &Key, state: &str, lease_until: u64, expires_at: u64| {
        let fields: Vec<(&str, Vec<u8>)> = vec![
            ("f", fingerprint.as_bytes().to_vec()),
            ("s", state.as_bytes().to_vec()),
            ("t", idem_core::raw::MAX_TOKEN.to_string().into_bytes()),
            ("a", vec![0; 16]),
            ("l", lease_until.to_string().into_bytes()),
            ("c", (now - 2 * hour).to_string().into_bytes()),
            ("e", expires_at.to_string().into_bytes()),
            ("r", LastTokenRecords::RESPONSE.to_vec()),
            ("step:charge", vec![0]),
        ];
        let _: () = redis::cmd("HSET")
            .arg(format!("{prefix}{{7:foreign:{}}}", key.key()))
            .arg(fields)
            .query_async(&mut conn)
            .await
            .unwrap();
    };
    let (ended, tomorrow) = (now - hour, now + 24 * hour);
    let planted =
        LastTokenRecords::under("foreign", idem_core::record::AttemptId::from_bytes([0; 16]))
            .unwrap();
    plant(&planted.completed, "completed", ended, tomorrow).await;
    plant(&planted.held, "in_progress", now + hour, tomorrow).await;
    plant(&planted.ended, "in_progress", ended, tomorrow).await;
    plant(&planted.absent, "in_progress", ended, ended).await;
    assert_the_last_token_is_never_passed(Arc::new(store), &planted).await;
}
