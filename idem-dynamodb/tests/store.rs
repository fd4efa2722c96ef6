//! DynamoDB-specific behaviour: the skew margin, races, names, sizes, TTL and errors.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_core::record::ValuePart;
use idem_core::{
    Fingerprint, Idempotency, Key, ManualClock, Store, StoreError, Timestamp, key::StepName,
    store::ClaimOutcome, store::ClaimRequest, store::RenewOutcome, store::WriteOutcome,
};
use idem_dynamodb::aws_sdk_dynamodb::types::AttributeValue;
use idem_dynamodb::{DynamoDbStore, MAX_RECORD_BYTES, TableNameError};

/// A store on a manual clock with a skew margin of 2 s, in a fresh namespace.
async fn store_with_a_margin() -> Option<(DynamoDbStore, ManualClock)> {
    let endpoint = idem_testkit::service_url(common::ENDPOINT)?;
    let client = common::client(&endpoint);
    common::create_table(&client).await;
    let clock = ManualClock::starting_at(Timestamp::now());
    let store = DynamoDbStore::builder(client, &common::table())
        .unwrap()
        .prefix(&common::unique_prefix())
        .unwrap()
        .skew_margin(Duration::from_secs(2))
        .clock(clock.clone())
        .build();
    Some((store, clock))
}

#[tokio::test]
async fn a_takeover_waits_for_the_skew_margin() {
    let Some((store, clock)) = store_with_a_margin().await else {
        return;
    };
    let key = Key::new("margin", "k").unwrap();
    let request = |()| {
        ClaimRequest::new(
            key.clone(),
            Fingerprint::of_bytes("x"),
            Duration::from_secs(10),
            Duration::from_secs(3600),
        )
    };
    let first = store.claim(&request(())).await.unwrap();
    let ClaimOutcome::Claimed { lease, .. } = first else {
        panic!("{first:?}")
    };

    clock.advance(Duration::from_secs(10)); // the lease has ended, the margin has not
    match store.claim(&request(())).await.unwrap() {
        ClaimOutcome::InFlight { retry_after, .. } => {
            assert_eq!(retry_after, Duration::from_secs(2))
        }
        other => panic!("a takeover inside the skew margin: {other:?}"),
    }
    clock.advance(Duration::from_secs(2));
    match store.claim(&request(())).await.unwrap() {
        ClaimOutcome::Claimed {
            lease: taken,
            resumed: true,
            ..
        } => assert_eq!(taken.token, lease.token + 1),
        other => panic!("expected a takeover after the margin: {other:?}"),
    }
}

