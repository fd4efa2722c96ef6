//! Items idem did not write, put in the table by hand: never absent, never a panic, always
//! a typed error naming the key's hash.

mod common;

use std::sync::Arc;

use idem_core::{Admin, Key, admin::ListQuery, raw::storage_name};
use idem_dynamodb::aws_sdk_dynamodb::primitives::Blob;
use idem_dynamodb::aws_sdk_dynamodb::types::AttributeValue;
use idem_testkit::assert_foreign_record_is_refused;

/// A store on `prefix` with no skew margin whose claims read first, or not: the two claim
/// paths, which must refuse alike.
fn store_on(
    client: &idem_dynamodb::aws_sdk_dynamodb::Client,
    prefix: &str,
    reads_first: bool,
) -> idem_dynamodb::DynamoDbStore {
    idem_dynamodb::DynamoDbStore::builder(client.clone(), &common::table())
        .unwrap()
        .prefix(prefix)
        .unwrap()
        .skew_margin(std::time::Duration::ZERO)
        .claim_reads_first(reads_first)
        .build()
}

/// Puts an item of these attributes under `key`, by hand.
async fn put(
    client: &idem_dynamodb::aws_sdk_dynamodb::Client,
    prefix: &str,
    key: &Key,
    attributes: Vec<(&str, AttributeValue)>,
) {
    let pk = storage_name::namespaced_key_name(prefix, key);
    let mut put = client
        .put_item()
        .table_name(common::table())
        .item("pk", AttributeValue::S(pk));
    for (name, value) in attributes {
        put = put.item(name, value);
    }
    put.send().await.unwrap();
}

/// An item at the last token (2^53 - 1) as idem would write it: `state` under
/// `fingerprint`, owned by the all-zero attempt, its times in ms since the epoch.
fn at_last_token(
    fingerprint: &idem_core::Fingerprint,
    state: &str,
    (lease_until, created_at, expires_at): (u64, u64, u64),
    response: &[u8],
) -> Vec<(&'static str, AttributeValue)> {
    let n = |v: u64| AttributeValue::N(v.to_string());
    let blob = |v: &[u8]| AttributeValue::B(Blob::new(v.to_vec()));
    vec![
        ("fp", blob(fingerprint.as_bytes())),
        ("st", AttributeValue::S(state.to_owned())),
        ("tk", n(idem_core::raw::MAX_TOKEN)),
        ("at", blob(&[0; 16])),
        ("lu", n(lease_until)),
        ("ca", n(created_at)),
        ("ea", n(expires_at)),
        ("rs", blob(response)),
    ]
}

