//! The JetStream source: consumers that do not ack each message refused, in-progress
//! marks for work longer than the ack wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use bytes::Bytes;
use futures_util::StreamExt;
use idem_consumer::nats::{DeadLetters, JetStreamMessage, JetStreamSource, SetupError};
use idem_consumer::{Consumer, Message};
use idem_core::{Context, Idempotency, MemoryStore, done};

use crate::support::{assert_settled, fetch, publish, setup, source_of, subject};

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
