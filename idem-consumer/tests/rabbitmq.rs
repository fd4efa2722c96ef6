//! The RabbitMQ adapter against a real rabbitmq-server on 127.0.0.1
//! (scripts/services.sh starts it; `IDEM_TEST_RABBITMQ_URL`). Every wait is bounded.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use idem_consumer::rabbitmq::{
    DEAD_LETTER_REASON, DeadLetters, ORIGINAL_QUEUE, RabbitMessage, RabbitQueue, SetupError,
};
use idem_consumer::{Backoff, Cause, Consumer, DeadLetterReason, Message, SettleError, Settled};
use idem_core::{Context, Idempotency, MemoryStore, WorkError};
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

mod common;
use common::{counted, refusing_empty};

const WAIT: Duration = Duration::from_secs(15);

/// A connection, and a queue of its own whose dead letters go to `<queue>.dlq`.
async fn setup(name: &str) -> Option<(Connection, Channel, String)> {
    let url = idem_testkit::service_url("IDEM_TEST_RABBITMQ_URL")?;
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .expect("connect to the test RabbitMQ");
    let channel = connection.create_channel().await.expect("a channel");
    // A fixed name per test: the next run deletes what this one leaves.
    let queue = name.to_owned();
    let dlq = format!("{queue}.dlq");
    for q in [&queue, &dlq] {
        let _ = channel
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    channel
        .queue_declare(
            dlq.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("declare the dead-letter queue");
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    arguments.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(dlq.as_str().into()),
    );
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            arguments,
        )
        .await
        .expect("declare the queue");
    Some((connection, channel, queue))
}

async fn publish(channel: &Channel, queue: &str, id: Option<&str>, payload: &str) {
    let mut properties = BasicProperties::default();
    if let Some(id) = id {
        properties = properties.with_message_id(id.into());
    }
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            payload.as_bytes(),
            properties,
        )
        .await
        .expect("publish")
        .await
        .expect("published");
}

async fn consume(channel: &Channel, queue: &str, prefetch: u16) -> lapin::Consumer {
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await
        .expect("qos");
    channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume")
}

async fn next(deliveries: &mut lapin::Consumer, queue: &str) -> RabbitMessage {
    let delivery = tokio::time::timeout(WAIT, deliveries.next())
        .await
        .expect("a delivery within the wait")
        .expect("the consumer goes on")
        .expect("a delivery");
    RabbitMessage::new(delivery, queue)
}

/// How many messages wait in `queue`, asked on a channel of its own.
async fn depth(connection: &Connection, queue: &str) -> u32 {
    let channel = connection.create_channel().await.expect("a channel");
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let queue = channel
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .expect("the queue exists");
    queue.message_count()
}

#[tokio::test]
async fn a_consumer_killed_before_its_ack_leaves_a_redelivery_that_replays() {
    let Some((connection, channel, queue)) = setup("idem.ack-lost").await else {
        return;
    };
    publish(&channel, &queue, Some("order-1"), "2 mugs").await;
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));

    // The first consumer's process stores the result and dies before acking: its
    // connection closes and RabbitMQ requeues the delivery.
    {
        let dying = Connection::connect(
            &idem_testkit::service_url("IDEM_TEST_RABBITMQ_URL").unwrap(),
            ConnectionProperties::default(),
        )
        .await
        .unwrap();
        let dying_channel = dying.create_channel().await.unwrap();
        let mut deliveries = consume(&dying_channel, &queue, 1).await;
        let first = next(&mut deliveries, &queue).await;
        assert_eq!(
            (first.id(), first.delivery_count()),
            (Some("order-1"), Some(1))
        );
        let stored = consumer
            .idempotency()
            .execute(
                &consumer.key_of(&first).unwrap(),
                idem_core::Fingerprint::of_bytes(first.payload()),
                |ctx| counted(&runs)(ctx, first.payload().clone()),
            )
            .await
            .unwrap();
        assert!(!stored.replayed());
        dying.close(320, "killed".into()).await.unwrap();
    }

    let mut deliveries = consume(&channel, &queue, 1).await;
    let again = next(&mut deliveries, &queue).await;
    assert!(again.get_ref().redelivered);
    assert_eq!(
        again.delivery_count(),
        None,
        "a classic queue does not count redeliveries"
    );
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
    drop(deliveries);
    channel.close(200, "done".into()).await.unwrap();
    assert_eq!(depth(&connection, &queue).await, 0);
}

