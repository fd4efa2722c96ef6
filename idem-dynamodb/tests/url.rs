//! A store opened from a `dynamodb://` URL, as `idem migrate` and the other commands open
//! it: `migrate` creates the table and says so, and the store it opens works. The AWS
//! variables are the process's own, so the test runs itself again as a child process with
//! them set.
#![cfg(feature = "url")]

mod common;

use std::time::Duration;

use idem_core::connect::{ConnectOptions, Create, parse_url};
use idem_core::{Fingerprint, Key, store::ClaimOutcome, store::ClaimRequest};

const CHILD: &str = "IDEM_DYNAMODB_URL_TEST_ENDPOINT";

#[tokio::test]
async fn migrate_creates_the_table_a_url_names_and_open_uses_it() {
    if let Ok(endpoint) = std::env::var(CHILD) {
        return in_child(&endpoint).await;
    }
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "migrate_creates_the_table_a_url_names_and_open_uses_it",
            "--test-threads=1",
        ])
        .env(CHILD, &endpoint)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env_remove("AWS_SESSION_TOKEN")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && said.contains("1 passed"),
        "{said}{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

async fn in_child(endpoint: &str) {
    let table = format!("idem_url_{}", idem_testkit::Namespace::fresh());
    let url = format!("dynamodb://{table}?region=us-east-1&endpoint={endpoint}");
    let options = ConnectOptions::default().prefix("url#");
    let location = parse_url(&url, &options, &[&idem_dynamodb::BACKEND]).unwrap();
    let said = location.migrate().await.expect("migrate");
    assert_eq!(
        said,
        format!(
            "DynamoDB table {table} prefix \"url#\" in us-east-1 at {endpoint} is active, \
             with TTL on attribute `ttl`"
        )
    );
    let store = location.open(Create::No).await.expect("open");
    let request = ClaimRequest::new(
        Key::new("url", "k").unwrap(),
        Fingerprint::of_bytes("x"),
        Duration::from_secs(60),
        Duration::from_secs(3600),
    );
    let claimed = store.claim(&request).await.expect("a claim");
    assert!(
        matches!(claimed, ClaimOutcome::Claimed { .. }),
        "{claimed:?}"
    );
}
