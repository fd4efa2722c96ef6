//! Deliveries and their settlements: an ack lost in a crash, a nak's delay, a fetched
//! batch, two durable consumers, a message without a publisher id.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use bytes::Bytes;
use idem_consumer::nats::JetStreamMessage;
use idem_consumer::{Backoff, Consumer, DeadLetterReason, Message, Settled};
use idem_core::{Context, Idempotency, MemoryStore, WorkError, done};

use crate::common::{counted, refusing_empty};
use crate::support::{AckLost, assert_settled, fetch, next, publish, setup, source_of, subject};

#[tokio::test]
async fn an_ack_lost_in_a_crash_is_redelivered_and_replayed_never_run_twice() {
    let Some((js, mut pull, _)) = setup("IDEM_ACK_LOST").await else {
        return;
    };
    publish(&js, subject(&pull, "orders"), Some("order-1"), "2 mugs").await;
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let mut messages = pull.messages().await.expect("subscribe");

    let first = next(&mut messages).await;
    assert_eq!(first.id(), Some("order-1"));
    assert_eq!(first.delivery_count(), Some(1));
    let settled = consumer
        .handle(&AckLost(&first), counted(&runs))
        .await
        .unwrap();
    assert!(matches!(
        settled,
        Settled::Acked {
            value: 6,
            replayed: false
        }
    ));

    // JetStream redelivers once the ack wait (1 s) ends.
    let again = next(&mut messages).await;
    assert_eq!(again.id(), Some("order-1"));
    assert_eq!(again.delivery_count(), Some(2));
    let settled = consumer.handle(&again, counted(&runs)).await.unwrap();
    assert!(
        matches!(
            settled,
            Settled::Acked {
                value: 6,
                replayed: true
            }
        ),
        "{settled:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_settled(&mut pull).await;
}

#[tokio::test]
async fn a_retryable_failure_is_naked_with_its_delay_and_redelivered() {
    let Some((js, mut pull, _)) = setup("IDEM_NAK").await else {
        return;
    };
    publish(&js, subject(&pull, "orders"), Some("order-1"), "x").await;
    let delay = Duration::from_millis(300);
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()))
        .backoff(Backoff::new(delay, delay).unwrap());
    let mut messages = pull.messages().await.expect("subscribe");
    let runs = Arc::new(AtomicUsize::new(0));
    let flaky = |runs: Arc<AtomicUsize>| {
        move |_ctx: Context, _payload: Bytes| {
            let run = runs.fetch_add(1, Ordering::SeqCst);
            async move {
                if run == 0 {
                    Err(WorkError::Retryable("warehouse busy".to_owned()))
                } else {
                    done(run).map_err(|_| WorkError::Permanent(String::new()))
                }
            }
        }
    };
    let first = next(&mut messages).await;
    let naked_at = tokio::time::Instant::now();
    let settled = consumer
        .handle(&first, flaky(Arc::clone(&runs)))
        .await
        .unwrap();
    assert!(
        matches!(settled, Settled::Retried { delay: d, .. } if d == delay),
        "{settled:?}"
    );

    let again = next(&mut messages).await;
    assert!(
        naked_at.elapsed() >= delay,
        "redelivered before its delay: {:?}",
        naked_at.elapsed()
    );
    assert_eq!(again.delivery_count(), Some(2));
    let settled = consumer
        .handle(&again, flaky(Arc::clone(&runs)))
        .await
        .unwrap();
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
    assert_settled(&mut pull).await;
}

#[tokio::test]
async fn a_fetched_batch_is_settled_per_message() {
    let Some((js, mut pull, _)) = setup("IDEM_BATCH").await else {
        return;
    };
    for i in 0..20 {
        let payload = if i % 5 == 4 {
            String::new()
        } else {
            format!("order {i}")
        };
        publish(
            &js,
            subject(&pull, "orders"),
            Some(&format!("m-{i}")),
            &payload,
        )
        .await;
    }
    // A message its publisher gave no id: keyed by where the stream stored it, it runs.
    publish(&js, subject(&pull, "orders"), None, "order 20").await;
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let batch: Vec<_> = fetch(&pull, 21)
        .await
        .into_iter()
        .map(JetStreamMessage::new)
        .collect();
    let settled = consumer.handle_batch(&batch, refusing_empty(&runs)).await;
    let (mut acked, mut dead) = (0, 0);
    for settled in settled {
        match settled.unwrap() {
            Settled::Acked { .. } => acked += 1,
            Settled::DeadLettered {
                reason: DeadLetterReason::Failed,
                ..
            } => dead += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((acked, dead), (17, 4));
    assert_eq!(runs.load(Ordering::SeqCst), 21);
    assert_settled(&mut pull).await;
}

#[tokio::test]
async fn two_durable_consumers_of_one_stream_each_run_every_message_on_one_store() {
    let Some((js, pull, _)) = setup("IDEM_TWO_CONSUMERS").await else {
        return;
    };
    let stream = pull.cached_info().stream_name.clone();
    let shipping: PullConsumer = js
        .get_stream(&stream)
        .await
        .expect("the stream")
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("shipping".to_owned()),
            ack_wait: Duration::from_secs(1),
            ..Default::default()
        })
        .await
        .expect("a second consumer");
    publish(&js, format!("{stream}.orders"), Some("order-1"), "2 mugs").await;
    // One store for both, as one service would have.
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    for pull in [&pull, &shipping] {
        let mut messages = pull.messages().await.expect("subscribe");
        let message = next(&mut messages).await;
        let settled = consumer.handle(&message, counted(&runs)).await.unwrap();
        assert!(
            matches!(
                settled,
                Settled::Acked {
                    replayed: false,
                    ..
                }
            ),
            "{settled:?}"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "billing and shipping each ran it"
    );
}

#[tokio::test]
async fn a_message_without_a_publisher_id_is_keyed_by_where_the_stream_stored_it() {
    let Some((js, mut pull, _)) = setup("IDEM_NO_ID").await else {
        return;
    };
    // `js.publish` sets no Nats-Msg-Id: the most common publisher.
    js.publish(subject(&pull, "orders"), Bytes::from_static(b"2 mugs"))
        .await
        .expect("publish")
        .await
        .expect("stored");
    let source = source_of(&pull);
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let mut messages = pull.messages().await.expect("subscribe");

    let first = source.wrap(next(&mut messages).await.into_inner());
    let key = first.id().expect("a key without a publisher id").to_owned();
    let parts: Vec<&str> = key.split('/').collect();
    assert_eq!(
        parts[..3],
        ["nats-stream-sequence", "IDEM_NO_ID", "1"],
        "{key}"
    );
    assert!(
        parts[3].parse::<u128>().is_ok_and(|nanos| nanos > 0),
        "{key}"
    );
    assert_eq!(parts.len(), 4, "{key}");
    let settled = consumer
        .handle(&AckLost(&first), counted(&runs))
        .await
        .unwrap();
    assert!(
        matches!(
            settled,
            Settled::Acked {
                replayed: false,
                ..
            }
        ),
        "{settled:?}"
    );

    // The redelivery carries the same key and replays.
    let again = source.wrap(next(&mut messages).await.into_inner());
    assert_eq!(again.id(), Some(key.as_str()));
    assert_eq!(again.delivery_count(), Some(2));
    let settled = consumer.handle(&again, counted(&runs)).await.unwrap();
    assert!(settled.replayed(), "{settled:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_settled(&mut pull).await;
}
