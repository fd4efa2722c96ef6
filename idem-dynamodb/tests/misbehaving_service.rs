//! The store against an endpoint that misbehaves: a raw TCP listener on 127.0.0.1
//! speaking just enough HTTP/1.1 to answer each DynamoDB operation (named by its
//! `X-Amz-Target` header) as a test says, or to close the connection without an answer.
//! A write that never got an answer is an error, never taken for a refused condition, and
//! `create_table` tells a table that already exists from a refusal.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Fingerprint, Key, Store, StoreError, Timestamp, key::StepName, machine, store::ClaimRequest,
};
use idem_dynamodb::DynamoDbStore;
use idem_dynamodb::aws_sdk_dynamodb::config::retry::RetryConfig;
use idem_dynamodb::aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use idem_dynamodb::aws_sdk_dynamodb::{Client, Config};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// An answer: an HTTP status and a JSON body, or `None` to close the connection unanswered.
type Answer = Option<(u16, &'static str)>;

/// A fake DynamoDB on 127.0.0.1 answering each operation with `answer(operation)`;
/// returns a client for it that sends each request once (no retries).
async fn fake_dynamodb(answer: impl Fn(&str) -> Answer + Send + Sync + 'static) -> Client {
    fake_dynamodb_reading(move |operation, _| answer(operation)).await
}

/// [`fake_dynamodb`], answering with `answer(operation, request body)`.
async fn fake_dynamodb_reading(
    answer: impl Fn(&str, &str) -> Answer + Send + Sync + 'static,
) -> Client {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let answer = Arc::clone(&answer);
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut read = BufReader::new(read);
                while let Some((operation, request)) = read_request(&mut read).await {
                    let Some((status, body)) = answer(&operation, &request) else {
                        return; // closed without an answer
                    };
                    let reply = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/x-amz-json-1.0\r\n\
                         content-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if write.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let config = Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "idem-tests"))
        .retry_config(RetryConfig::disabled())
        .build();
    Client::from_conf(config)
}

/// One request's operation (`CreateTable`, `UpdateItem`, ...) and body; `None` at the
/// end of the stream or on anything else.
async fn read_request<R: tokio::io::AsyncBufRead + Unpin>(
    read: &mut R,
) -> Option<(String, String)> {
    let (mut operation, mut length) = (None, 0);
    loop {
        let mut line = String::new();
        if read.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "x-amz-target" => operation = value.trim().rsplit('.').next().map(str::to_owned),
                "content-length" => length = value.trim().parse().ok()?,
                _ => {}
            }
        }
    }
    let mut body = vec![0; length];
    read.read_exact(&mut body).await.ok()?;
    Some((operation?, String::from_utf8(body).ok()?))
}

/// A lease as a claim at now would grant it, for writes sent straight to the store.
fn a_lease() -> idem_core::record::Lease {
    let request = ClaimRequest::new(
        Key::new("misbehaving", "k").unwrap(),
        Fingerprint::of_bytes("x"),
        Duration::from_secs(60),
        Duration::from_secs(3600),
    );
    let record = machine::claim(None, &request, Timestamp::now())
        .expect("a first claim is never refused")
        .write
        .expect("a fresh claim");
    machine::lease_of(&record, Duration::from_secs(3600))
}

#[tokio::test]
async fn a_write_that_gets_no_answer_is_an_error_never_a_fence() {
    // Every write goes unanswered; a read finds no item, which a write taken for a
    // refused condition would then answer as fenced.
    let client = fake_dynamodb(|operation| match operation {
        "GetItem" => Some((200, "{}")),
        _ => None,
    })
    .await;
    let store = DynamoDbStore::new(client, "idem").unwrap();
    let lease = a_lease();
    let step = StepName::new("charge").unwrap();
    let bounded = Duration::from_secs(30);
    // The fake answers: a read gets through and finds nothing.
    let read = tokio::time::timeout(bounded, store.get(&lease.key)).await;
    assert!(matches!(read, Ok(Ok(None))), "{read:?}");
    let answers = [
        (
            "complete",
            tokio::time::timeout(bounded, store.complete(&lease, b"r")).await,
        ),
        (
            "fail",
            tokio::time::timeout(bounded, store.fail(&lease, b"f")).await,
        ),
        (
            "release",
            tokio::time::timeout(bounded, store.release(&lease)).await,
        ),
        (
            "checkpoint",
            tokio::time::timeout(bounded, store.checkpoint(&lease, &step, b"s")).await,
        ),
    ];
    for (what, answer) in answers {
        let answer = answer.expect("the write ends");
        assert!(
            matches!(answer, Err(StoreError::Unavailable { .. })),
            "{what}: {answer:?}"
        );
    }
    let renewed = tokio::time::timeout(bounded, store.renew(&lease, Duration::from_secs(60)))
        .await
        .expect("the renewal ends");
    assert!(
        matches!(renewed, Err(StoreError::Unavailable { .. })),
        "{renewed:?}"
    );
}

