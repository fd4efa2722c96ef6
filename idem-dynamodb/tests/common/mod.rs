//! Clients for DynamoDB Local, and stores isolated by key prefix in a shared table.

#![allow(dead_code)] // each test binary uses what it needs

use std::time::Duration;

use idem_dynamodb::DynamoDbStore;
use idem_dynamodb::aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use idem_dynamodb::aws_sdk_dynamodb::types::{TimeToLiveSpecification, TimeToLiveStatus};
use idem_dynamodb::aws_sdk_dynamodb::{Client, Config};

pub(crate) const ENDPOINT: &str = "IDEM_TEST_DYNAMODB_ENDPOINT";

/// A client for DynamoDB Local at `endpoint` (a loopback address from the services script).
pub(crate) fn client(endpoint: &str) -> Client {
    let config = Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "idem-tests"))
        .build();
    Client::from_conf(config)
}

/// The table this test process uses.
pub(crate) fn table() -> String {
    format!("idem_tests_{}", std::process::id())
}

pub(crate) fn unique_prefix() -> String {
    // The testkit's namespace carries a tag drawn per process: a process that gets an
    // earlier one's id also gets its table, whose records still live.
    format!("{}#", idem_testkit::Namespace::fresh())
}

/// Creates this process's table, with TTL deletion off: DynamoDB Local deletes an item
/// within a second or so of its TTL, which would race the tests that expire records and
/// then purge or read them.
pub(crate) async fn create_table(client: &Client) {
    // Once per process: tests on threads of one process (`cargo test`) share the table,
    // and DynamoDB refuses a second TTL change while one is under way.
    static CREATED: tokio::sync::Mutex<bool> = tokio::sync::Mutex::const_new(false);
    let mut created = CREATED.lock().await;
    if *created {
        return;
    }
    idem_dynamodb::create_table(client, &table())
        .await
        .expect("create the test table");
    let ttl = client
        .describe_time_to_live()
        .table_name(table())
        .send()
        .await
        .expect("describe the test table's TTL");
    let on = ttl
        .time_to_live_description()
        .and_then(|d| d.time_to_live_status())
        .is_some_and(|status| *status == TimeToLiveStatus::Enabled);
    if on {
        client
            .update_time_to_live()
            .table_name(table())
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .attribute_name("ttl")
                    .enabled(false)
                    .build()
                    .expect("a TTL specification"),
            )
            .send()
            .await
            .expect("turn TTL deletion off on the test table");
    }
    *created = true;
}

/// A store under `prefix` in this process's table, with no skew margin so lease expiry is
/// exact.
pub(crate) async fn store_in(endpoint: &str, prefix: &str) -> DynamoDbStore {
    store_with(endpoint, prefix, Duration::ZERO).await
}

/// A store under `prefix` in this process's table, whose takeovers wait `margin` past a
/// lease's end.
async fn store_with(endpoint: &str, prefix: &str, margin: Duration) -> DynamoDbStore {
    let client = client(endpoint);
    create_table(&client).await;
    DynamoDbStore::builder(client, &table())
        .expect("a valid table name")
        .prefix(prefix)
        .expect("a valid prefix")
        .skew_margin(margin)
        .build()
}

/// A store under a prefix no other test uses.
pub(crate) async fn store(endpoint: &str) -> DynamoDbStore {
    store_in(endpoint, &unique_prefix()).await
}

/// A store under a prefix no other test uses, whose takeovers wait `margin` past a
/// lease's end (the skew margin production runs with, scaled to the test's leases).
pub(crate) async fn store_with_margin(endpoint: &str, margin: Duration) -> DynamoDbStore {
    store_with(endpoint, &unique_prefix(), margin).await
}

/// The DynamoDB operations a client sends, by name, recorded as they go out.
#[derive(Debug, Clone, Default)]
pub(crate) struct Operations(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl idem_dynamodb::aws_sdk_dynamodb::config::Intercept for Operations {
    fn name(&self) -> &'static str {
        "Operations"
    }

    fn read_before_transmit(
        &self,
        context: &idem_dynamodb::aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _: &idem_dynamodb::aws_sdk_dynamodb::config::RuntimeComponents,
        _: &mut idem_dynamodb::aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        // Each operation once: the SDK's retries of it say `attempt=2` and on.
        let headers = context.request().headers();
        let first_attempt = headers
            .get("amz-sdk-request")
            .is_none_or(|value| value.starts_with("attempt=1;"));
        if let Some(target) = headers.get("x-amz-target").filter(|_| first_attempt) {
            let operation = target.rsplit('.').next().unwrap_or(target).to_owned();
            self.0.lock().unwrap().push(operation);
        }
        Ok(())
    }
}

impl Operations {
    /// A client for DynamoDB Local at `endpoint` that records here what it sends.
    pub(crate) fn client(&self, endpoint: &str) -> Client {
        let config = client(endpoint)
            .config()
            .to_builder()
            .interceptor(self.clone())
            .build();
        Client::from_conf(config)
    }

    pub(crate) fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}
