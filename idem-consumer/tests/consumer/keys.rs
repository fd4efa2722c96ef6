//! Keys, fingerprints and scopes: a key reused, missing or invalid, a key and a
//! fingerprint from the payload, one scope over several sources.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_consumer::{Cause, DeadLetterReason, Settled};
use idem_core::{Error, Fingerprint};

use crate::common::{Settle, TestMessage, counted};
use crate::support::consumer;

#[tokio::test]
async fn an_id_reused_for_another_payload_is_dead_lettered_and_the_first_result_kept() {
    let consumer = consumer();
    let runs = Arc::new(AtomicUsize::new(0));
    consumer
        .handle(&TestMessage::new("m-1", "2 mugs"), counted(&runs))
        .await
        .unwrap();
    let reused = TestMessage::new("m-1", "9 plates");
    match consumer.handle(&reused, counted(&runs)).await.unwrap() {
        Settled::DeadLettered {
            reason: DeadLetterReason::KeyReused,
            cause: Cause::Idem(Error::Mismatch),
        } => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(
        reused.settlements(),
        [Settle::DeadLetter(DeadLetterReason::KeyReused)]
    );
    let again = TestMessage::new("m-1", "2 mugs");
    assert!(
        consumer
            .handle(&again, counted(&runs))
            .await
            .unwrap()
            .replayed()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_message_without_a_usable_key_is_dead_lettered_without_running() {
    let consumer = consumer();
    let runs = Arc::new(AtomicUsize::new(0));
    let no_id = TestMessage::new("", "x").without_id();
    let settled = consumer.handle(&no_id, counted(&runs)).await.unwrap();
    assert!(matches!(
        settled,
        Settled::DeadLettered {
            reason: DeadLetterReason::NoKey,
            cause: Cause::NoKey
        }
    ));
    for bad in ["", "line\nbreak", &"x".repeat(10_000)] {
        let message = TestMessage::new(bad, "x");
        let settled = consumer.handle(&message, counted(&runs)).await.unwrap();
        assert!(
            matches!(
                settled,
                Settled::DeadLettered {
                    reason: DeadLetterReason::BadKey,
                    cause: Cause::BadKey(_)
                }
            ),
            "{bad:?}: {settled:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert!(
        consumer.idempotency().store().is_empty(),
        "nothing is stored for a refused key"
    );
}

#[tokio::test]
async fn a_key_from_the_payload_and_a_fingerprint_that_ignores_a_timestamp() {
    // The publisher sets no id and stamps each resend with its send time.
    let consumer = consumer()
        .key_from_payload(|payload| {
            let event: serde_json::Value = serde_json::from_slice(payload).ok()?;
            Some(event.get("event")?.as_str()?.to_owned())
        })
        .fingerprint_with(|payload| {
            let mut event: serde_json::Value = serde_json::from_slice(payload).unwrap_or_default();
            if let Some(event) = event.as_object_mut() {
                event.remove("sent_at");
            }
            Fingerprint::of_json(&event).expect("a JSON value")
        });
    let runs = Arc::new(AtomicUsize::new(0));
    let first = TestMessage::new("", r#"{"event":"evt_1","cents":500,"sent_at":1}"#).without_id();
    let resend = TestMessage::new("", r#"{"event":"evt_1","cents":500,"sent_at":2}"#).without_id();
    assert!(
        !consumer
            .handle(&first, counted(&runs))
            .await
            .unwrap()
            .replayed()
    );
    assert!(
        consumer
            .handle(&resend, counted(&runs))
            .await
            .unwrap()
            .replayed()
    );
    let changed = TestMessage::new("", r#"{"event":"evt_1","cents":900,"sent_at":3}"#).without_id();
    assert!(matches!(
        consumer.handle(&changed, counted(&runs)).await.unwrap(),
        Settled::DeadLettered {
            reason: DeadLetterReason::KeyReused,
            ..
        }
    ));
    let keyless = TestMessage::new("", r#"{"cents":1}"#).without_id();
    assert!(matches!(
        consumer.handle(&keyless, counted(&runs)).await.unwrap(),
        Settled::DeadLettered {
            reason: DeadLetterReason::NoKey,
            ..
        }
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn equal_ids_from_two_sources_are_two_messages_unless_one_scope_is_set() {
    let runs = Arc::new(AtomicUsize::new(0));
    let consumer = consumer();
    consumer
        .handle(&TestMessage::new("m-1", "x").from("eu"), counted(&runs))
        .await
        .unwrap();
    consumer
        .handle(&TestMessage::new("m-1", "x").from("us"), counted(&runs))
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let consumer = consumer.scope("orders-everywhere");
    consumer
        .handle(&TestMessage::new("m-2", "x").from("eu"), counted(&runs))
        .await
        .unwrap();
    let settled = consumer
        .handle(&TestMessage::new("m-2", "x").from("us"), counted(&runs))
        .await
        .unwrap();
    assert!(settled.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn an_invalid_scope_setting_redelivers_instead_of_dead_lettering_everything() {
    let scoped = consumer().scope("");
    let runs = Arc::new(AtomicUsize::new(0));
    let message = TestMessage::new("m-1", "x").delivered(1);
    let settled = scoped.handle(&message, counted(&runs)).await.unwrap();
    assert!(
        matches!(
            settled,
            Settled::Retried {
                cause: Cause::BadKey(_),
                ..
            }
        ),
        "{settled:?}"
    );
    assert_eq!(message.settlements(), [Settle::Nak(Duration::from_secs(1))]);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The source can be the culprit too: a queue named with a control character.
    let settled = consumer()
        .handle(
            &TestMessage::new("m-1", "x").from("bad\nqueue"),
            counted(&runs),
        )
        .await
        .unwrap();
    assert!(matches!(settled, Settled::Retried { .. }), "{settled:?}");
}
