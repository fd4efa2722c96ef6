//! Dead letters: rejected to the queue's dead-letter exchange, or published with their
//! reason under confirms; a copy no queue takes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use idem_consumer::rabbitmq::{DEAD_LETTER_REASON, ORIGINAL_QUEUE};
use idem_consumer::{Consumer, SettleError, Settled};
use idem_core::{Idempotency, MemoryStore};
use lapin::BasicProperties;
use lapin::options::{BasicGetOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable};

use crate::common::{counted, refusing_empty};
use crate::support::{
    consume, delivery, depth, header, next, plain_queue, publish, publishing_dead_letters, setup,
    take,
};

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
