//! The Redis Streams adapter against a real redis-server on 127.0.0.1 (scripts/services.sh
//! starts it; `IDEM_TEST_REDIS_URL`). Every wait is bounded.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_consumer::redis::{
    DEAD_LETTER_REASON, DeadLetters, ORIGINAL_ID, ORIGINAL_STREAM, RedisStream, RedisStreamMessage,
};
use idem_consumer::{Backoff, Cause, Consumer, DeadLetterReason, Message, Settled};
use idem_core::{Context, Idempotency, MemoryStore, WorkError, done};
use redis::aio::MultiplexedConnection;

mod common;
use common::{AckLost, counted, refusing_empty};

const BLOCK: Duration = Duration::from_millis(200);
const TEN: NonZeroUsize = NonZeroUsize::new(10).unwrap();

/// A connection, and a stream of its own (`<name>`, dead letters to `<name>:dead`), both
/// emptied first.
async fn setup(name: &str) -> Option<MultiplexedConnection> {
    let url = idem_testkit::service_url("IDEM_TEST_REDIS_URL")?;
    let client = redis::Client::open(url).expect("a Redis URL");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the test Redis");
    let _: () = redis::cmd("DEL")
        .arg(name)
        .arg(format!("{name}:dead"))
        .query_async(&mut connection)
        .await
        .expect("DEL");
    Some(connection)
}

async fn add(connection: &MultiplexedConnection, stream: &str, payload: &str) -> String {
    let mut connection = connection.clone();
    redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("payload")
        .arg(payload)
        .query_async(&mut connection)
        .await
        .expect("XADD")
}

async fn reader(
    connection: &MultiplexedConnection,
    stream: &str,
    consumer: &str,
    claim_idle: Duration,
) -> RedisStream<MultiplexedConnection> {
    let reader = RedisStream::new(
        connection.clone(),
        stream,
        "billing",
        consumer,
        DeadLetters::to_stream(format!("{stream}:dead")),
    )
    .claim_idle(claim_idle);
    reader.create_group().await.expect("XGROUP CREATE");
    reader
}

/// Batches until `count` entries came, within ten seconds.
async fn read(
    reader: &RedisStream<MultiplexedConnection>,
    count: usize,
) -> Vec<RedisStreamMessage<MultiplexedConnection>> {
    let mut batch = Vec::new();
    for _ in 0..50 {
        batch.extend(reader.next_batch(TEN, BLOCK).await.expect("a batch"));
        if batch.len() >= count {
            return batch;
        }
    }
    panic!("{} of {count} entries came", batch.len());
}

async fn pending(connection: &MultiplexedConnection, stream: &str) -> u64 {
    let mut connection = connection.clone();
    // The summary form: the count first, then the lowest and highest ids and the owners.
    let summary: Vec<redis::Value> = redis::cmd("XPENDING")
        .arg(stream)
        .arg("billing")
        .query_async(&mut connection)
        .await
        .expect("XPENDING");
    match summary.first() {
        Some(redis::Value::Int(count)) => u64::try_from(*count).unwrap(),
        other => panic!("an XPENDING summary without a count: {other:?}"),
    }
}

#[tokio::test]
async fn an_entry_whose_ack_was_lost_is_claimed_by_another_consumer_and_replayed() {
    let Some(connection) = setup("idem:streams:ack-lost").await else {
        return;
    };
    let stream = "idem:streams:ack-lost";
    let first_reader = reader(&connection, stream, "billing-1", Duration::from_millis(300)).await;
    let second_reader = reader(&connection, stream, "billing-2", Duration::from_millis(300)).await;
    let id = add(&connection, stream, "2 mugs").await;
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));

    let first = read(&first_reader, 1).await.remove(0);
    assert_eq!(first.id(), Some(id.as_str()));
    assert_eq!(first.source(), "idem:streams:ack-lost/billing");
    assert_eq!(first.delivery_count(), Some(1));
    assert_eq!(&first.payload()[..], b"2 mugs");
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

    // The other consumer claims it once it sat idle for 300 ms, and replays.
    let again = read(&second_reader, 1).await.remove(0);
    assert_eq!(again.id(), Some(id.as_str()));
    assert_eq!(again.delivery_count(), Some(2));
    let settled = consumer.handle(&again, counted(&runs)).await.unwrap();
    assert!(settled.replayed(), "{settled:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(pending(&connection, stream).await, 0);
}

