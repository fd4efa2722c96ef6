//! The JetStream adapter against a real nats-server on 127.0.0.1 (scripts/services.sh
//! starts it; `IDEM_TEST_NATS_URL`). Every wait is bounded.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer::PullConsumer};
use bytes::Bytes;
use futures_util::StreamExt;
use idem_consumer::nats::{
    DEAD_LETTER_REASON, DeadLetters, JetStreamMessage, JetStreamSource, ORIGINAL_CONSUMER,
    ORIGINAL_ID, ORIGINAL_STREAM, SetupError,
};
use idem_consumer::{Backoff, Cause, Consumer, DeadLetterReason, Message, SettleError, Settled};
use idem_core::{Context, Idempotency, MemoryStore, WorkError, done};

mod common;
use common::{FailingClaims, counted, refusing_empty};

const WAIT: Duration = Duration::from_secs(15);

/// A stream of its own (`<name>.>`), its pull consumer with a short ack wait, and a
/// dead-letter stream (`<name>_DLQ`, subject `<name>_dlq`).
async fn setup(
    name: &str,
) -> Option<(jetstream::Context, PullConsumer, jetstream::stream::Stream)> {
    let url = idem_testkit::service_url("IDEM_TEST_NATS_URL")?;
    let client = async_nats::connect(url)
        .await
        .expect("connect to the test nats-server");
    let js = jetstream::new(client);
    // A fixed name per test: the next run deletes what this one leaves, so a broker kept
    // running between runs holds at most one stream per test.
    let name = name.to_owned();
    for stream in [name.clone(), format!("{name}_DLQ")] {
        let _ = js.delete_stream(&stream).await;
    }
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            ..Default::default()
        })
        .await
        .expect("create the stream");
    let dlq = js
        .create_stream(jetstream::stream::Config {
            name: format!("{name}_DLQ"),
            subjects: vec![format!("{name}_dlq")],
            ..Default::default()
        })
        .await
        .expect("create the dead-letter stream");
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("billing".to_owned()),
            ack_wait: Duration::from_secs(1),
            ..Default::default()
        })
        .await
        .expect("create the consumer");
    Some((js, consumer, dlq))
}

async fn publish(js: &jetstream::Context, subject: String, id: Option<&str>, payload: &str) {
    let mut headers = HeaderMap::new();
    if let Some(id) = id {
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
    }
    js.publish_with_headers(subject, headers, Bytes::from(payload.to_owned()))
        .await
        .expect("publish")
        .await
        .expect("the stream stored the message");
}

async fn next(messages: &mut jetstream::consumer::pull::Stream) -> JetStreamMessage {
    let message = tokio::time::timeout(WAIT, messages.next())
        .await
        .expect("a delivery within the wait")
        .expect("the stream goes on")
        .expect("a delivery");
    JetStreamMessage::new(message)
}

fn subject(consumer: &PullConsumer, leaf: &str) -> String {
    format!("{}.{leaf}", consumer.cached_info().stream_name)
}

/// A consumer that dies after the result is stored and before its ack reaches the broker.
struct AckLost<'a>(&'a JetStreamMessage);

#[async_trait::async_trait]
impl Message for AckLost<'_> {
    fn id(&self) -> Option<&str> {
        self.0.id()
    }
    fn source(&self) -> &str {
        self.0.source()
    }
    fn payload(&self) -> &Bytes {
        self.0.payload()
    }
    fn delivery_count(&self) -> Option<u64> {
        self.0.delivery_count()
    }
    async fn ack(&self) -> Result<(), SettleError> {
        Ok(())
    }
    async fn nak(&self, delay: Duration) -> Result<(), SettleError> {
        self.0.nak(delay).await
    }
    async fn dead_letter(&self, reason: DeadLetterReason) -> Result<(), SettleError> {
        self.0.dead_letter(reason).await
    }
}

