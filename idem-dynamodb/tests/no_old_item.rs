//! A server that sends no old item with a failed condition (DynamoDB may leave it out):
//! every decision that needs it falls back to a strongly consistent read. DynamoDB Local
//! always sends it, so these tests ask for none: an interceptor takes
//! `ReturnValuesOnConditionCheckFailure` off every `UpdateItem` before it is sent.

mod common;

use std::time::Duration;

use idem_core::{
    Fingerprint, Key, State, Store, store::ClaimOutcome, store::ClaimRequest, store::WriteOutcome,
};
use idem_dynamodb::DynamoDbStore;
use idem_dynamodb::aws_sdk_dynamodb::config::interceptors::BeforeSerializationInterceptorContextMut;
use idem_dynamodb::aws_sdk_dynamodb::config::{
    BehaviorVersion, ConfigBag, Credentials, Intercept, Region, RuntimeComponents,
};
use idem_dynamodb::aws_sdk_dynamodb::error::BoxError;
use idem_dynamodb::aws_sdk_dynamodb::operation::update_item::UpdateItemInput;
use idem_dynamodb::aws_sdk_dynamodb::{Client, Config};

/// Asks for no old item on any failed condition.
#[derive(Debug)]
struct NoOldItem;

impl Intercept for NoOldItem {
    fn name(&self) -> &'static str {
        "NoOldItem"
    }

    fn modify_before_serialization(
        &self,
        context: &mut BeforeSerializationInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(input) = context.input_mut().downcast_mut::<UpdateItemInput>() {
            input.return_values_on_condition_check_failure = None;
        }
        Ok(())
    }
}

/// A store under `prefix` whose failed conditions come back without the old item.
async fn store_without_old_items(endpoint: &str, prefix: &str) -> DynamoDbStore {
    let config = Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "idem-tests"))
        .interceptor(NoOldItem)
        .build();
    let client = Client::from_conf(config);
    common::create_table(&client).await;
    DynamoDbStore::builder(client, &common::table())
        .unwrap()
        .prefix(prefix)
        .unwrap()
        .skew_margin(Duration::ZERO)
        .build()
}

fn request(key: &Key, fingerprint: &str) -> ClaimRequest {
    ClaimRequest::new(
        key.clone(),
        Fingerprint::of_bytes(fingerprint),
        Duration::from_secs(60),
        Duration::from_secs(3600),
    )
}

#[tokio::test]
async fn a_retried_finish_reads_the_item_when_none_comes_back() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let store = store_without_old_items(&endpoint, &common::unique_prefix()).await;
    for (name, terminal) in [("completed", State::Completed), ("failed", State::Failed)] {
        let key = Key::new("no-old-item", name).unwrap();
        let ClaimOutcome::Claimed { lease, .. } = store.claim(&request(&key, "a")).await.unwrap()
        else {
            panic!("{name}: a fresh claim")
        };
        let finish = || async {
            match terminal {
                State::Failed => store.fail(&lease, b"r").await,
                _ => store.complete(&lease, b"r").await,
            }
        };
        assert_eq!(finish().await.unwrap(), WriteOutcome::Applied);
        // Retried after the first try landed: the condition fails, no old item comes back,
        // and the item read in its place shows this owner's result.
        assert_eq!(
            finish().await.unwrap(),
            WriteOutcome::Applied,
            "{name}: a retried finish whose first try landed must be Applied"
        );
        // The other terminal state is a change the owner never made: fenced.
        let other = match terminal {
            State::Failed => store.complete(&lease, b"r").await,
            _ => store.fail(&lease, b"r").await,
        };
        assert_eq!(other.unwrap(), WriteOutcome::Fenced, "{name}");
        assert_eq!(store.get(&key).await.unwrap().unwrap().state, terminal);
    }
}

#[tokio::test]
async fn claims_and_stale_writes_decide_on_the_item_read() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let store = store_without_old_items(&endpoint, &common::unique_prefix()).await;
    let key = Key::new("no-old-item", "claim").unwrap();
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request(&key, "a")).await.unwrap()
    else {
        panic!("a fresh claim")
    };
    assert!(matches!(
        store.claim(&request(&key, "a")).await.unwrap(),
        ClaimOutcome::InFlight { .. }
    ));
    assert_eq!(
        store.claim(&request(&key, "b")).await.unwrap(),
        ClaimOutcome::Mismatch
    );
    let mut stale = lease.clone();
    stale.token += 1;
    assert_eq!(
        store.complete(&stale, b"x").await.unwrap(),
        WriteOutcome::Fenced
    );
    assert_eq!(
        store.complete(&lease, b"r").await.unwrap(),
        WriteOutcome::Applied
    );
    assert!(matches!(
        store.claim(&request(&key, "a")).await.unwrap(),
        ClaimOutcome::Replay { .. }
    ));
    // A key with no item at all: the read finds nothing, the write is fenced.
    let mut missing = lease;
    missing.key = Key::new("no-old-item", "missing").unwrap();
    assert_eq!(
        store.complete(&missing, b"x").await.unwrap(),
        WriteOutcome::Fenced
    );
}
