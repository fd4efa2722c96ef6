//! DynamoDB-specific behaviour: the skew margin, races, and errors.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    ClaimOutcome, ClaimRequest, Fingerprint, Idempotency, Key, ManualClock, Store, Timestamp,
};
use idem_dynamodb::DynamoDbStore;

#[tokio::test]
async fn a_takeover_waits_for_the_skew_margin() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let client = common::client(&endpoint);
    idem_dynamodb::create_table(&client, &common::table())
        .await
        .unwrap();
    let clock = ManualClock::starting_at(Timestamp::now());
    let store = DynamoDbStore::builder(client, common::table())
        .prefix(&common::unique_prefix())
        .unwrap()
        .skew_margin(Duration::from_secs(2))
        .clock(clock.clone())
        .build();
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
        ClaimOutcome::InFlight { retry_after } => assert_eq!(retry_after, Duration::from_secs(2)),
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
    let store = DynamoDbStore::new(common::client(&endpoint), "no_such_table");
    let request = ClaimRequest::new(
        Key::new("s", "k").unwrap(),
        Fingerprint::of_bytes("x"),
        Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let err = store.claim(&request).await.unwrap_err();
    assert!(
        matches!(err, idem_core::StoreError::Misconfigured { .. }),
        "{err:?}"
    );
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn an_unreachable_endpoint_is_a_retryable_error() {
    // Port 1 on loopback: nothing listens.
    let store = DynamoDbStore::new(common::client("http://127.0.0.1:1"), "t");
    let request = ClaimRequest::new(
        Key::new("s", "k").unwrap(),
        Fingerprint::of_bytes("x"),
        Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let err = store.claim(&request).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
}