async fn assert_settled(consumer: &mut PullConsumer) {
    for _ in 0..100 {
        let info = consumer.info().await.expect("consumer info");
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "deliveries left unsettled: {:?}",
        consumer
            .info()
            .await
            .map(|i| (i.num_ack_pending, i.num_pending))
    );
}

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
async fn dead_letters_go_to_their_subject_with_the_reason_and_are_not_redelivered() {
    let Some((js, mut pull, mut dlq)) = setup("IDEM_DEAD").await else {
        return;
    };
    let stream = pull.cached_info().stream_name.clone();
    // Two publishers reuse one order id for two payloads (distinct message ids, so
    // JetStream's own duplicate window lets both in); a third message fails for good.
    publish(
        &js,
        subject(&pull, "orders"),
        Some("a"),
        r#"{"order":"o-1","cents":500}"#,
    )
    .await;
    publish(
        &js,
        subject(&pull, "orders"),
        Some("b"),
        r#"{"order":"o-1","cents":900}"#,
    )
    .await;
    publish(
        &js,
        subject(&pull, "orders"),
        Some("c"),
        r#"{"order":"o-2","cents":-1}"#,
    )
    .await;
    let consumer =
        Consumer::new(Idempotency::new(MemoryStore::new())).key_from_payload(|payload| {
            let order: serde_json::Value = serde_json::from_slice(payload).ok()?;
            Some(order.get("order")?.as_str()?.to_owned())
        });
    let work = |_ctx: Context, payload: Bytes| async move {
        let order: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        match order["cents"].as_i64() {
            Some(cents) if cents > 0 => Ok(cents),
            _ => Err(WorkError::Permanent("a negative amount".to_owned())),
        }
    };
    let mut messages = pull.messages().await.expect("subscribe");
    let mut reasons = Vec::new();
    for _ in 0..3 {
        let message = next(&mut messages)
            .await
            .dead_letter_to(format!("{stream}_dlq"));
        match consumer.handle(&message, work).await.unwrap() {
            Settled::Acked {
                value: 500,
                replayed: false,
            } => reasons.push("acked"),
            Settled::DeadLettered { reason, .. } => reasons.push(reason.as_str()),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(reasons, ["acked", "key-reused", "failed"]);
    assert_settled(&mut pull).await;

    // Nothing is redelivered past the ack wait.
    let quiet = tokio::time::timeout(Duration::from_millis(1500), messages.next()).await;
    assert!(quiet.is_err(), "a terminated message came back: {quiet:?}");

    let info = dlq.info().await.expect("dead-letter stream info");
    assert_eq!(info.state.messages, 2);
    let dead = dlq.get_raw_message(1).await.expect("the first dead letter");
    assert_eq!(
        dead.headers.get(DEAD_LETTER_REASON).map(|v| v.as_str()),
        Some("key-reused")
    );
    assert_eq!(dead.headers.get(ORIGINAL_ID).map(|v| v.as_str()), Some("b"));
    assert_eq!(
        dead.headers.get(ORIGINAL_STREAM).map(|v| v.as_str()),
        Some(stream.as_str())
    );
    assert_eq!(
        dead.headers.get(ORIGINAL_CONSUMER).map(|v| v.as_str()),
        Some("billing")
    );
    assert_eq!(&dead.payload[..], br#"{"order":"o-1","cents":900}"#);
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
async fn a_dead_letter_subject_inside_the_message_s_own_stream_is_refused() {
    let Some((js, mut pull, _)) = setup("IDEM_DEAD_LOOP").await else {
        return;
    };
    let stream = pull.cached_info().stream_name.clone();
    publish(&js, format!("{stream}.orders"), Some("o-1"), "").await;
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let mut messages = pull.messages().await.expect("subscribe");
    let message = next(&mut messages)
        .await
        .dead_letter_to(format!("{stream}.dead"));
    let fail = |_ctx: Context, _payload: Bytes| async {
        Err::<u8, _>(WorkError::Permanent("empty".to_owned()))
    };
    let err = consumer.handle(&message, fail).await.unwrap_err();
    assert!(matches!(err, SettleError::Misconfigured { .. }), "{err}");
    assert!(err.to_string().contains("another stream"), "{err}");
    // No copy was stored back into the stream.
    let info = js
        .get_stream(&stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .clone();
    assert_eq!(info.state.messages, 1);
    let _ = pull.info().await;
}

/// A source over the test's consumer, dead-lettering to its dead-letter stream.
fn source_of(pull: &PullConsumer) -> JetStreamSource {
    let dlq = format!("{}_dlq", pull.cached_info().stream_name);
    JetStreamSource::new(pull.cached_info(), DeadLetters::publish_to(dlq))
        .expect("an explicit-ack consumer")
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

#[tokio::test]
async fn consumers_that_do_not_ack_each_message_are_refused() {
    let Some((js, pull, _)) = setup("IDEM_ACK_POLICY").await else {
        return;
    };
    let stream = pull.cached_info().stream_name.clone();
    let stream = js.get_stream(&stream).await.expect("the stream");
    for (name, policy) in [
        ("all", jetstream::consumer::AckPolicy::All),
        ("none", jetstream::consumer::AckPolicy::None),
    ] {
        let consumer: PullConsumer = stream
            .create_consumer(jetstream::consumer::pull::Config {
                durable_name: Some(name.to_owned()),
                ack_policy: policy,
                ..Default::default()
            })
            .await
            .expect("create the consumer");
        let refused = JetStreamSource::new(consumer.cached_info(), DeadLetters::Terminate);
        assert!(
            matches!(&refused, Err(SetupError::AckPolicy { consumer, policy: p }) if consumer == name && *p == policy),
            "{refused:?}"
        );
        let message = refused.unwrap_err().to_string();
        assert!(message.contains("AckPolicy::Explicit"), "{message}");
    }
    // The test's own consumer (explicit, ack_wait 1 s) is accepted.
    let source = source_of(&pull);
    assert_eq!(source.progress_every(), Duration::from_secs(1) / 3);
    let empty = JetStreamSource::new(pull.cached_info(), DeadLetters::publish_to(""));
    assert!(matches!(empty, Err(SetupError::EmptySubject)), "{empty:?}");
}

#[tokio::test]
async fn work_longer_than_the_ack_wait_is_marked_in_progress_and_not_delivered_again() {
    let Some((js, mut pull, _)) = setup("IDEM_PROGRESS").await else {
        return;
    };
    for i in 0..3 {
        publish(&js, subject(&pull, "orders"), Some(&format!("m-{i}")), "x").await;
    }
    let source = source_of(&pull);
    // One at a time, 1.5 s each against an ack wait of 1 s: the first runs past the ack
    // wait, and the last waits 3 s for its turn.
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()))
        .concurrency(std::num::NonZeroUsize::MIN);
    let runs = Arc::new(AtomicUsize::new(0));
    let slow = |_ctx: Context, _payload: Bytes| {
        runs.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            done(1u8)
        }
    };
    let batch: Vec<_> = fetch(&pull, 3)
        .await
        .into_iter()
        .map(|m| source.wrap(m))
        .collect();
    // A second replica pulls meanwhile: it gets whatever JetStream delivers again.
    let mut replica = pull.messages().await.expect("subscribe");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let watcher = tokio::spawn(async move {
        let mut copies = Vec::new();
        tokio::pin!(stopped);
        loop {
            tokio::select! {
                _ = &mut stopped => return copies,
                copy = replica.next() => match copy {
                    Some(Ok(copy)) => copies.push(JetStreamMessage::new(copy).id().map(str::to_owned)),
                    _ => return copies,
                },
            }
        }
    });
    let settled = consumer.handle_batch(&batch, slow).await;
    stop.send(()).unwrap();
    let copies = watcher.await.unwrap();
    assert!(
        settled.iter().all(|s| matches!(s, Ok(s) if s.is_acked())),
        "{settled:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // Without the marks, every message here is delivered again to the replica.
    assert!(
        copies.is_empty(),
        "delivered again while handled: {copies:?}"
    );
    assert_settled(&mut pull).await;
}

#[tokio::test]
async fn a_stored_result_that_no_longer_decodes_is_dead_lettered_and_never_run_again() {
    let Some((js, mut pull, dlq)) = setup("IDEM_UNREADABLE").await else {
        return;
    };
    publish(&js, subject(&pull, "orders"), Some("order-1"), "2 mugs").await;
    let source = source_of(&pull);
    let lease = Duration::from_millis(300);
    let consumer = Consumer::new(
        Idempotency::builder(MemoryStore::new())
            .lease(lease)
            .build()
            .unwrap(),
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let mut messages = pull.messages().await.expect("subscribe");
    // The release before the deploy stored a text and crashed before its ack.
    let first = source.wrap(next(&mut messages).await.into_inner());
    let settled = consumer
        .handle(&AckLost(&first), |_ctx, _payload| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { done("shipped".to_owned()) }
        })
        .await
        .unwrap();
    assert!(settled.is_acked());
    // The release after it reads a number: the redelivery cannot decode the result. A
    // replica of the release before could, during a rolling deploy: it is nak'd for a
    // lease, until the third delivery.
    let reads_a_number = |_ctx: Context, _payload: Bytes| {
        runs.fetch_add(1, Ordering::SeqCst);
        async { done(7u64) }
    };
    let again = source.wrap(next(&mut messages).await.into_inner());
    assert_eq!(again.delivery_count(), Some(2));
    let settled = consumer.handle(&again, reads_a_number).await.unwrap();
    assert!(
        matches!(
            settled,
            Settled::Retried {
                cause: Cause::Idem(idem_core::Error::Decode(_)),
                delay
            } if delay == lease
        ),
        "{settled:?}"
    );
    let third = source.wrap(next(&mut messages).await.into_inner());
    assert_eq!(third.delivery_count(), Some(3));
    let settled = consumer.handle(&third, reads_a_number).await.unwrap();
    assert!(
        matches!(
            settled,
            Settled::DeadLettered {
                reason: DeadLetterReason::Unreadable,
                cause: Cause::Idem(idem_core::Error::Decode(_))
            }
        ),
        "{settled:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_settled(&mut pull).await;
    let dead = dlq.get_raw_message(1).await.expect("the dead letter");
    assert_eq!(
        dead.headers.get(DEAD_LETTER_REASON).map(|v| v.as_str()),
        Some("unreadable")
    );
}

#[tokio::test]
async fn retryable_hung_and_panicking_work_ends_in_a_dead_letter_after_its_attempts() {
    let Some((js, mut pull, mut dlq)) = setup("IDEM_ATTEMPTS").await else {
        return;
    };
    publish(&js, subject(&pull, "orders"), Some("retryable"), "r").await;
    publish(&js, subject(&pull, "orders"), Some("hung"), "h").await;
    publish(&js, subject(&pull, "orders"), Some("panics"), "p").await;
    let source = source_of(&pull);
    let lease = Duration::from_millis(400);
    let consumer = Consumer::new(
        Idempotency::builder(MemoryStore::new())
            .lease(lease)
            .build()
            .unwrap(),
    )
    .backoff(Backoff::new(Duration::from_millis(100), Duration::from_millis(100)).unwrap())
    .max_attempts(std::num::NonZeroU64::new(2).unwrap())
    .work_timeout(Duration::from_millis(200));
    let runs = Arc::new(AtomicUsize::new(0));
    let work = |_ctx: Context, payload: Bytes| {
        runs.fetch_add(1, Ordering::SeqCst);
        async move {
            match &payload[..] {
                b"r" => Err(WorkError::Retryable("warehouse busy".to_owned())),
                b"h" => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    done(0u8).map_err(|_| WorkError::Permanent(String::new()))
                }
                _ => panic!("a bug in the handler"),
            }
        }
    };
    let mut messages = pull.messages().await.expect("subscribe");
    let mut seen = Vec::new();
    while seen.len() < 6 {
        let message = source.wrap(next(&mut messages).await.into_inner());
        let id = message.id().unwrap().to_owned();
        let delivered = message.delivery_count().unwrap();
        let settled = consumer.handle(&message, work).await.unwrap();
        let what = match settled {
            Settled::Retried {
                cause: Cause::Work(_),
                ..
            } => "retried",
            Settled::Retried {
                cause: Cause::TimedOut { .. },
                delay,
            } => {
                assert_eq!(delay, lease);
                "timed out"
            }
            Settled::Retried {
                cause: Cause::Panicked,
                ..
            } => "panicked",
            Settled::DeadLettered {
                reason: DeadLetterReason::AttemptsExhausted,
                ..
            } => "exhausted",
            other => panic!("{id} #{delivered}: {other:?}"),
        };
        seen.push(format!("{id} #{delivered} {what}"));
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "hung #1 timed out",
            "hung #2 exhausted",
            "panics #1 panicked",
            "panics #2 exhausted",
            "retryable #1 retried",
            "retryable #2 exhausted",
        ]
    );
    assert_eq!(runs.load(Ordering::SeqCst), 6);
    assert_settled(&mut pull).await;
    let info = dlq.info().await.expect("dead-letter stream info");
    assert_eq!(info.state.messages, 3);
    for sequence in 1..=3 {
        let dead = dlq.get_raw_message(sequence).await.expect("a dead letter");
        assert_eq!(
            dead.headers.get(DEAD_LETTER_REASON).map(|v| v.as_str()),
            Some("attempts-exhausted")
        );
    }
}

#[tokio::test]
async fn a_store_outage_redelivers_the_message_and_never_dead_letters_it() {
    let Some((js, mut pull, dlq)) = setup("IDEM_STORE_DOWN").await else {
        return;
    };
    publish(&js, subject(&pull, "orders"), Some("order-1"), "2 mugs").await;
    let source = source_of(&pull);
    // A failover: the first two claims meet a read-only replica.
    let store = FailingClaims::new(2);
    let consumer = Consumer::new(Idempotency::new(store))
        .backoff(Backoff::new(Duration::from_millis(100), Duration::from_millis(100)).unwrap())
        .max_attempts(std::num::NonZeroU64::new(2).unwrap());
    let runs = Arc::new(AtomicUsize::new(0));
    let mut messages = pull.messages().await.expect("subscribe");
    let mut seen = Vec::new();
    loop {
        let message = source.wrap(next(&mut messages).await.into_inner());
        match consumer.handle(&message, counted(&runs)).await.unwrap() {
            Settled::Retried {
                cause: Cause::Idem(idem_core::Error::Store(_)),
                ..
            } => seen.push("retried"),
            Settled::Acked {
                replayed: false, ..
            } => break,
            other => panic!("{other:?}"),
        }
    }
    // Past the attempt limit too: the limit counts the work's failures, not the store's.
    assert_eq!(seen, ["retried", "retried"]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_settled(&mut pull).await;
    let mut dlq = dlq;
    assert_eq!(dlq.info().await.unwrap().state.messages, 0);
}

/// `count` deliveries, fetched in as many pulls as it takes, within the wait.
async fn fetch(pull: &PullConsumer, count: usize) -> Vec<jetstream::Message> {
    let mut batch = Vec::new();
    while batch.len() < count {
        let mut fetched = pull
            .fetch()
            .max_messages(count - batch.len())
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .expect("fetch");
        while let Some(message) = tokio::time::timeout(WAIT, fetched.next())
            .await
            .expect("a batch within the wait")
        {
            batch.push(message.expect("a delivery"));
        }
    }
    batch
}
