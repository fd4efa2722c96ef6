//! The delay queue: naks wait there, not in the consumer's prefetch; the setups it
//! refuses.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_consumer::rabbitmq::{DeadLetters, RabbitQueue, SetupError};
use idem_consumer::{Cause, Consumer, Message, Settled};
use idem_core::{Idempotency, MemoryStore, WorkError};
use lapin::options::{BasicConsumeOptions, BasicQosOptions, QueueDeleteOptions};
use lapin::types::FieldTable;

use crate::common::counted;
use crate::support::{delivery, depth, plain_queue, publish, setup};

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