#[tokio::test]
async fn a_retryable_failure_is_requeued_after_its_delay_without_holding_the_consumer() {
    let Some((_connection, channel, queue)) = setup("idem.nak").await else {
        return;
    };
    publish(&channel, &queue, Some("slow"), "x").await;
    publish(&channel, &queue, Some("fast"), "yy").await;
    let delay = Duration::from_millis(400);
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()))
        .backoff(Backoff::new(delay, delay).unwrap());
    let failed_once = Arc::new(AtomicUsize::new(0));
    let work = |failed_once: Arc<AtomicUsize>| {
        move |ctx: Context, payload: Bytes| {
            let fail = ctx.key().key() == "slow" && failed_once.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if fail {
                    Err(WorkError::Retryable("warehouse busy".to_owned()))
                } else {
                    Ok(payload.len())
                }
            }
        }
    };
    let mut deliveries = consume(&channel, &queue, 10).await;
    let slow = next(&mut deliveries, &queue).await;
    let naked_at = tokio::time::Instant::now();
    let settled = consumer
        .handle(&slow, work(Arc::clone(&failed_once)))
        .await
        .unwrap();
    assert!(
        matches!(settled, Settled::Retried { delay: d, .. } if d == delay),
        "{settled:?}"
    );

    // The next message is handled while the nak waits.
    let fast = next(&mut deliveries, &queue).await;
    assert_eq!(fast.id(), Some("fast"));
    assert!(
        naked_at.elapsed() < delay,
        "the consumer waited out the nak: {:?}",
        naked_at.elapsed()
    );
    assert!(
        consumer
            .handle(&fast, work(Arc::clone(&failed_once)))
            .await
            .unwrap()
            .is_acked()
    );

    let again = next(&mut deliveries, &queue).await;
    assert!(
        naked_at.elapsed() >= delay,
        "requeued before its delay: {:?}",
        naked_at.elapsed()
    );
    assert_eq!(again.id(), Some("slow"));
    let settled = consumer
        .handle(&again, work(Arc::clone(&failed_once)))
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
}

