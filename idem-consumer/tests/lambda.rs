//! Lambda's SQS events, as AWS sends them (the event JSON of AWS's documentation), through
//! `handle_sqs_event`: only the records that must come back are answered as failures.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use bytes::Bytes;
use idem_consumer::Consumer;
use idem_consumer::lambda::handle_sqs_event;
use idem_core::{Context, Idempotency, MemoryStore, WorkError};

/// An SQS event as Lambda delivers it: one record per `(message id, body, receive count)`.
fn event(queue: &str, records: &[(&str, &str, u32)], fifo_group: Option<&str>) -> SqsEvent {
    let records: Vec<serde_json::Value> = records
        .iter()
        .map(|(id, body, received)| {
            let mut attributes = serde_json::json!({
                "ApproximateReceiveCount": received.to_string(),
                "SentTimestamp": "1545082649183",
                "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                "ApproximateFirstReceiveTimestamp": "1545082649185"
            });
            if let Some(group) = fifo_group {
                attributes["MessageGroupId"] = group.into();
                attributes["MessageDeduplicationId"] = format!("dedup-{id}").into();
                attributes["SequenceNumber"] = "18849496460467696128".into();
            }
            serde_json::json!({
                "messageId": id,
                "receiptHandle": format!("AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a...{id}"),
                "body": body,
                "attributes": attributes,
                "messageAttributes": {},
                "md5OfBody": "e4e68fb7bd0e697a0ae8f1bb342846b3",
                "eventSource": "aws:sqs",
                "eventSourceARN": format!("arn:aws:sqs:us-east-2:123456789012:{queue}"),
                "awsRegion": "us-east-2"
            })
        })
        .collect();
    serde_json::from_value(serde_json::json!({ "Records": records })).expect("an SQS event")
}

fn failures(response: &SqsBatchResponse) -> Vec<String> {
    response
        .batch_item_failures
        .iter()
        .map(|failure| failure.item_identifier.clone())
        .collect()
}

/// Work that counts its runs: an empty body fails for good, `busy` fails retryably.
fn work(
    runs: &Arc<AtomicUsize>,
) -> impl Fn(Context, Bytes) -> std::future::Ready<Result<usize, WorkError<String>>> + use<> {
    let runs = Arc::clone(runs);
    move |_ctx, payload| {
        runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready(match &payload[..] {
            b"" => Err(WorkError::Permanent("an empty order".to_owned())),
            b"busy" => Err(WorkError::Retryable("warehouse busy".to_owned())),
            _ => Ok(payload.len()),
        })
    }
}

#[tokio::test]
async fn only_the_records_that_failed_come_back_and_a_redelivery_replays() {
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let batch = [
        ("059f36b4-87a3-44ab-83d2-661975830a7d", "2 mugs", 1),
        ("2e1424d4-f796-459a-8184-9c92662be6da", "", 1),
        ("3a9c2f7e-1b2d-4c5e-9f80-123456789abc", "busy", 1),
    ];
    let response = handle_sqs_event(&consumer, event("orders", &batch, None), work(&runs)).await;
    // The permanent failure is a dead letter, left to the queue's redrive policy; the
    // retryable one comes back.
    assert_eq!(
        failures(&response),
        [
            "2e1424d4-f796-459a-8184-9c92662be6da",
            "3a9c2f7e-1b2d-4c5e-9f80-123456789abc"
        ]
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // The answer Lambda reads: camelCase, as the runtime serialises it.
    let json = serde_json::to_value(&response).unwrap();
    assert_eq!(
        json["batchItemFailures"][0]["itemIdentifier"],
        "2e1424d4-f796-459a-8184-9c92662be6da"
    );

    // SQS delivers the whole batch again (the function timed out after its work): the
    // success and the permanent failure replay, only the retryable one runs.
    let again = batch.map(|(id, body, _)| (id, body, 2));
    let response = handle_sqs_event(&consumer, event("orders", &again, None), work(&runs)).await;
    assert_eq!(
        failures(&response),
        [
            "2e1424d4-f796-459a-8184-9c92662be6da",
            "3a9c2f7e-1b2d-4c5e-9f80-123456789abc"
        ]
    );
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_fifo_batch_stops_at_its_first_failure_and_returns_the_rest_unrun() {
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let batch = [("m-1", "first", 1), ("m-2", "busy", 1), ("m-3", "third", 1)];
    let response = handle_sqs_event(
        &consumer,
        event("orders.fifo", &batch, Some("customer-7")),
        work(&runs),
    )
    .await;
    assert_eq!(failures(&response), ["m-2", "m-3"]);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "m-3 must not overtake m-2");
}

#[tokio::test]
async fn a_failed_record_without_a_message_id_fails_the_whole_batch() {
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let mut event = event("orders", &[("m-1", "busy", 1)], None);
    event.records[0].message_id = None;
    let response = handle_sqs_event(&consumer, event, work(&runs)).await;
    // An empty identifier: Lambda retries the whole batch.
    assert_eq!(failures(&response), [""]);
}

#[tokio::test]
async fn a_failure_holds_back_its_own_fifo_group_only() {
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let mut records: Vec<serde_json::Value> = Vec::new();
    for (id, body, group) in [
        ("a-1", "busy", "customer-1"),
        ("b-1", "first", "customer-2"),
        ("a-2", "second", "customer-1"),
        ("b-2", "second", "customer-2"),
    ] {
        let mut one = serde_json::to_value(event("orders.fifo", &[(id, body, 1)], Some(group)))
            .unwrap()["Records"][0]
            .clone();
        one["attributes"]["MessageDeduplicationId"] = format!("dedup-{id}").into();
        records.push(one);
    }
    let event: SqsEvent =
        serde_json::from_value(serde_json::json!({ "Records": records })).unwrap();
    let response = handle_sqs_event(&consumer, event, work(&runs)).await;
    assert_eq!(failures(&response), ["a-1", "a-2"]);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "a-2 must not run behind a-1"
    );
}

#[tokio::test]
async fn one_deduplication_id_in_two_groups_is_two_messages() {
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let mut records: Vec<serde_json::Value> = Vec::new();
    for (id, body, group) in [
        ("m-1", "2 mugs", "customer-1"),
        ("m-2", "3 cups", "customer-2"),
    ] {
        let mut one = serde_json::to_value(event("orders.fifo", &[(id, body, 1)], Some(group)))
            .unwrap()["Records"][0]
            .clone();
        // Deduplication scoped by message group: the same id in each.
        one["attributes"]["MessageDeduplicationId"] = "order-7".into();
        records.push(one);
    }
    let event: SqsEvent =
        serde_json::from_value(serde_json::json!({ "Records": records })).unwrap();
    let response = handle_sqs_event(&consumer, event, work(&runs)).await;
    assert!(failures(&response).is_empty(), "{response:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn without_partial_batch_answers_a_failure_fails_the_invocation() {
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let fine = event("orders", &[("m-1", "2 mugs", 1)], None);
    assert_eq!(
        idem_consumer::lambda::handle_sqs_event_or_fail(&consumer, fine, work(&runs)).await,
        Ok(())
    );
    let mixed = event("orders", &[("m-1", "2 mugs", 2), ("m-2", "busy", 1)], None);
    let failed = idem_consumer::lambda::handle_sqs_event_or_fail(&consumer, mixed, work(&runs))
        .await
        .unwrap_err();
    assert_eq!(failed.failed, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "m-1 replayed");
}