#[tokio::test]
async fn a_release_without_steps_forgets_the_key_at_once_despite_the_skew_margin() {
    let Some((store, clock)) = store_with_a_margin().await else {
        return;
    };
    let key = Key::new("margin", "forgotten").unwrap();
    let request = |body: &str| {
        ClaimRequest::new(
            key.clone(),
            Fingerprint::of_bytes(body),
            Duration::from_secs(10),
            Duration::from_secs(3600),
        )
    };
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request("a")).await.unwrap() else {
        panic!("the first claim")
    };
    assert_eq!(store.release(&lease).await.unwrap(), WriteOutcome::Applied);
    // No time passes: the owner let go, so nothing waits out the margin.
    assert_eq!(store.get(&key).await.unwrap(), None);
    assert_eq!(
        store.release(&lease).await.unwrap(),
        WriteOutcome::Fenced,
        "a release retried after it forgot the record"
    );
    match store.claim(&request("b")).await.unwrap() {
        ClaimOutcome::Claimed {
            lease: next,
            resumed: false,
            ..
        } => assert!(next.token > lease.token),
        other => panic!("a corrected request after a release: {other:?}"),
    }

    // With a step, the record stays for a takeover after the margin, as before.
    let key = Key::new("margin", "kept").unwrap();
    // A new attempt id each time: another process's retry.
    let request = || {
        ClaimRequest::new(
            key.clone(),
            Fingerprint::of_bytes("a"),
            Duration::from_secs(10),
            Duration::from_secs(3600),
        )
    };
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request()).await.unwrap() else {
        panic!("the first claim")
    };
    let step = StepName::new("debit").unwrap();
    assert_eq!(
        store.checkpoint(&lease, &step, b"1").await.unwrap(),
        WriteOutcome::Applied
    );
    assert_eq!(store.release(&lease).await.unwrap(), WriteOutcome::Applied);
    assert!(store.get(&key).await.unwrap().is_some());
    assert!(matches!(
        store.claim(&request()).await.unwrap(),
        ClaimOutcome::InFlight { .. }
    ));
    clock.advance(Duration::from_secs(2));
    assert!(matches!(
        store.claim(&request()).await.unwrap(),
        ClaimOutcome::Claimed { resumed: true, .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_tasks_per_key_execute_once() {
    const TASKS: usize = 32;
    const KEYS: usize = 50;
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let idem = Arc::new(Idempotency::new(common::store(&endpoint).await));
    idem_testkit::execute_races(idem, KEYS, TASKS, |_key| async { Ok(()) }).await;
}

#[tokio::test]
async fn a_missing_table_is_a_configuration_error() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let store = DynamoDbStore::new(common::client(&endpoint), "no_such_table").unwrap();
    let request = ClaimRequest::new(
        Key::new("s", "k").unwrap(),
        Fingerprint::of_bytes("x"),
        Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let err = store.claim(&request).await.unwrap_err();
    assert!(matches!(err, StoreError::Misconfigured { .. }), "{err:?}");
    assert!(!err.is_retryable());
    // The message says what is wrong, in DynamoDB's words, not just "it failed".
    let message = err.to_string();
    assert!(
        message.contains("ResourceNotFoundException") && message.contains("table"),
        "{message}"
    );
}

#[tokio::test]
async fn an_unreachable_endpoint_is_a_retryable_error() {
    // Port 1 on loopback: nothing listens.
    let store = DynamoDbStore::new(common::client("http://127.0.0.1:1"), "idem").unwrap();
    let request = ClaimRequest::new(
        Key::new("s", "k").unwrap(),
        Fingerprint::of_bytes("x"),
        Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let err = store.claim(&request).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
}

/// A table name DynamoDB refuses is refused when the store is built, with a
/// clear error; before, the first claim failed with "the store failed during claim".
#[test]
fn an_invalid_table_name_is_refused_when_the_store_is_built() {
    let client = common::client("http://127.0.0.1:1");
    let err = DynamoDbStore::new(client.clone(), "idem\"; DROP TABLE x; --").unwrap_err();
    assert_eq!(
        err,
        TableNameError::Character {
            character: '"',
            index: 4
        }
    );
    assert!(err.to_string().contains("DynamoDB accepts"), "{err}");
    assert!(matches!(
        DynamoDbStore::new(client, "ab"),
        Err(TableNameError::Length { len: 2 })
    ));
}

/// With prefixes `tenantX1` and `tenantX`, a key of one met a key of the other
/// (both `tenantX11:x:y:zzzzzzz:w`): the second store replayed the first one's secret, and
/// its purge deleted the first one's records.
#[tokio::test]
async fn prefixes_that_are_prefixes_of_each_other_share_nothing() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let run = common::unique_prefix();
    let long = common::store_in(&endpoint, &format!("{run}tenantX1")).await;
    let short = common::store_in(&endpoint, &format!("{run}tenantX")).await;
    let hour = Duration::from_secs(3600);
    let claim = |key: Key, lease: Duration, retention: Duration| {
        ClaimRequest::new(key, Fingerprint::of_bytes("same"), lease, retention)
    };
    let secret = Key::new("x", "y:zzzzzzz:w").unwrap();
    let ClaimOutcome::Claimed { lease, .. } = long.claim(&claim(secret, hour, hour)).await.unwrap()
    else {
        panic!("a fresh claim")
    };
    assert_eq!(
        long.complete(&lease, b"the secret").await.unwrap(),
        WriteOutcome::Applied
    );
    let other = Key::new("x:y:zzzzzzz", "w").unwrap();
    match short.claim(&claim(other, hour, hour)).await.unwrap() {
        ClaimOutcome::Claimed { lease, .. } => assert_eq!(lease.token, 1),
        leaked => panic!("the other prefix's record leaked: {leaked:?}"),
    }

    // An absent record of the long prefix survives the short prefix's purge.
    let gone = Key::new("purge", "k").unwrap();
    let _ = long
        .claim(&claim(gone.clone(), Duration::ZERO, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(short.purge_expired(100).await.unwrap(), 0);
    assert_eq!(long.purge_expired(100).await.unwrap(), 1);
}

#[tokio::test]
async fn values_that_do_not_fit_in_the_item_are_refused_and_change_nothing() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let store = common::store(&endpoint).await;
    let hour = Duration::from_secs(3600);
    let request = ClaimRequest::new(
        Key::new("sizes", "k").unwrap(),
        Fingerprint::of_bytes("x"),
        hour,
        hour,
    );
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await.unwrap() else {
        panic!("a fresh claim")
    };
    let step = StepName::new("receipt").unwrap();
    let err = store
        .checkpoint(&lease, &step, &vec![1; MAX_RECORD_BYTES])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::TooLarge { part: ValuePart::Step(step), .. } if step == "receipt"),
        "{err:?}"
    );
    // Fits alone, but not beside the checkpoint already in the item: DynamoDB refuses the
    // item, and the store says which value did not fit.
    assert_eq!(
        store
            .checkpoint(&lease, &step, &vec![1; 300_000])
            .await
            .unwrap(),
        WriteOutcome::Applied
    );
    let err = store.complete(&lease, &vec![2; 200_000]).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::TooLarge {
                part: ValuePart::Result,
                size: 200_000,
                ..
            }
        ),
        "{err:?}"
    );
    let record = store.get(&request.key).await.unwrap().unwrap();
    assert_eq!(record.response, None, "nothing was written");
    assert_eq!(
        store.complete(&lease, b"small").await.unwrap(),
        WriteOutcome::Applied
    );

    // A step whose name and value are exactly the limit fits (DynamoDB's 400 KB is
    // 409 600 bytes, room for the item's other attributes).
    let request = ClaimRequest::new(
        Key::new("sizes", "exact").unwrap(),
        Fingerprint::of_bytes("x"),
        hour,
        hour,
    );
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await.unwrap() else {
        panic!("a fresh claim")
    };
    let value = vec![1; MAX_RECORD_BYTES - "receipt".len()];
    assert_eq!(
        store.checkpoint(&lease, &step, &value).await.unwrap(),
        WriteOutcome::Applied
    );
    let record = store.get(&request.key).await.unwrap().unwrap();
    assert_eq!(
        record.steps.get(step.as_str()).map(Vec::len),
        Some(value.len())
    );
    // Its 400 KB need not stay in DynamoDB Local for the rest of the run.
    assert!(
        idem_core::Admin::delete(&store, &request.key)
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn a_renewal_past_retention_moves_the_ttl_in_the_same_write() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let prefix = common::unique_prefix();
    let store = common::store_in(&endpoint, &prefix).await;
    let key = Key::new("ttl", "k").unwrap();
    let request = ClaimRequest::new(
        key.clone(),
        Fingerprint::of_bytes("x"),
        Duration::from_secs(60),
        Duration::from_secs(60),
    );
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await.unwrap() else {
        panic!("a fresh claim")
    };
    let ttl = || async {
        let item = common::client(&endpoint)
            .get_item()
            .table_name(common::table())
            .key(
                "pk",
                AttributeValue::S(idem_core::raw::storage_name::namespaced_key_name(
                    &prefix, &key,
                )),
            )
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        match item.item().and_then(|item| item.get("ttl")) {
            Some(AttributeValue::N(n)) => n.parse::<u64>().unwrap(),
            other => panic!("no ttl: {other:?}"),
        }
    };
    let retention = Duration::from_secs(60);
    let covers = |ttl: u64, lease_until: idem_core::Timestamp| {
        ttl * 1000 >= lease_until.saturating_add(retention).as_unix_millis()
    };
    // A renewal keeps the record one retention past its new end: the expiry and the TTL
    // move in the same write.
    let RenewOutcome::Renewed(first) = store.renew(&lease, Duration::from_secs(30)).await.unwrap()
    else {
        panic!("renewed")
    };
    let moved = ttl().await;
    assert!(
        covers(moved, first.lease_until),
        "the TTL ({moved} s) covers the lease and the retention"
    );
    // One whose end plus the retention the expiry covers already leaves both.
    let RenewOutcome::Renewed(short) = store.renew(&first, Duration::from_secs(10)).await.unwrap()
    else {
        panic!("renewed")
    };
    assert_eq!(ttl().await, moved);
    let RenewOutcome::Renewed(long) = store
        .renew(&short, Duration::from_secs(7200))
        .await
        .unwrap()
    else {
        panic!("renewed")
    };
    let after = ttl().await;
    assert!(
        covers(after, long.lease_until),
        "the TTL ({after} s) covers the lease ({:?}) and the retention",
        long.lease_until
    );
}

#[tokio::test]
async fn a_result_stored_late_moves_the_expiry_and_the_ttl_in_the_same_write() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let client = common::client(&endpoint);
    common::create_table(&client).await;
    let prefix = common::unique_prefix();
    let clock = ManualClock::starting_at(Timestamp::now());
    let store = DynamoDbStore::builder(client.clone(), &common::table())
        .unwrap()
        .prefix(&prefix)
        .unwrap()
        .skew_margin(Duration::ZERO)
        .clock(clock.clone())
        .build();
    let item = |key: Key| {
        let client = client.clone();
        let pk = idem_core::raw::storage_name::namespaced_key_name(&prefix, &key);
        async move {
            let found = client
                .get_item()
                .table_name(common::table())
                .key("pk", AttributeValue::S(pk))
                .consistent_read(true)
                .send()
                .await
                .unwrap();
            let number = |name: &str| match found.item().and_then(|item| item.get(name)) {
                Some(AttributeValue::N(n)) => n.parse::<u64>().unwrap(),
                other => panic!("no {name}: {other:?}"),
            };
            (number("ca"), number("ea"), number("ttl"))
        }
    };
    let retention = Duration::from_secs(60);
    for (name, late) in [
        ("early", Duration::from_secs(10)),
        ("late", Duration::from_secs(150)),
    ] {
        let key = Key::new("late", name).unwrap();
        let request = ClaimRequest::new(
            key.clone(),
            Fingerprint::of_bytes("x"),
            Duration::from_secs(3600),
            retention,
        );
        let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await.unwrap() else {
            panic!("a fresh claim")
        };
        clock.advance(late);
        assert_eq!(
            store.complete(&lease, b"r").await.unwrap(),
            WriteOutcome::Applied
        );
        let (created, expires, ttl) = item(key.clone()).await;
        let stored = lease.created_at.as_unix_millis() + late.as_millis() as u64;
        assert_eq!(created, lease.created_at.as_unix_millis());
        assert_eq!(
            expires,
            stored + retention.as_millis() as u64,
            "{name}: kept one retention after it was stored"
        );
        assert!(
            ttl * 1000 >= expires,
            "{name}: the TTL ({ttl} s) covers the expiry ({expires} ms)"
        );
        // A retry of the landed write changes nothing.
        clock.advance(Duration::from_secs(5));
        assert_eq!(
            store.complete(&lease, b"r").await.unwrap(),
            WriteOutcome::Applied
        );
        assert_eq!(item(key.clone()).await, (created, expires, ttl));
        assert!(matches!(
            store.claim(&request).await.unwrap(),
            ClaimOutcome::Replay { .. }
        ));
    }
    // A lease that misstates the creation time: the item's own is what counts.
    let key = Key::new("late", "misstated").unwrap();
    let request = ClaimRequest::new(
        key.clone(),
        Fingerprint::of_bytes("x"),
        Duration::from_secs(3600),
        retention,
    );
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await.unwrap() else {
        panic!("a fresh claim")
    };
    let mut misstated = lease.clone();
    misstated.created_at = lease.created_at.saturating_add(Duration::from_secs(100));
    clock.advance(Duration::from_secs(150));
    assert_eq!(
        store.complete(&misstated, b"r").await.unwrap(),
        WriteOutcome::Applied
    );
    let (created, expires, _) = item(key).await;
    assert_eq!(created, lease.created_at.as_unix_millis());
    assert_eq!(expires, created + 150_000 + retention.as_millis() as u64);
}

