//! The RabbitMQ adapter against a real rabbitmq-server on 127.0.0.1
//! (scripts/services.sh starts it; `IDEM_TEST_RABBITMQ_URL`). Every wait is bounded.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use idem_consumer::rabbitmq::RabbitMessage;
use idem_consumer::{Backoff, Consumer, DeadLetterReason, Message, Settled};
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
