//! The SQS adapter against a local SQS-compatible server on 127.0.0.1 (moto's, which
//! scripts/services.sh installs from PyPI and starts; `IDEM_TEST_SQS_URL`). Every wait is
//! bounded.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::QueueAttributeName;
use bytes::Bytes;
use idem_consumer::sqs::{DEAD_LETTER_REASON, DeadLetters, ORIGINAL_ID, SqsMessage, SqsQueue};
use idem_consumer::{Backoff, Cause, Consumer, DeadLetterReason, Message, Settled};
use idem_core::{Context, Idempotency, MemoryStore, WorkError, done};

mod common;
use common::{AckLost, counted, refusing_empty};

fn client() -> Option<Client> {
    let url = idem_testkit::service_url("IDEM_TEST_SQS_URL")?;
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(url)
        .credentials_provider(Credentials::new("test", "test", None, None, "idem-tests"))
        .build();
    Some(Client::from_conf(config))
}

/// A queue of its own, created afresh, and its dead-letter queue; their URLs.
async fn queues(client: &Client, name: &str, fifo: bool) -> (String, String) {
    let mut urls = Vec::new();
    for name in [name.to_owned(), format!("{name}-dead")] {
        let name = if fifo { format!("{name}.fifo") } else { name };
        if let Ok(found) = client.get_queue_url().queue_name(&name).send().await {
            let _ = client
                .delete_queue()
                .queue_url(found.queue_url().unwrap())
                .send()
                .await;
        }
        let mut create = client.create_queue().queue_name(&name);
        if fifo {
            create = create.attributes(QueueAttributeName::FifoQueue, "true");
        }
        let created = create.send().await.expect("create the queue");
        urls.push(created.queue_url().unwrap().to_owned());
    }
    (urls.remove(0), urls.remove(0))
}

async fn send(client: &Client, queue_url: &str, body: &str) -> String {
    let sent = client
        .send_message()
        .queue_url(queue_url)
        .message_body(body)
        .send()
        .await
        .expect("send");
    sent.message_id().unwrap().to_owned()
}

