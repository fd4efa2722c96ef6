//! The test broker: a connection and queues of each test's own, publishing, consuming,
//! and reading what a queue holds, every wait bounded.

use std::time::Duration;

use futures_util::StreamExt;
use idem_consumer::rabbitmq::{DeadLetters, RabbitMessage, RabbitQueue};
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

pub(crate) const WAIT: Duration = Duration::from_secs(15);

/// A connection, and a queue of its own whose dead letters go to `<queue>.dlq`.
pub(crate) async fn setup(name: &str) -> Option<(Connection, Channel, String)> {
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

pub(crate) async fn publish(channel: &Channel, queue: &str, id: Option<&str>, payload: &str) {
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

pub(crate) async fn consume(channel: &Channel, queue: &str, prefetch: u16) -> lapin::Consumer {
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

pub(crate) async fn next(deliveries: &mut lapin::Consumer, queue: &str) -> RabbitMessage {
    let delivery = tokio::time::timeout(WAIT, deliveries.next())
        .await
        .expect("a delivery within the wait")
        .expect("the consumer goes on")
        .expect("a delivery");
    RabbitMessage::new(delivery, queue)
}

/// How many messages wait in `queue`, asked on a channel of its own.
pub(crate) async fn depth(connection: &Connection, queue: &str) -> u32 {
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

/// A queue of its own with no dead-letter exchange: a rejected message would be dropped.
pub(crate) async fn plain_queue(channel: &Channel, queue: &str, arguments: FieldTable) {
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
pub(crate) async fn take(channel: &Channel, queue: &str) -> lapin::message::BasicGetMessage {
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

pub(crate) fn header<'a>(
    message: &'a lapin::message::BasicGetMessage,
    name: &str,
) -> Option<&'a AMQPValue> {
    message
        .delivery
        .properties
        .headers()
        .as_ref()?
        .inner()
        .get(name)
}

/// `queue` consumed on `channel`, its dead letters published to the default exchange
/// under `routing_key` on a channel of their own.
pub(crate) async fn publishing_dead_letters(
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
pub(crate) async fn delivery(deliveries: &mut lapin::Consumer) -> lapin::message::Delivery {
    tokio::time::timeout(WAIT, deliveries.next())
        .await
        .expect("a delivery within the wait")
        .expect("the consumer goes on")
        .expect("a delivery")
}