#[tokio::test]
async fn a_nak_is_claimed_again_after_its_delay_not_before() {
    let Some(connection) = setup("idem:streams:nak").await else {
        return;
    };
    let stream = "idem:streams:nak";
    // A claim idle time far above the delay: only the nak's own delay brings it back.
    let orders = reader(&connection, stream, "billing-1", Duration::from_secs(30)).await;
    add(&connection, stream, "x").await;
    let delay = Duration::from_millis(600);
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
    let first = read(&orders, 1).await.remove(0);
    let naked = tokio::time::Instant::now();
    let settled = consumer.handle(&first, flaky).await.unwrap();
    assert!(
        matches!(settled, Settled::Retried { delay: d, .. } if d == delay),
        "{settled:?}"
    );
    // Right after the nak, nothing to claim.
    assert!(
        orders
            .next_batch(TEN, Duration::ZERO)
            .await
            .unwrap()
            .is_empty()
    );
    let again = read(&orders, 1).await.remove(0);
    assert!(
        naked.elapsed() >= delay - Duration::from_millis(50),
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
    assert_eq!(pending(&connection, stream).await, 0);
}

#[tokio::test]
async fn long_work_is_marked_in_progress_and_never_claimed_by_another_consumer() {
    let Some(connection) = setup("idem:streams:progress").await else {
        return;
    };
    let stream = "idem:streams:progress";
    let idle = Duration::from_millis(600);
    let first_reader = reader(&connection, stream, "billing-1", idle).await;
    let second_reader = reader(&connection, stream, "billing-2", idle).await;
    for i in 0..3 {
        add(&connection, stream, &format!("order {i}")).await;
    }
    // One at a time, a second each: the last waits two seconds for its turn.
    let consumer =
        Consumer::new(Idempotency::new(MemoryStore::new())).concurrency(NonZeroUsize::MIN);
    let runs = Arc::new(AtomicUsize::new(0));
    let slow = |_ctx: Context, _payload: Bytes| {
        runs.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            done(1u8)
        }
    };
    let batch = read(&first_reader, 3).await;
    let handled = consumer.handle_batch(&batch, slow);
    let watch = async {
        let mut claimed = Vec::new();
        for _ in 0..12 {
            claimed.extend(second_reader.next_batch(TEN, BLOCK).await.unwrap());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        claimed
    };
    let (settled, claimed) = tokio::join!(handled, watch);
    assert!(
        settled.iter().all(|s| matches!(s, Ok(s) if s.is_acked())),
        "{settled:?}"
    );
    assert!(claimed.is_empty(), "claimed while handled: {claimed:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(pending(&connection, stream).await, 0);
}

#[tokio::test]
async fn dead_letters_go_to_their_stream_with_the_reason_and_leave_the_group() {
    let Some(connection) = setup("idem:streams:dead").await else {
        return;
    };
    let stream = "idem:streams:dead";
    let orders = reader(&connection, stream, "billing-1", Duration::from_secs(30)).await;
    let id = add(&connection, stream, "").await;
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let message = read(&orders, 1).await.remove(0);
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
    assert_eq!(pending(&connection, stream).await, 0);
    let mut raw = connection.clone();
    let dead: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(format!("{stream}:dead"))
        .arg("-")
        .arg("+")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(dead.ids.len(), 1);
    let field = |name: &str| -> Option<String> { dead.ids[0].get(name) };
    assert_eq!(field(DEAD_LETTER_REASON).as_deref(), Some("failed"));
    assert_eq!(field(ORIGINAL_STREAM).as_deref(), Some(stream));
    assert_eq!(field(ORIGINAL_ID).as_deref(), Some(id.as_str()));
    assert_eq!(field("payload").as_deref(), Some(""));
}

#[tokio::test]
async fn an_entry_without_the_payload_field_is_handed_over_as_its_fields() {
    let Some(connection) = setup("idem:streams:fields").await else {
        return;
    };
    let stream = "idem:streams:fields";
    let orders = reader(&connection, stream, "billing-1", Duration::from_secs(30)).await;
    let mut raw = connection.clone();
    let _: String = redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("order")
        .arg("o-1")
        .arg("cents")
        .arg("500")
        .query_async(&mut raw)
        .await
        .unwrap();
    let message = read(&orders, 1).await.remove(0);
    assert_eq!(&message.payload()[..], br#"{"cents":"500","order":"o-1"}"#);
    assert_eq!(
        message.fields().get("order").map(Vec::as_slice),
        Some(&b"o-1"[..])
    );
}

#[tokio::test]
async fn run_stops_fetching_at_shutdown_and_settles_the_batch_in_hand() {
    let Some(connection) = setup("idem:streams:run").await else {
        return;
    };
    let stream = "idem:streams:run";
    let orders = reader(&connection, stream, "billing-1", Duration::from_secs(30)).await;
    for i in 0..5 {
        add(&connection, stream, &format!("order {i}")).await;
    }
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let (started, mut first_started) = tokio::sync::mpsc::unbounded_channel();
    let slow = |_ctx: Context, payload: Bytes| {
        runs.fetch_add(1, Ordering::SeqCst);
        let _ = started.send(());
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            done(payload.len())
        }
    };
    // Shut down as soon as the first work starts: the five entries fetched in that batch
    // still run and settle; the entry added afterwards is left for the next run.
    let shutdown = async {
        first_started.recv().await;
        add(&connection, stream, "after the shutdown").await;
    };
    let report = tokio::time::timeout(
        Duration::from_secs(10),
        consumer.run(&orders, slow, shutdown),
    )
    .await
    .expect("run stops after its batch");
    assert_eq!(
        (
            report.acked,
            report.retried,
            report.dead_lettered,
            report.unsettled
        ),
        (5, 0, 0, 0),
        "{report:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 5);
    assert_eq!(pending(&connection, stream).await, 0);
    let left = read(&orders, 1).await;
    assert_eq!(&left[0].payload()[..], b"after the shutdown");
}

#[tokio::test]
async fn a_key_from_an_entry_s_field_catches_a_producer_s_resend() {
    let Some(connection) = setup("idem:streams:header").await else {
        return;
    };
    let stream = "idem:streams:header";
    let orders = reader(&connection, stream, "billing-1", Duration::from_millis(300)).await;
    // Two entries for one order (a producer's resend): one key, from the field.
    let mut raw = connection.clone();
    for _ in 0..2 {
        let _: String = redis::cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("payload")
            .arg("2 mugs")
            .arg("idempotency-key")
            .arg("order-7")
            .arg(idem_consumer::TRACEPARENT)
            .arg("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    let consumer =
        Consumer::new(Idempotency::new(MemoryStore::new())).key_from_header("idempotency-key");
    let runs = Arc::new(AtomicUsize::new(0));
    let batch = read(&orders, 2).await;
    let settled = consumer.handle_batch(&batch, counted(&runs)).await;
    assert!(
        settled.iter().all(|s| matches!(s, Ok(s) if s.is_acked())),
        "{settled:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one key for both entries");
    assert_eq!(
        consumer.key_of(&batch[0]).unwrap(),
        idem_core::Key::new("idem:streams:header/billing", "order-7").unwrap()
    );
}