/// Batches until `count` messages came, within fifteen seconds.
async fn read(queue: &SqsQueue, count: usize) -> Vec<SqsMessage> {
    let mut batch = Vec::new();
    for _ in 0..30 {
        batch.extend(
            queue
                .next_batch(10, Duration::from_secs(1))
                .await
                .expect("a batch"),
        );
        if batch.len() >= count {
            return batch;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{} of {count} messages came", batch.len());
}

async fn depth(client: &Client, queue_url: &str) -> (u64, u64) {
    let attributes = client
        .get_queue_attributes()
        .queue_url(queue_url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .expect("queue attributes");
    let all: HashMap<_, _> = attributes.attributes().cloned().unwrap_or_default();
    let count = |name| {
        all.get(&name)
            .and_then(|v: &String| v.parse().ok())
            .unwrap_or(u64::MAX)
    };
    (
        count(QueueAttributeName::ApproximateNumberOfMessages),
        count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
    )
}

#[tokio::test]
async fn a_message_whose_delete_was_lost_comes_back_and_replays() {
    let Some(client) = client() else {
        return;
    };
    let (url, dead) = queues(&client, "idem-ack-lost", false).await;
    let id = send(&client, &url, "2 mugs").await;
    let queue = SqsQueue::new(client.clone(), &url, DeadLetters::send_to(dead))
        .visibility(Duration::from_secs(1));
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));

    let first = read(&queue, 1).await.remove(0);
    assert_eq!(first.id(), Some(id.as_str()));
    assert_eq!(first.source(), "idem-ack-lost");
    assert_eq!(first.delivery_count(), Some(1));
    let settled = consumer
        .handle(&AckLost(&first), counted(&runs))
        .await
        .unwrap();
    assert!(
        matches!(
            settled,
            Settled::Acked {
                value: 6,
                replayed: false
            }
        ),
        "{settled:?}"
    );
    // Its visibility (1 s) ends: received again, replayed, deleted.
    let again = read(&queue, 1).await.remove(0);
    assert_eq!(again.id(), Some(id.as_str()));
    assert_eq!(again.delivery_count(), Some(2));
    let settled = consumer.handle(&again, counted(&runs)).await.unwrap();
    assert!(settled.replayed(), "{settled:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(depth(&client, &url).await, (0, 0));
}

#[tokio::test]
async fn a_nak_comes_back_after_its_delay_not_before() {
    let Some(client) = client() else {
        return;
    };
    let (url, dead) = queues(&client, "idem-nak", false).await;
    send(&client, &url, "x").await;
    // A visibility far above the delay: only the nak's own delay brings it back.
    let queue = SqsQueue::new(client.clone(), &url, DeadLetters::send_to(dead))
        .visibility(Duration::from_secs(60));
    let delay = Duration::from_secs(2);
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()))
        .backoff(Backoff::new(delay, delay).unwrap());
    let runs = Arc::new(AtomicUsize::new(0));
    let flaky = |_ctx: Context, _payload: Bytes| {
        let run = runs.fetch_add(1, Ordering::SeqCst);
        async move {
            if run == 0 {
                Err(WorkError::Retryable("warehouse busy".to_owned()))
            } else {
                Ok(run)
            }
        }
    };
    let first = read(&queue, 1).await.remove(0);
    let naked = tokio::time::Instant::now();
    let settled = consumer.handle(&first, flaky).await.unwrap();
    assert!(
        matches!(settled, Settled::Retried { delay: d, .. } if d == delay),
        "{settled:?}"
    );
    assert!(
        queue
            .next_batch(10, Duration::ZERO)
            .await
            .unwrap()
            .is_empty()
    );
    let again = read(&queue, 1).await.remove(0);
    assert!(
        naked.elapsed() >= delay - Duration::from_millis(100),
        "{:?}",
        naked.elapsed()
    );
    assert_eq!(again.delivery_count(), Some(2));
    let settled = consumer.handle(&again, flaky).await.unwrap();
    assert!(
        matches!(
            settled,
            Settled::Acked {
                value: 1,
                replayed: false
            }
        ),
        "{settled:?}"
    );
    assert_eq!(depth(&client, &url).await, (0, 0));
}