/// A release of a record without steps, after its lease ran out, keeps the lease's end
/// (`min(lease_until, now)`, as the state machine says) while it ends the record's
/// lifetime. This store reads its clock in the client: a client whose clock is behind the
/// releaser's still finds the record present, and must take the ended lease over instead
/// of finding it live again until the release's time.
#[tokio::test]
async fn a_late_release_without_steps_keeps_the_leases_end() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let client = common::client(&endpoint);
    common::create_table(&client).await;
    let start = Timestamp::now();
    let clock = ManualClock::starting_at(start);
    let store = DynamoDbStore::builder(client, &common::table())
        .unwrap()
        .prefix(&common::unique_prefix())
        .unwrap()
        .skew_margin(Duration::ZERO)
        .clock(clock.clone())
        .build();
    let key = Key::new("late-release", "no-steps").unwrap();
    let request = || {
        ClaimRequest::new(
            key.clone(),
            Fingerprint::of_bytes("x"),
            Duration::from_secs(10),
            Duration::from_secs(3600),
        )
    };
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request()).await.unwrap() else {
        panic!("a fresh key is claimed");
    };
    clock.advance(Duration::from_secs(20));
    assert_eq!(store.release(&lease).await.unwrap(), WriteOutcome::Applied);
    assert_eq!(
        store.get(&key).await.unwrap(),
        None,
        "a release without steps ends the record's lifetime"
    );

    // A client whose clock is 5 s behind the releaser's: the lease ended at +10 s there.
    clock.set(start.saturating_add(Duration::from_secs(15)));
    match store.claim(&request()).await.unwrap() {
        ClaimOutcome::Claimed {
            resumed,
            lease: taken,
            ..
        } => {
            assert!(resumed, "the present record is taken over");
            assert_eq!(taken.token, lease.token + 1);
        }
        other => panic!(
            "a release after the lease ran out moved the lease's end to the release: {other:?}"
        ),
    }
}

