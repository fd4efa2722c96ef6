//! Deliveries and their settlements: an ack lost in a crash, a nak's delay, a batch, a
//! quorum queue's delivery count and the attempt limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_consumer::rabbitmq::DEAD_LETTER_REASON;
use idem_consumer::{Backoff, Cause, Consumer, DeadLetterReason, Message, Settled};
use idem_core::{Context, Idempotency, MemoryStore, WorkError};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};

use crate::common::{counted, refusing_empty};
use crate::support::{
    consume, delivery, depth, header, next, plain_queue, publish, publishing_dead_letters, setup,
    take,
};

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
