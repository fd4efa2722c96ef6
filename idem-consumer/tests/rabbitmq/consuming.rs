//! Consuming a queue: `no_ack` refused, `run` over a lapin stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use idem_consumer::Consumer;
use idem_consumer::rabbitmq::{DeadLetters, RabbitQueue, SetupError};
use idem_core::{Context, Idempotency, MemoryStore, WorkError};
use lapin::BasicProperties;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};

use crate::support::{WAIT, depth, plain_queue, publishing_dead_letters, setup};

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
