//! The test server: a stream, a pull consumer and a dead-letter stream of each test's
//! own, publishing and pulling, every wait bounded.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer::PullConsumer};
use bytes::Bytes;
use futures_util::StreamExt;
use idem_consumer::nats::{DeadLetters, JetStreamMessage, JetStreamSource};

pub(crate) const WAIT: Duration = Duration::from_secs(15);

/// A stream of its own (`<name>.>`), its pull consumer with a short ack wait, and a
/// dead-letter stream (`<name>_DLQ`, subject `<name>_dlq`).
pub(crate) async fn setup(
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

pub(crate) async fn publish(
    js: &jetstream::Context,
    subject: String,
    id: Option<&str>,
    payload: &str,
) {
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

pub(crate) async fn next(messages: &mut jetstream::consumer::pull::Stream) -> JetStreamMessage {
    let message = tokio::time::timeout(WAIT, messages.next())
        .await
        .expect("a delivery within the wait")
        .expect("the stream goes on")
        .expect("a delivery");
    JetStreamMessage::new(message)
}

pub(crate) fn subject(consumer: &PullConsumer, leaf: &str) -> String {
    format!("{}.{leaf}", consumer.cached_info().stream_name)
}

pub(crate) use crate::common::AckLost;

pub(crate) async fn assert_settled(consumer: &mut PullConsumer) {
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

/// A source over the test's consumer, dead-lettering to its dead-letter stream.
pub(crate) fn source_of(pull: &PullConsumer) -> JetStreamSource {
    let dlq = format!("{}_dlq", pull.cached_info().stream_name);
    JetStreamSource::new(pull.cached_info(), DeadLetters::publish_to(dlq))
        .expect("an explicit-ack consumer")
}

/// `count` deliveries, fetched in as many pulls as it takes, within the wait.
pub(crate) async fn fetch(pull: &PullConsumer, count: usize) -> Vec<jetstream::Message> {
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