/// `idem inspect --raw` shows a response by its length only (it may hold personal data)
/// and every other blob as text, or as hex when it is not printable.
#[tokio::test]
async fn raw_shows_a_response_by_its_length_and_other_bytes_as_they_are() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let store = common::store(&endpoint).await;
    let request = ClaimRequest::new(
        Key::new("raw", "k").unwrap(),
        Fingerprint::of_bytes("raw"),
        Duration::from_secs(60),
        Duration::from_secs(3600),
    );
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await.unwrap() else {
        panic!("a fresh claim");
    };
    assert_eq!(
        store.complete(&lease, b"a secret answer").await.unwrap(),
        WriteOutcome::Applied
    );
    let raw = idem_core::Admin::raw(&store, &request.key)
        .await
        .unwrap()
        .expect("a record");
    let field = |name: &str| {
        raw.iter()
            .find(|(field, _)| field == name)
            .map(|(_, shown)| shown.clone())
            .unwrap_or_else(|| panic!("{name} in {raw:?}"))
    };
    use idem_dynamodb::attributes::{ATTEMPT, FINGERPRINT, PK, RESPONSE};
    assert_eq!(field(RESPONSE), "15 bytes");
    assert_eq!(
        field(FINGERPRINT),
        idem_core::raw::raw_text(request.fingerprint.as_bytes())
    );
    assert_eq!(
        field(ATTEMPT),
        idem_core::raw::raw_text(lease.attempt.as_bytes())
    );
    assert!(raw.iter().all(|(field, _)| field != PK), "{raw:?}");
}