#[tokio::test]
async fn foreign_items_are_refused_not_absent() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let prefix = common::unique_prefix();
    let store = common::store_in(&endpoint, &prefix).await;
    let client = store.client().clone();
    let store: Arc<dyn Admin> = Arc::new(store);
    // The same checks through claims that read first: both paths refuse alike.
    let reads_first: Arc<dyn Admin> = Arc::new(store_on(&client, &prefix, true));
    let n = |v: &str| AttributeValue::N(v.to_owned());
    let b = |v: Vec<u8>| AttributeValue::B(Blob::new(v));
    let s = |v: &str| AttributeValue::S(v.to_owned());
    let good = [
        ("fp", b(vec![0; 32])),
        ("st", s("in_progress")),
        ("tk", n("1")),
        ("at", b(vec![0; 16])),
        ("lu", n("1")),
        ("ca", n("1")),
        ("ea", n("4102444800000")),
    ];
    let with = |field: &'static str, value: Option<AttributeValue>| {
        let mut item: Vec<_> = good.iter().filter(|(f, _)| *f != field).cloned().collect();
        if let Some(value) = value {
            item.push((field, value));
        }
        item
    };
    let cases = [
        ("an unknown state", with("st", Some(s("paused")))),
        ("a token that is text", with("tk", Some(s("abc")))),
        (
            "a token beyond 2^53 - 1",
            with("tk", Some(n("9007199254740993"))),
        ),
        ("a missing expiry", with("ea", None)),
        ("a fingerprint that is text", with("fp", Some(s("abc")))),
        ("steps that are a number", with("stp", Some(n("3")))),
    ];
    for (i, (what, attributes)) in cases.into_iter().enumerate() {
        let key = Key::new("foreign", format!("case-{i}")).unwrap();
        put(&client, &prefix, &key, attributes).await;
        assert_foreign_record_is_refused(Arc::clone(&store), &key, what).await;
        assert_foreign_record_is_refused(Arc::clone(&reads_first), &key, what).await;
    }

    // An operator's count and listing skip what they cannot read instead of failing on
    // it. The count reads no steps, so the item whose steps are a number counts as a
    // record; the listing reads its page whole and skips that one too.
    let stats = store.stats(10).await.unwrap();
    assert_eq!((stats.total, stats.unreadable), (1, 5), "{stats:?}");
    let page = store.list(&ListQuery::new()).await.unwrap();
    assert!(page.records.is_empty(), "{:?}", page.records);

    // A listing pages on past an item it could choose but not read whole (the oldest
    // here): the cursor comes from the scan, so no later record is lost.
    let mut good = Vec::new();
    for i in 0..3 {
        let key = Key::new("good", format!("g{i}")).unwrap();
        let request = idem_core::store::ClaimRequest::new(
            key.clone(),
            idem_core::Fingerprint::of_bytes("g"),
            std::time::Duration::from_secs(60),
            std::time::Duration::from_secs(3600),
        );
        store.claim(&request).await.unwrap();
        good.push(key);
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    let mut query = ListQuery::new().limit(2);
    let mut seen = Vec::new();
    loop {
        let page = store.list(&query).await.unwrap();
        seen.extend(page.records.iter().map(|listed| listed.record.key.clone()));
        match page.next {
            Some(cursor) => query = query.clone().after(cursor),
            None => break,
        }
    }
    assert_eq!(seen, good);
}

/// An unreadable item that is past its expiry is absent to the conditional write, which
/// claims it afresh; a claim that reads first must leave it to that write, not refuse it.
#[tokio::test]
async fn an_expired_unreadable_item_is_claimed_afresh_on_both_paths() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let prefix = common::unique_prefix();
    let store = common::store_in(&endpoint, &prefix).await;
    let client = store.client().clone();
    for read_first in [false, true] {
        let store = store_on(&client, &prefix, read_first);
        let key = Key::new("foreign", format!("expired-{read_first}")).unwrap();
        let attributes = vec![
            ("st", AttributeValue::S("completed".into())),
            ("tk", AttributeValue::N("1".into())),
            ("ea", AttributeValue::N("1".into())),
            ("lu", AttributeValue::N("1".into())),
            ("fp", AttributeValue::S("not binary".into())),
        ];
        put(&client, &prefix, &key, attributes).await;
        let request = idem_core::store::ClaimRequest::new(
            key,
            idem_core::Fingerprint::of_bytes("fresh"),
            std::time::Duration::from_secs(60),
            std::time::Duration::from_secs(3600),
        );
        let claimed = idem_core::Store::claim(&store, &request).await;
        assert!(
            matches!(claimed, Ok(idem_core::store::ClaimOutcome::Claimed { .. })),
            "read first: {read_first}: {claimed:?}"
        );
    }
}

