//! The consumer loop: futures that can be spawned, `run` over a stream of deliveries.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_consumer::Consumer;
use idem_core::done;

use crate::common::{TestMessage, counted};
use crate::support::consumer;

/// The futures a consumer loop spawns are `Send` for both adapters (checked when this
/// file compiles; never called).
#[allow(dead_code)]
fn consumers_futures_are_send(
    consumer: &Consumer,
    jetstream: &idem_consumer::nats::JetStreamMessage,
    rabbit: &[idem_consumer::rabbitmq::RabbitMessage],
    dyn_messages: &[Box<dyn idem_consumer::Message>],
) {
    fn send<T: Send>(_: T) {}
    send(consumer.handle(
        jetstream,
        |_ctx, payload| async move { done(payload.len()) },
    ));
    send(consumer.handle_batch(rabbit, |_ctx, payload| async move { done(payload.len()) }));
    send(consumer.handle_batch(
        dyn_messages.iter().map(Box::as_ref),
        |_ctx, payload| async move { done(payload.len()) },
    ));
}

#[tokio::test]
async fn run_stops_when_its_stream_of_deliveries_ends() {
    let consumer = consumer();
    let runs = Arc::new(AtomicUsize::new(0));
    let deliveries = futures_util::stream::iter(
        (0..3).map(|i| Ok::<_, std::io::Error>(TestMessage::new(&format!("m-{i}"), "x"))),
    );
    let source = idem_consumer::StreamSource::new(deliveries, NonZeroUsize::MIN, Duration::ZERO);
    let report = tokio::time::timeout(
        Duration::from_secs(5),
        consumer.run(&source, counted(&runs), std::future::pending()),
    )
    .await
    .expect("run stops at the stream's end");
    assert_eq!((report.acked, report.receive_errors), (3, 1), "{report:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}