#[tokio::test]
async fn create_table_refused_is_an_error_not_a_table_that_exists() {
    let client = fake_dynamodb(|operation| match operation {
        "CreateTable" => Some((
            400,
            r#"{"__type":"com.amazon.coral.validate#ValidationException","message":"One or more parameter values were invalid: BillingMode"}"#,
        )),
        "DescribeTable" => Some((
            200,
            r#"{"Table":{"TableName":"idem","TableStatus":"ACTIVE"}}"#,
        )),
        _ => Some((200, "{}")),
    })
    .await;
    let created = idem_dynamodb::create_table(&client, "idem").await;
    assert!(
        matches!(created, Err(StoreError::Backend { .. })),
        "{created:?}"
    );

    // One that exists already is waited for and left as it is.
    let client = fake_dynamodb(|operation| match operation {
        "CreateTable" => Some((
            400,
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#ResourceInUseException","message":"Table already exists: idem"}"#,
        )),
        "DescribeTable" => Some((
            200,
            r#"{"Table":{"TableName":"idem","TableStatus":"ACTIVE"}}"#,
        )),
        _ => None,
    })
    .await;
    let created = idem_dynamodb::create_table(&client, "idem").await;
    assert!(created.is_ok(), "{created:?}");
}

/// A purge of up to 10 records through `client`, bounded in time.
async fn purge_against(client: Client) -> Result<usize, StoreError> {
    let store = DynamoDbStore::new(client, "idem").unwrap();
    tokio::time::timeout(Duration::from_secs(30), store.purge_expired(10))
        .await
        .expect("the purge ends")
}

/// A purge's delete that finds the record claimed again since the scan (its condition
/// refused) skips it; one that gets no answer fails the purge, which must not report a
/// record deleted or quietly passed over.
#[tokio::test]
async fn a_purge_skips_a_record_claimed_since_and_fails_on_no_answer() {
    const SCANNED: &str =
        r#"{"Items":[{"pk":{"S":"1:s:k"},"tk":{"N":"1"}}],"Count":1,"ScannedCount":1}"#;
    let client = fake_dynamodb(|operation| match operation {
        "Scan" => Some((200, SCANNED)),
        "DeleteItem" => Some((
            400,
            r#"{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"The conditional request failed"}"#,
        )),
        _ => None,
    })
    .await;
    let purged = purge_against(client).await;
    assert_eq!(purged.unwrap(), 0);

    let client = fake_dynamodb(|operation| match operation {
        "Scan" => Some((200, SCANNED)),
        _ => None,
    })
    .await;
    let purged = purge_against(client).await;
    assert!(
        matches!(purged, Err(StoreError::Unavailable { .. })),
        "{purged:?}"
    );
}

/// A purge that stops inside a page puts its position back at that page's start, and the
/// next call goes on from there rather than from the top; a purge of nothing sends nothing.
#[tokio::test]
async fn a_purge_goes_on_from_the_page_it_stopped_in() {
    // The top page holds no purgeable record and points on to a second, which holds two.
    let scans = Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorded = Arc::clone(&scans);
    let client = fake_dynamodb_reading(move |operation, request| match operation {
        "Scan" => {
            let from_second = request.contains("ExclusiveStartKey");
            recorded
                .lock()
                .unwrap()
                .push(if from_second { "second" } else { "top" });
            Some((
                200,
                if from_second {
                    r#"{"Items":[{"pk":{"S":"1:s:a"},"tk":{"N":"1"}},{"pk":{"S":"1:s:b"},"tk":{"N":"1"}}],"Count":2,"ScannedCount":2}"#
                } else {
                    r#"{"Items":[],"Count":0,"ScannedCount":1,"LastEvaluatedKey":{"pk":{"S":"1:s:0"}}}"#
                },
            ))
        }
        "DeleteItem" => Some((200, "{}")),
        _ => None,
    })
    .await;
    let store = DynamoDbStore::new(client, "idem").unwrap();
    let bounded = Duration::from_secs(30);
    let purge = |limit| tokio::time::timeout(bounded, store.purge_expired(limit));

    assert_eq!(purge(0).await.expect("the purge ends").unwrap(), 0);
    assert!(
        scans.lock().unwrap().is_empty(),
        "a purge of nothing scanned"
    );

    assert_eq!(purge(1).await.expect("the purge ends").unwrap(), 1);
    assert_eq!(*scans.lock().unwrap(), ["top", "second"]);
    // Stopped inside the second page: the next call reads it again, not the top.
    assert_eq!(purge(1).await.expect("the purge ends").unwrap(), 1);
    assert_eq!(*scans.lock().unwrap(), ["top", "second", "second"]);
}