/// With `claim_reads_first`, a replay, a failure's replay and a mismatch of a finished
/// record are one `GetItem` each, never a conditional write (billed as a write sized by
/// the item); a key in progress still goes on to the write.
#[tokio::test]
async fn a_claim_that_reads_first_answers_a_finished_record_from_the_read() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    common::create_table(&common::client(&endpoint)).await;
    let operations = common::Operations::default();
    let store = DynamoDbStore::builder(operations.client(&endpoint), &common::table())
        .unwrap()
        .prefix(&common::unique_prefix())
        .unwrap()
        .claim_reads_first(true)
        .build();
    let request = |key: &str, fingerprint: &str| {
        ClaimRequest::new(
            Key::new("reads", key).unwrap(),
            Fingerprint::of_bytes(fingerprint),
            Duration::from_secs(60),
            Duration::from_secs(3600),
        )
    };
    for (key, failed) in [("done", false), ("failed", true)] {
        let ClaimOutcome::Claimed { lease, .. } = store.claim(&request(key, "x")).await.unwrap()
        else {
            panic!("a fresh claim");
        };
        let written = if failed {
            store.fail(&lease, b"no").await
        } else {
            store.complete(&lease, b"yes").await
        };
        assert_eq!(written.unwrap(), WriteOutcome::Applied);
    }
    let ClaimOutcome::Claimed { .. } = store.claim(&request("running", "x")).await.unwrap() else {
        panic!("a fresh claim");
    };
    operations.take();

    let replay = store.claim(&request("done", "x")).await.unwrap();
    assert!(matches!(replay, ClaimOutcome::Replay { .. }), "{replay:?}");
    assert_eq!(operations.take(), ["GetItem"]);
    let failure = store.claim(&request("failed", "x")).await.unwrap();
    assert!(
        matches!(failure, ClaimOutcome::ReplayFailure { .. }),
        "{failure:?}"
    );
    assert_eq!(operations.take(), ["GetItem"]);
    let mismatch = store.claim(&request("done", "y")).await.unwrap();
    assert!(matches!(mismatch, ClaimOutcome::Mismatch), "{mismatch:?}");
    assert_eq!(operations.take(), ["GetItem"]);
    let running = store.claim(&request("running", "x")).await.unwrap();
    assert!(
        matches!(running, ClaimOutcome::InFlight { .. }),
        "{running:?}"
    );
    assert_eq!(operations.take(), ["GetItem", "UpdateItem"]);
}