/// Items at the last token (2^53 - 1, put by hand): read, replayed and answered in flight,
/// but never taken over or released; once absent, claimed afresh from token 1, through
/// both claim paths.
#[tokio::test]
async fn an_item_at_the_last_token_is_read_but_never_taken_over() {
    use idem_testkit::{LastTokenRecords, assert_the_last_token_is_never_passed};
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let prefix = common::unique_prefix();
    let client = common::store_in(&endpoint, &prefix).await.client().clone();
    let now = idem_core::Timestamp::now().as_unix_millis();
    let hour = 3_600_000;
    let fingerprint = LastTokenRecords::fingerprint();
    let plant = async |key: &Key, state: &str, lease_until: u64, expires_at: u64| {
        let times = (lease_until, now - 2 * hour, expires_at);
        let mut attributes = at_last_token(&fingerprint, state, times, LastTokenRecords::RESPONSE);
        let steps = [("charge".to_owned(), AttributeValue::B(Blob::new(vec![0])))];
        attributes.push(("stp", AttributeValue::M(steps.into())));
        put(&client, &prefix, key, attributes).await;
    };
    let (ended, tomorrow) = (now - hour, now + 24 * hour);
    for reads_first in [false, true] {
        // A scope for each claim path, so that each plants records of its own.
        let planted = LastTokenRecords::under(
            &format!("foreign-{reads_first}"),
            idem_core::record::AttemptId::from_bytes([0; 16]),
        )
        .unwrap();
        plant(&planted.completed, "completed", ended, tomorrow).await;
        plant(&planted.held, "in_progress", now + hour, tomorrow).await;
        plant(&planted.ended, "in_progress", ended, tomorrow).await;
        plant(&planted.absent, "in_progress", ended, ended).await;
        let store = store_on(&client, &prefix, reads_first);
        assert_the_last_token_is_never_passed(Arc::new(store), &planted).await;
    }
}

/// Claims racing for an absent item at the last token, through both claim paths: each
/// that finds it deletes it first (conditionally, as a purge does) and then writes a fresh
/// item, so a delete can meet another claimant's fresh item or its delete. Exactly one
/// claim takes the key, at token 1; every other is answered in flight by that new owner's
/// lease; the item is the winner's. Four keys per claim path, for more interleavings; a pass
/// shows none of them gave two owners, not that none could (an unconditional delete gave
/// two or three owners in each of three runs, tried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_racing_for_an_absent_item_at_the_last_token_take_it_once() {
    use idem_core::Store;
    use idem_core::store::{ClaimOutcome, ClaimRequest};
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let prefix = common::unique_prefix();
    let client = common::store_in(&endpoint, &prefix).await.client().clone();
    let now = idem_core::Timestamp::now().as_unix_millis();
    let hour = 3_600_000;
    let fingerprint = idem_core::Fingerprint::of_bytes("racing");
    const CLAIMANTS: usize = 8;
    for (reads_first, round) in [false, true]
        .into_iter()
        .flat_map(|r| (0..4).map(move |n| (r, n)))
    {
        let key = Key::new("race", format!("last-token-{reads_first}-{round}")).unwrap();
        // Absent: its lease and its retention both over.
        let times = (now - 2 * hour, now - 3 * hour, now - hour);
        let attributes = at_last_token(&fingerprint, "completed", times, b"the old lifetime's");
        put(&client, &prefix, &key, attributes).await;
        let store = Arc::new(store_on(&client, &prefix, reads_first));
        let mut claims = tokio::task::JoinSet::new();
        for _ in 0..CLAIMANTS {
            let (store, key) = (Arc::clone(&store), key.clone());
            claims.spawn(async move {
                let hour = std::time::Duration::from_secs(3600);
                store
                    .claim(&ClaimRequest::new(key, fingerprint, hour, hour))
                    .await
            });
        }
        let mut winners = Vec::new();
        let mut in_flight = 0;
        while let Some(joined) = claims.join_next().await {
            match joined.unwrap() {
                Ok(ClaimOutcome::Claimed { lease, resumed, .. }) => {
                    assert!(
                        !resumed,
                        "reads_first {reads_first}, key {round}: a new lifetime"
                    );
                    winners.push(lease);
                }
                Ok(ClaimOutcome::InFlight { .. }) => in_flight += 1,
                other => panic!("reads_first {reads_first}, key {round}: {other:?}"),
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "reads_first {reads_first}, key {round}: one owner"
        );
        assert_eq!(
            in_flight,
            CLAIMANTS - 1,
            "reads_first {reads_first}, key {round}"
        );
        let winner = &winners[0];
        assert_eq!(
            winner.token, 1,
            "reads_first {reads_first}, key {round}: from token 1"
        );
        let stored = store.get(&key).await.unwrap().expect("the new record");
        assert_eq!(
            (stored.token, stored.attempt),
            (1, winner.attempt),
            "reads_first {reads_first}, key {round}: the item is the winner's"
        );
    }
}