#[tokio::test]
async fn long_work_keeps_its_message_invisible_to_another_reader() {
    let Some(client) = client() else {
        return;
    };
    let (url, dead) = queues(&client, "idem-progress", false).await;
    for i in 0..2 {
        send(&client, &url, &format!("order {i}")).await;
    }
    let visibility = Duration::from_secs(1);
    let queue =
        SqsQueue::new(client.clone(), &url, DeadLetters::send_to(&dead)).visibility(visibility);
    let replica =
        SqsQueue::new(client.clone(), &url, DeadLetters::send_to(dead)).visibility(visibility);
    // One at a time, 2.5 s each against a visibility of 1 s: the second waits its turn.
    let consumer =
        Consumer::new(Idempotency::new(MemoryStore::new())).concurrency(NonZeroUsize::MIN);
    let runs = Arc::new(AtomicUsize::new(0));
    let slow = |_ctx: Context, _payload: Bytes| {
        runs.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_millis(2500)).await;
            done(1u8)
        }
    };
    let batch = read(&queue, 2).await;
    let handled = consumer.handle_batch(&batch, slow);
    let watch = async {
        let mut received = Vec::new();
        for _ in 0..20 {
            received.extend(replica.next_batch(10, Duration::ZERO).await.unwrap());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        received
    };
    let (settled, received) = tokio::join!(handled, watch);
    assert!(
        settled.iter().all(|s| matches!(s, Ok(s) if s.is_acked())),
        "{settled:?}"
    );
    assert!(received.is_empty(), "received while handled: {received:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(depth(&client, &url).await, (0, 0));
}

#[tokio::test]
async fn dead_letters_are_sent_with_their_reason_then_deleted() {
    let Some(client) = client() else {
        return;
    };
    let (url, dead) = queues(&client, "idem-dead", false).await;
    let id = send(&client, &url, "").await;
    let queue = SqsQueue::new(client.clone(), &url, DeadLetters::send_to(&dead));
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let message = read(&queue, 1).await.remove(0);
    let settled = consumer
        .handle(&message, refusing_empty(&runs))
        .await
        .unwrap();
    assert!(
        matches!(
            settled,
            Settled::DeadLettered {
                reason: DeadLetterReason::Failed,
                cause: Cause::Work(_)
            }
        ),
        "{settled:?}"
    );
    assert_eq!(depth(&client, &url).await, (0, 0));
    let copies = client
        .receive_message()
        .queue_url(&dead)
        .message_attribute_names("All")
        .wait_time_seconds(2)
        .send()
        .await
        .unwrap();
    let copy = &copies.messages()[0];
    let attribute = |name: &str| {
        copy.message_attributes()
            .and_then(|all| all.get(name))
            .and_then(|value| value.string_value())
            .map(str::to_owned)
    };
    assert_eq!(attribute(DEAD_LETTER_REASON).as_deref(), Some("failed"));
    assert_eq!(attribute(ORIGINAL_ID).as_deref(), Some(id.as_str()));
}

#[tokio::test]
async fn a_fifo_queue_keys_by_the_deduplication_id_and_dead_letters_to_a_fifo_queue() {
    let Some(client) = client() else {
        return;
    };
    let (url, dead) = queues(&client, "idem-fifo", true).await;
    for (dedup, body) in [("order-1", "2 mugs"), ("order-2", "")] {
        client
            .send_message()
            .queue_url(&url)
            .message_body(body)
            .message_group_id("customer-7")
            .message_deduplication_id(dedup)
            .send()
            .await
            .expect("send");
    }
    let queue = SqsQueue::new(client.clone(), &url, DeadLetters::send_to(&dead));
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let batch = read(&queue, 2).await;
    let ids: Vec<_> = batch.iter().map(|m| m.id().unwrap().to_owned()).collect();
    assert_eq!(ids, ["order-1", "order-2"]);
    // Scoped by group: deduplication may be per group.
    assert_eq!(batch[0].source(), "idem-fifo.fifo/customer-7");
    let settled = consumer.handle_batch(&batch, refusing_empty(&runs)).await;
    assert!(
        matches!(settled[0], Ok(Settled::Acked { .. })),
        "{settled:?}"
    );
    assert!(
        matches!(
            settled[1],
            Ok(Settled::DeadLettered {
                reason: DeadLetterReason::Failed,
                ..
            })
        ),
        "{settled:?}"
    );
    assert_eq!(depth(&client, &url).await, (0, 0));
    assert_eq!(depth(&client, &dead).await.0, 1);
}

#[tokio::test]
async fn a_fifo_group_s_message_never_overtakes_one_that_failed() {
    let Some(client) = client() else {
        return;
    };
    let (url, dead) = queues(&client, "idem-fifo-order", true).await;
    for (dedup, body) in [("order-1", "busy"), ("order-2", "2 mugs")] {
        client
            .send_message()
            .queue_url(&url)
            .message_body(body)
            .message_group_id("customer-7")
            .message_deduplication_id(dedup)
            .send()
            .await
            .expect("send");
    }
    let queue = SqsQueue::new(client.clone(), &url, DeadLetters::send_to(&dead));
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()))
        .backoff(Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).unwrap());
    let ran = Arc::new(std::sync::Mutex::new(Vec::new()));
    let work = |_ctx: Context, payload: Bytes| {
        ran.lock().unwrap().push(payload.clone());
        async move {
            if &payload[..] == b"busy" {
                Err(WorkError::Retryable("warehouse busy".to_owned()))
            } else {
                Ok(payload.len())
            }
        }
    };
    let batch = read(&queue, 2).await;
    let settled = consumer.handle_batch(&batch, work).await;
    assert!(
        matches!(
            settled[0],
            Ok(Settled::Retried {
                cause: Cause::Work(_),
                ..
            })
        ),
        "{settled:?}"
    );
    assert!(
        matches!(
            settled[1],
            Ok(Settled::Retried {
                cause: Cause::BehindUnacked,
                ..
            })
        ),
        "{settled:?}"
    );
    assert_eq!(ran.lock().unwrap().len(), 1, "order-2 overtook order-1");
}
