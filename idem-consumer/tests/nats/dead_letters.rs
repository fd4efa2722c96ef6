//! Dead letters: published to their subject with the reason, refused inside the
//! message's own stream, a stored result that no longer decodes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use idem_consumer::nats::{DEAD_LETTER_REASON, ORIGINAL_CONSUMER, ORIGINAL_ID, ORIGINAL_STREAM};
use idem_consumer::{Cause, Consumer, DeadLetterReason, Message, SettleError, Settled};
use idem_core::{Context, Idempotency, MemoryStore, WorkError, done};

use crate::support::{AckLost, assert_settled, next, publish, setup, source_of, subject};

#[tokio::test]
async fn dead_letters_go_to_their_subject_with_the_reason_and_are_not_redelivered() {
    let Some((js, mut pull, mut dlq)) = setup("IDEM_DEAD").await else {
        return;
    };
    let stream = pull.cached_info().stream_name.clone();
    // Two publishers reuse one order id for two payloads (distinct message ids, so
    // JetStream's own duplicate window lets both in); a third message fails for good.
    publish(
        &js,
        subject(&pull, "orders"),
        Some("a"),
        r#"{"order":"o-1","cents":500}"#,
    )
    .await;
    publish(
        &js,
        subject(&pull, "orders"),
        Some("b"),
        r#"{"order":"o-1","cents":900}"#,
    )
    .await;
    publish(
        &js,
        subject(&pull, "orders"),
        Some("c"),
        r#"{"order":"o-2","cents":-1}"#,
    )
    .await;
    let consumer =
        Consumer::new(Idempotency::new(MemoryStore::new())).key_from_payload(|payload| {
            let order: serde_json::Value = serde_json::from_slice(payload).ok()?;
            Some(order.get("order")?.as_str()?.to_owned())
        });
    let work = |_ctx: Context, payload: Bytes| async move {
        let order: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        match order["cents"].as_i64() {
            Some(cents) if cents > 0 => Ok(cents),
            _ => Err(WorkError::Permanent("a negative amount".to_owned())),
        }
    };
    let mut messages = pull.messages().await.expect("subscribe");
    let mut reasons = Vec::new();
    for _ in 0..3 {
        let message = next(&mut messages)
            .await
            .dead_letter_to(format!("{stream}_dlq"));
        match consumer.handle(&message, work).await.unwrap() {
            Settled::Acked {
                value: 500,
                replayed: false,
            } => reasons.push("acked"),
            Settled::DeadLettered { reason, .. } => reasons.push(reason.as_str()),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(reasons, ["acked", "key-reused", "failed"]);
    assert_settled(&mut pull).await;

    // Nothing is redelivered past the ack wait.
    let quiet = tokio::time::timeout(Duration::from_millis(1500), messages.next()).await;
    assert!(quiet.is_err(), "a terminated message came back: {quiet:?}");

    let info = dlq.info().await.expect("dead-letter stream info");
    assert_eq!(info.state.messages, 2);
    let dead = dlq.get_raw_message(1).await.expect("the first dead letter");
    assert_eq!(
        dead.headers.get(DEAD_LETTER_REASON).map(|v| v.as_str()),
        Some("key-reused")
    );
    assert_eq!(dead.headers.get(ORIGINAL_ID).map(|v| v.as_str()), Some("b"));
    assert_eq!(
        dead.headers.get(ORIGINAL_STREAM).map(|v| v.as_str()),
        Some(stream.as_str())
    );
    assert_eq!(
        dead.headers.get(ORIGINAL_CONSUMER).map(|v| v.as_str()),
        Some("billing")
    );
    assert_eq!(&dead.payload[..], br#"{"order":"o-1","cents":900}"#);
}

#[tokio::test]
async fn a_dead_letter_subject_inside_the_message_s_own_stream_is_refused() {
    let Some((js, mut pull, _)) = setup("IDEM_DEAD_LOOP").await else {
        return;
    };
    let stream = pull.cached_info().stream_name.clone();
    publish(&js, format!("{stream}.orders"), Some("o-1"), "").await;
    let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    let mut messages = pull.messages().await.expect("subscribe");
    let message = next(&mut messages)
        .await
        .dead_letter_to(format!("{stream}.dead"));
    let fail = |_ctx: Context, _payload: Bytes| async {
        Err::<u8, _>(WorkError::Permanent("empty".to_owned()))
    };
    let err = consumer.handle(&message, fail).await.unwrap_err();
    assert!(matches!(err, SettleError::Misconfigured { .. }), "{err}");
    assert!(err.to_string().contains("another stream"), "{err}");
    // No copy was stored back into the stream.
    let info = js
        .get_stream(&stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .clone();
    assert_eq!(info.state.messages, 1);
    let _ = pull.info().await;
}

#[tokio::test]
async fn a_stored_result_that_no_longer_decodes_is_dead_lettered_and_never_run_again() {
    let Some((js, mut pull, dlq)) = setup("IDEM_UNREADABLE").await else {
        return;
    };
    publish(&js, subject(&pull, "orders"), Some("order-1"), "2 mugs").await;
    let source = source_of(&pull);
    let lease = Duration::from_millis(300);
    let consumer = Consumer::new(
        Idempotency::builder(MemoryStore::new())
            .lease(lease)
            .build()
            .unwrap(),
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let mut messages = pull.messages().await.expect("subscribe");
    // The release before the deploy stored a text and crashed before its ack.
    let first = source.wrap(next(&mut messages).await.into_inner());
    let settled = consumer
        .handle(&AckLost(&first), |_ctx, _payload| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { done("shipped".to_owned()) }
        })
        .await
        .unwrap();
    assert!(settled.is_acked());
    // The release after it reads a number: the redelivery cannot decode the result. A
    // replica of the release before could, during a rolling deploy: it is nak'd for a
    // lease, until the third delivery.
    let reads_a_number = |_ctx: Context, _payload: Bytes| {
        runs.fetch_add(1, Ordering::SeqCst);
        async { done(7u64) }
    };
    let again = source.wrap(next(&mut messages).await.into_inner());
    assert_eq!(again.delivery_count(), Some(2));
    let settled = consumer.handle(&again, reads_a_number).await.unwrap();
    assert!(
        matches!(
            settled,
            Settled::Retried {
                cause: Cause::Idem(idem_core::Error::Decode(_)),
                delay
            } if delay == lease
        ),
        "{settled:?}"
    );
    let third = source.wrap(next(&mut messages).await.into_inner());
    assert_eq!(third.delivery_count(), Some(3));
    let settled = consumer.handle(&third, reads_a_number).await.unwrap();
    assert!(
        matches!(
            settled,
            Settled::DeadLettered {
                reason: DeadLetterReason::Unreadable,
                cause: Cause::Idem(idem_core::Error::Decode(_))
            }
        ),
        "{settled:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_settled(&mut pull).await;
    let dead = dlq.get_raw_message(1).await.expect("the dead letter");
    assert_eq!(
        dead.headers.get(DEAD_LETTER_REASON).map(|v| v.as_str()),
        Some("unreadable")
    );
}