#[tokio::test]
async fn dead_letters_are_rejected_to_the_dead_letter_exchange() {
    let Some((_connection, channel, queue)) = setup("idem.dead").await else {
        return;
    };
    publish(&channel, &queue, Some("o-1"), "500").await;
    publish(&channel, &queue, Some("o-1"), "900").await;
    publish(&channel, &queue, None, "no id").await;
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let mut deliveries = consume(&channel, &queue, 10).await;
    let mut reasons = Vec::new();
    for _ in 0..3 {
        let message = next(&mut deliveries, &queue).await;
        match consumer.handle(&message, counted(&runs)).await.unwrap() {
            Settled::Acked { .. } => reasons.push("acked"),
            Settled::DeadLettered { reason, .. } => reasons.push(reason.as_str()),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(reasons, ["acked", "key-reused", "no-key"]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let dlq = format!("{queue}.dlq");
    let mut dead = Vec::new();
    for _ in 0..100 {
        match channel
            .basic_get(dlq.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            Some(message) => dead.push(String::from_utf8(message.delivery.data.clone()).unwrap()),
            None if dead.len() == 2 => break,
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert_eq!(dead, ["900", "no id"]);
}

#[tokio::test]
async fn a_batch_is_settled_per_message() {
    let Some((connection, channel, queue)) = setup("idem.batch").await else {
        return;
    };
    for i in 0..20 {
        let payload = if i % 5 == 4 {
            String::new()
        } else {
            format!("order {i}")
        };
        publish(&channel, &queue, Some(&format!("m-{i}")), &payload).await;
    }
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let mut deliveries = consume(&channel, &queue, 20).await;
    let mut batch = Vec::new();
    while batch.len() < 20 {
        batch.push(next(&mut deliveries, &queue).await);
    }
    let settled = consumer.handle_batch(&batch, refusing_empty(&runs)).await;
    let acked = settled
        .iter()
        .filter(|s| matches!(s, Ok(s) if s.is_acked()))
        .count();
    let dead = settled
        .iter()
        .filter(|s| {
            matches!(
                s,
                Ok(Settled::DeadLettered {
                    reason: DeadLetterReason::Failed,
                    ..
                })
            )
        })
        .count();
    assert_eq!((acked, dead), (16, 4));
    assert_eq!(runs.load(Ordering::SeqCst), 20);
    // A settlement retried after its first try landed sends nothing and says so.
    let again = batch[0].ack().await.unwrap_err();
    assert!(
        matches!(again, idem_consumer::SettleError::AlreadySettled { .. }),
        "{again}"
    );
    drop(deliveries);
    channel.close(200, "done".into()).await.unwrap();
    assert_eq!(depth(&connection, &queue).await, 0);
    assert_eq!(depth(&connection, &format!("{queue}.dlq")).await, 4);
}

/// A queue of its own with no dead-letter exchange: a rejected message would be dropped.
async fn plain_queue(channel: &Channel, queue: &str, arguments: FieldTable) {
    let _ = channel
        .queue_delete(queue.into(), QueueDeleteOptions::default())
        .await;
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            arguments,
        )
        .await
        .expect("declare the queue");
}

/// The next message waiting in `queue`, taken off it, within the wait.
async fn take(channel: &Channel, queue: &str) -> lapin::message::BasicGetMessage {
    for _ in 0..300 {
        if let Some(message) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            return message;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("nothing arrived in {queue}");
}

fn header<'a>(message: &'a lapin::message::BasicGetMessage, name: &str) -> Option<&'a AMQPValue> {
    message
        .delivery
        .properties
        .headers()
        .as_ref()?
        .inner()
        .get(name)
}

#[tokio::test]
async fn no_ack_is_refused_before_the_broker_is_asked() {
    let Some((connection, channel, queue)) = setup("idem.no-ack").await else {
        return;
    };
    let source = RabbitQueue::new(queue.as_str(), DeadLetters::queue_policy());
    let refused = source
        .consume(
            &channel,
            "billing",
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await;
    assert!(matches!(refused, Err(SetupError::NoAck)), "{refused:?}");
    // Nothing was asked of the broker: the queue has no consumer.
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let declared = connection
        .create_channel()
        .await
        .unwrap()
        .queue_declare(queue.as_str().into(), passive, FieldTable::default())
        .await
        .unwrap();
    assert_eq!(declared.consumer_count(), 0);
}

#[tokio::test]
async fn dead_letters_are_published_with_their_reason_under_confirms_then_acked() {
    let Some((connection, channel, _)) = setup("idem.dead-publish").await else {
        return;
    };
    // No dead-letter exchange on the queue: a reject would drop the message.
    let (queue, dlq) = ("idem.dead-publish.plain", "idem.dead-publish.copies");
    plain_queue(&channel, queue, FieldTable::default()).await;
    plain_queue(&channel, dlq, FieldTable::default()).await;
    publish(&channel, queue, None, "no id").await;
    // A message with a time to live: its copy must outlive it, and survive a restart.
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            b"",
            BasicProperties::default()
                .with_message_id("o-2".into())
                .with_expiration("60000".into())
                .with_delivery_mode(1),
        )
        .await
        .expect("publish")
        .await
        .expect("published");
    let (source, mut deliveries) = publishing_dead_letters(&connection, &channel, queue, dlq).await;
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let mut reasons = Vec::new();
    for _ in 0..2 {
        let delivery = delivery(&mut deliveries).await;
        let message = source.wrap(delivery);
        match consumer
            .handle(&message, refusing_empty(&runs))
            .await
            .unwrap()
        {
            Settled::DeadLettered { reason, .. } => reasons.push(reason.as_str()),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(reasons, ["no-key", "failed"]);
    let mut copies = Vec::new();
    for _ in 0..2 {
        let copy = take(&channel, dlq).await;
        assert_eq!(
            header(&copy, ORIGINAL_QUEUE),
            Some(&AMQPValue::LongString(queue.into()))
        );
        assert_eq!(copy.delivery.properties.expiration(), &None);
        assert_eq!(copy.delivery.properties.delivery_mode(), &Some(2));
        let Some(AMQPValue::LongString(reason)) = header(&copy, DEAD_LETTER_REASON) else {
            panic!("no reason on {copy:?}");
        };
        copies.push((
            reason.to_string(),
            String::from_utf8(copy.delivery.data.clone()).unwrap(),
        ));
    }
    copies.sort();
    assert_eq!(
        copies,
        [
            ("failed".to_owned(), String::new()),
            ("no-key".to_owned(), "no id".to_owned())
        ]
    );
    // The originals were acked, not left to come back.
    assert_eq!(depth(&connection, queue).await, 0);
    let quiet = tokio::time::timeout(Duration::from_millis(500), deliveries.next()).await;
    assert!(
        quiet.is_err(),
        "a dead-lettered message came back: {quiet:?}"
    );
}

#[tokio::test]
async fn a_dead_letter_that_no_queue_takes_leaves_the_original_to_come_back() {
    let Some((connection, channel, _)) = setup("idem.dead-unroutable").await else {
        return;
    };
    let queue = "idem.dead-unroutable.plain";
    plain_queue(&channel, queue, FieldTable::default()).await;
    publish(&channel, queue, Some("o-1"), "").await;
    let (source, mut deliveries) =
        publishing_dead_letters(&connection, &channel, queue, "idem.nowhere").await;
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let first = delivery(&mut deliveries).await;
    let refused = consumer
        .handle(&source.wrap(first), refusing_empty(&runs))
        .await;
    assert!(
        matches!(refused, Err(SettleError::Misconfigured { .. })),
        "{refused:?}"
    );
    // It comes back (after the adapter's pause) and the stored failure is replayed.
    let again = delivery(&mut deliveries).await;
    assert!(again.redelivered);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_quorum_queue_counts_deliveries_and_the_attempt_limit_dead_letters_with_the_reason() {
    let Some((connection, channel, _)) = setup("idem.quorum").await else {
        return;
    };
    let (queue, dlq) = ("idem.quorum.orders", "idem.quorum.copies");
    let mut quorum = FieldTable::default();
    quorum.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    plain_queue(&channel, queue, quorum).await;
    plain_queue(&channel, dlq, FieldTable::default()).await;
    publish(&channel, queue, Some("o-1"), "busy").await;
    let (source, mut deliveries) = publishing_dead_letters(&connection, &channel, queue, dlq).await;
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()))
        .backoff(Backoff::new(Duration::from_millis(100), Duration::from_millis(100)).unwrap())
        .max_attempts(std::num::NonZeroU64::new(3).unwrap());
    let runs = Arc::new(AtomicUsize::new(0));
    let busy = |_ctx: Context, _payload: Bytes| {
        runs.fetch_add(1, Ordering::SeqCst);
        async { Err::<u8, _>(WorkError::Retryable("warehouse busy".to_owned())) }
    };
    let mut counts = Vec::new();
    loop {
        let delivery = delivery(&mut deliveries).await;
        let message = source.wrap(delivery);
        counts.push(message.delivery_count());
        match consumer.handle(&message, busy).await.unwrap() {
            Settled::Retried {
                cause: Cause::Work(_),
                ..
            } => {}
            Settled::DeadLettered {
                reason: DeadLetterReason::AttemptsExhausted,
                ..
            } => break,
            other => panic!("{other:?}"),
        }
    }
    // The quorum queue's `x-delivery-count` (absent on the first delivery) plus one.
    assert_eq!(counts, [Some(1), Some(2), Some(3)]);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let copy = take(&channel, dlq).await;
    assert_eq!(
        header(&copy, DEAD_LETTER_REASON),
        Some(&AMQPValue::LongString("attempts-exhausted".into()))
    );
    assert_eq!(depth(&connection, queue).await, 0);
}

/// `queue` consumed on `channel`, its dead letters published to the default exchange
/// under `routing_key` on a channel of their own.
async fn publishing_dead_letters(
    connection: &Connection,
    channel: &Channel,
    queue: &str,
    routing_key: &str,
) -> (RabbitQueue, lapin::Consumer) {
    let dead_letters =
        DeadLetters::publish_to(&connection.create_channel().await.unwrap(), "", routing_key)
            .await
            .expect("confirm mode");
    let source = RabbitQueue::new(queue, dead_letters);
    channel
        .basic_qos(10, BasicQosOptions::default())
        .await
        .unwrap();
    let deliveries = source
        .consume(
            channel,
            "billing",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    (source, deliveries)
}

/// The next delivery, within the wait.
async fn delivery(deliveries: &mut lapin::Consumer) -> lapin::message::Delivery {
    tokio::time::timeout(WAIT, deliveries.next())
        .await
        .expect("a delivery within the wait")
        .expect("the consumer goes on")
        .expect("a delivery")
}

#[tokio::test]
async fn run_over_a_lapin_stream_keys_by_a_header_and_stops_at_shutdown() {
    let Some((connection, channel, _)) = setup("idem.run").await else {
        return;
    };
    let (queue, dlq) = ("idem.run.orders", "idem.run.copies");
    plain_queue(&channel, queue, FieldTable::default()).await;
    plain_queue(&channel, dlq, FieldTable::default()).await;
    // One order published twice (the publisher's retry) without a message id, keyed by a
    // header of its own.
    for _ in 0..2 {
        let mut headers = FieldTable::default();
        headers.insert(
            "Idempotency-Key".into(),
            AMQPValue::LongString("order-7".into()),
        );
        channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                b"2 mugs",
                BasicProperties::default().with_headers(headers),
            )
            .await
            .expect("publish")
            .await
            .expect("published");
    }
    let (source, deliveries) = publishing_dead_letters(&connection, &channel, queue, dlq).await;
    let deliveries = deliveries.map(move |delivery| delivery.map(|d| source.wrap(d)));
    let source = idem_consumer::StreamSource::new(
        deliveries,
        std::num::NonZeroUsize::new(10).unwrap(),
        Duration::from_millis(200),
    );
    // One at a time: the second copy finds the first's result, not its work in flight.
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()))
        .key_from_header("Idempotency-Key")
        .concurrency(std::num::NonZeroUsize::MIN);
    let runs = Arc::new(AtomicUsize::new(0));
    let (handled, mut both_handled) = tokio::sync::mpsc::unbounded_channel();
    let work = |_ctx: Context, payload: Bytes| {
        let run = runs.fetch_add(1, Ordering::SeqCst);
        let _ = handled.send(());
        async move { Ok::<_, WorkError<String>>(payload.len() + run) }
    };
    // Shut down once the first run is done and the queue is empty.
    let shutdown = async {
        both_handled.recv().await;
        for _ in 0..100 {
            if depth(&connection, queue).await == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let report = tokio::time::timeout(WAIT, consumer.run(&source, work, shutdown))
        .await
        .expect("run stops");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one key for both copies");
    assert_eq!((report.acked, report.replayed), (1, 1), "{report:?}");
    assert_eq!(depth(&connection, queue).await, 0);
}

/// The stall after a connection loss: the messages the lost consumer held come back to
/// another, still in flight under the lost one's leases, and are nak'd for the rest of
/// them. With a delay queue they wait there, and the consumer goes on with new messages;
/// without one, they would fill its prefetch until the leases end.
#[tokio::test]
async fn naks_wait_in_the_delay_queue_not_in_the_consumer_s_prefetch() {
    let Some((connection, channel, _)) = setup("idem.delays").await else {
        return;
    };
    let (queue, delay_queue, dlq) = ("idem.delays.orders", "idem.delays.wait", "idem.delays.dead");
    plain_queue(&channel, queue, FieldTable::default()).await;
    plain_queue(&channel, dlq, FieldTable::default()).await;
    let _ = channel
        .queue_delete(delay_queue.into(), QueueDeleteOptions::default())
        .await;
    let lease = Duration::from_secs(2);
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(lease)
        .build()
        .unwrap();
    // The lost consumer: it took m-0 and m-1 and died mid-work, its leases still held.
    for id in ["m-0", "m-1"] {
        let key = idem_core::Key::new(queue, id).unwrap();
        let cut_off = tokio::time::timeout(
            Duration::from_millis(50),
            idem.execute(&key, idem_core::Fingerprint::of_bytes(b"x"), |_ctx| async {
                std::future::pending::<()>().await;
                Ok::<u8, WorkError<String>>(0)
            }),
        )
        .await;
        assert!(cut_off.is_err());
    }
    let started = tokio::time::Instant::now();
    for id in ["m-0", "m-1", "m-2"] {
        publish(&channel, queue, Some(id), "x").await;
    }
    let delays = idem_consumer::rabbitmq::Delays::through(
        &connection.create_channel().await.unwrap(),
        delay_queue,
        queue,
    )
    .await
    .expect("declare the delay queue");
    let dead_letters =
        DeadLetters::publish_to(&connection.create_channel().await.unwrap(), "", dlq)
            .await
            .unwrap();
    let source = RabbitQueue::new(queue, dead_letters)
        .delays(delays)
        .expect("the delay queue returns to this queue");
    // Two messages at a time: without the delay queue, m-0 and m-1 would fill them.
    channel
        .basic_qos(2, BasicQosOptions::default())
        .await
        .unwrap();
    let mut deliveries = source
        .consume(
            &channel,
            "billing",
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let consumer = Consumer::new(idem);
    let runs = Arc::new(AtomicUsize::new(0));
    let mut seen = Vec::new();
    let ran = |seen: &Vec<(String, Option<u64>, &str, Duration)>| {
        seen.iter().filter(|(_, _, what, _)| *what == "ran").count()
    };
    // Until all three ran (a copy back while its lease still runs is delayed again).
    while ran(&seen) < 3 && seen.len() < 12 {
        let message = source.wrap(delivery(&mut deliveries).await);
        let id = message.id().unwrap().to_owned();
        let delivered = message.delivery_count();
        let settled = consumer.handle(&message, counted(&runs)).await.unwrap();
        let elapsed = started.elapsed();
        match settled {
            Settled::Retried {
                cause: Cause::Idem(idem_core::Error::InFlight { .. }),
                ..
            } => seen.push((id, delivered, "in flight", elapsed)),
            Settled::Acked {
                replayed: false, ..
            } => seen.push((id, delivered, "ran", elapsed)),
            other => panic!("{id}: {other:?}"),
        }
    }
    let find = |id: &str, what: &str| {
        seen.iter()
            .find(|(i, _, w, _)| i == id && *w == what)
            .unwrap_or_else(|| panic!("{id} {what}: {seen:?}"))
    };
    // The new message ran at once, not after the leases.
    assert!(find("m-2", "ran").3 < Duration::from_secs(1), "{seen:?}");
    // The held ones came back from the delay queue once the leases ended, counted, and ran.
    for id in ["m-0", "m-1"] {
        let (_, delivered, _, at) = find(id, "ran");
        assert!(*at >= lease - Duration::from_millis(200), "{seen:?}");
        assert!(delivered.is_some_and(|n| n >= 2), "{seen:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(depth(&connection, queue).await, 0);
    assert_eq!(depth(&connection, delay_queue).await, 0);
}

#[tokio::test]
async fn delays_refuse_a_shared_channel_and_a_queue_they_do_not_return_to() {
    let Some((connection, channel, _)) = setup("idem.delays-setup").await else {
        return;
    };
    let (queue, delay_queue) = ("idem.delays-setup.orders", "idem.delays-setup.wait");
    plain_queue(&channel, queue, FieldTable::default()).await;
    let _ = channel
        .queue_delete(delay_queue.into(), QueueDeleteOptions::default())
        .await;
    let shared = connection.create_channel().await.unwrap();
    let _dead_letters = DeadLetters::publish_to(&shared, "", "idem.delays-setup.dead")
        .await
        .unwrap();
    let refused = idem_consumer::rabbitmq::Delays::through(&shared, delay_queue, queue).await;
    assert!(
        matches!(refused, Err(SetupError::SharedChannel)),
        "{refused:?}"
    );
    let _ = channel
        .queue_delete(
            "idem.delays-setup.elsewhere".into(),
            QueueDeleteOptions::default(),
        )
        .await;
    let delays = idem_consumer::rabbitmq::Delays::through(
        &connection.create_channel().await.unwrap(),
        "idem.delays-setup.elsewhere",
        "another-queue",
    )
    .await
    .unwrap();
    let elsewhere = RabbitQueue::new(queue, DeadLetters::queue_policy()).delays(delays);
    assert!(
        matches!(elsewhere, Err(SetupError::DelaysElsewhere { .. })),
        "{elsewhere:?}"
    );
}
