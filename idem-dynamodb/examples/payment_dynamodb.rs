//! A payment that is charged once whatever the retries, on DynamoDB (DynamoDB Local here;
//! in AWS, build the client from your usual configuration instead).
//!
//! ```sh
//! eval "$(scripts/services.sh start dynamodb)"   # DynamoDB Local on 127.0.0.1
//! cargo run -p idem-dynamodb --example payment_dynamodb -- "$IDEM_TEST_DYNAMODB_ENDPOINT"
//! ```

use std::sync::atomic::{AtomicU32, Ordering};

use idem_core::{Fingerprint, Idempotency, Key, Store, Timestamp, done};
use idem_dynamodb::DynamoDbStore;
use idem_dynamodb::aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use idem_dynamodb::aws_sdk_dynamodb::{Client, Config};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoint = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("IDEM_TEST_DYNAMODB_ENDPOINT").ok())
        .unwrap_or_else(|| "http://127.0.0.1:8000".to_owned());
    // DynamoDB Local takes any credentials.
    let config = Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(&endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("local", "local", None, None, "example"))
        .build();
    let client = Client::from_conf(config);
    // Creates the table (with TTL on expired records) when missing.
    idem_dynamodb::create_table(&client, "idem_example").await?;
    let store = DynamoDbStore::new(client, "idem_example")?;
    println!("store: DynamoDB table idem_example at {endpoint}");
    pay_with_retries(store).await
}

/// Charges once, whatever the retries: the first attempt runs the work, the others get
/// its result back.
async fn pay_with_retries<S: Store + 'static>(store: S) -> Result<(), Box<dyn std::error::Error>> {
    let idem = Idempotency::new(store);
    // One key per logical operation; unique per run here so the example charges each time.
    let order = format!(
        "order-{}-{}",
        std::process::id(),
        Timestamp::now().as_unix_millis()
    );
    let key = Key::new("acct_42/payments.create", order)?;
    let request = Fingerprint::of_bytes("amount=500&currency=EUR");
    let charges = AtomicU32::new(0);
    for attempt in 1..=3 {
        let charges = &charges;
        let outcome = idem
            .execute(&key, request, |ctx| async move {
                charges.fetch_add(1, Ordering::SeqCst);
                // Charge the card here; ctx.token() fences the writes downstream.
                done(format!("ch_{}", ctx.token()))
            })
            .await?;
        let replayed = outcome.replayed();
        println!(
            "attempt {attempt}: {:?}, replayed: {replayed}",
            outcome.value()
        );
    }
    assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");
    println!("charged once for three attempts");
    Ok(())
}