/// Writes at the edges, on the store's clock: a release whose lease ends exactly at the
/// skew margin's cutoff, and a renewal retried at the instant its first try landed. Each
/// is answered as the state machine says, never refused as busy because the first write's
/// condition and the store's reading of the old item disagree on the edge.
#[tokio::test]
async fn releases_and_renewals_at_the_edges_are_applied() {
    let Some((store, clock)) = store_with_a_margin().await else {
        return;
    };
    let request = |key: &Key| {
        ClaimRequest::new(
            key.clone(),
            Fingerprint::of_bytes("x"),
            Duration::from_secs(10),
            Duration::from_secs(3600),
        )
    };

    // The lease ended 10 s on, and the 2 s margin after it is just over: the release
    // keeps the lease's end, and the key is claimed afresh.
    let key = Key::new("edges", "release").unwrap();
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request(&key)).await.unwrap() else {
        panic!("a fresh claim")
    };
    clock.advance(Duration::from_secs(12));
    assert_eq!(store.release(&lease).await.unwrap(), WriteOutcome::Applied);
    let again = store.claim(&request(&key)).await.unwrap();
    assert!(
        matches!(again, ClaimOutcome::Claimed { resumed: false, .. }),
        "{again:?}"
    );

    // The same renewal twice at one instant: the second finds the expiry it would write.
    let key = Key::new("edges", "renew").unwrap();
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request(&key)).await.unwrap() else {
        panic!("a fresh claim")
    };
    clock.advance(Duration::from_secs(1));
    for attempt in ["first", "retried"] {
        let renewed = store.renew(&lease, Duration::from_secs(10)).await;
        assert!(
            matches!(renewed, Ok(RenewOutcome::Renewed(_))),
            "{attempt}: {renewed:?}"
        );
    }
}
