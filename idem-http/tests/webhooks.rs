//! The webhook receiver example's router (`examples/webhooks/app.rs`, the same file),
//! on 127.0.0.1 over the memory store, with deliveries signed as a Standard Webhooks
//! sender signs them: each message's effect happens once, however often it is delivered
//! and re-signed; a delivery whose signature or timestamp does not hold is refused and
//! claims nothing.

#[path = "../examples/webhooks/app.rs"]
mod app;
mod common;

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use app::{Entry, Ledger};
use base64::Engine as _;
use common::{Server, client};
use ed25519_dalek::{Signer as _, SigningKey};
use idem_core::{Idempotency, MemoryStore};
use idem_http::REPLAYED_HEADER;
use standardwebhooks::Webhook;

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const OTHER_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const PAYLOAD: &str =
    r#"{"type":"invoice.paid","timestamp":"2026-01-01T00:00:00Z","data":{"invoice":"in_42"}}"#;

fn now() -> i64 {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    i64::try_from(seconds).expect("a timestamp in range")
}

/// One delivery's headers, as a sender sends them.
#[derive(Clone, Debug)]
struct Delivery {
    id: String,
    timestamp: i64,
    signature: String,
    payload: String,
}

impl Delivery {
    /// `payload` as message `id`, signed with `secret` at `timestamp`.
    fn signed(secret: &str, id: &str, timestamp: i64, payload: &str) -> Self {
        let signature = Webhook::new(secret)
            .expect("a valid secret")
            .sign(id, timestamp, payload.as_bytes())
            .expect("a UTF-8 payload signs");
        Self {
            id: id.to_owned(),
            timestamp,
            signature,
            payload: payload.to_owned(),
        }
    }
}

/// A sender's ed25519 key, made from a fixed seed.
fn signing_key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

/// Its public half, as Standard Webhooks writes it (`whpk_...`).
fn public_key(key: &SigningKey) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(key.verifying_key().to_bytes());
    format!("whpk_{encoded}")
}

impl Delivery {
    /// `payload` as message `id`, signed `v1a` (ed25519) with `key` at `timestamp`.
    fn signed_v1a(key: &SigningKey, id: &str, timestamp: i64, payload: &str) -> Self {
        let signed = format!("{id}.{timestamp}.{payload}");
        let signature = key.sign(signed.as_bytes()).to_bytes();
        let encoded = base64::engine::general_purpose::STANDARD.encode(signature);
        Self {
            id: id.to_owned(),
            timestamp,
            // Senders may send several signatures, space-separated: one that is not
            // this key's comes first here.
            signature: format!("v1,bm90IHRoaXMgb25l v1a,{encoded}"),
            payload: payload.to_owned(),
        }
    }
}

/// What the receiver answered.
#[derive(Debug)]
struct Answer {
    status: u16,
    replayed: bool,
    content_type: String,
    body: serde_json::Value,
}

struct Receiver {
    server: Server,
    ledger: Ledger,
}

impl Receiver {
    async fn start() -> Self {
        let senders = HashMap::from([
            (
                "acme".to_owned(),
                Webhook::new(SECRET).expect("a valid secret").into(),
            ),
            (
                "globex".to_owned(),
                Webhook::new(OTHER_SECRET).expect("a valid secret").into(),
            ),
            (
                "initech".to_owned(),
                app::Verifier::public_key(&public_key(&signing_key(7)))
                    .expect("a valid public key"),
            ),
        ]);
        let ledger = Ledger::default();
        let idem = Idempotency::new(MemoryStore::new()).into_dyn();
        let server = Server::start(app::app(senders, idem, ledger.clone())).await;
        Self { server, ledger }
    }

    async fn deliver(&self, sender: &str, delivery: &Delivery) -> Answer {
        let response = client()
            .post(self.server.url(&format!("/webhooks/{sender}")))
            .header("content-type", "application/json")
            .header("webhook-id", &delivery.id)
            .header("webhook-timestamp", delivery.timestamp.to_string())
            .header("webhook-signature", &delivery.signature)
            .body(delivery.payload.clone())
            .timeout(std::time::Duration::from_secs(10))
            .send()
            .await
            .expect("the receiver answers");
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let (replayed, content_type) = (header(REPLAYED_HEADER) == "true", header("content-type"));
        let body = response.bytes().await.expect("the body reads");
        let body = serde_json::from_slice(&body)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&body).into()));
        Answer {
            status,
            replayed,
            content_type,
            body,
        }
    }

    fn entries(&self) -> Vec<Entry> {
        self.ledger.entries()
    }
}

fn entry(sender: &str, id: &str, seq: usize) -> Entry {
    Entry {
        sender: sender.to_owned(),
        id: id.to_owned(),
        seq,
    }
}

#[tokio::test]
async fn a_message_runs_once_however_often_it_is_redelivered() {
    let receiver = Receiver::start().await;
    let id = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W";
    // First sent a few minutes ago, within the five minutes' tolerance.
    let original = Delivery::signed(SECRET, id, now() - 200, PAYLOAD);

    let first = receiver.deliver("acme", &original).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert!(!first.replayed);
    assert_eq!(receiver.entries(), [entry("acme", id, 1)]);

    // Redeliveries as senders make them: the same message re-signed with a fresh
    // timestamp (so with another signature), and byte for byte the same delivery.
    for attempt in 1..=5 {
        let resigned = Delivery::signed(SECRET, id, now() - 200 + attempt * 30, PAYLOAD);
        assert_ne!(resigned.signature, original.signature);
        for delivery in [&resigned, &original] {
            let again = receiver.deliver("acme", delivery).await;
            assert_eq!(again.status, first.status, "{again:?}");
            assert_eq!(again.body, first.body, "the first answer, replayed");
            assert_eq!(again.content_type, first.content_type);
            assert!(again.replayed, "{again:?}");
        }
    }
    assert_eq!(
        receiver.entries(),
        [entry("acme", id, 1)],
        "the effect happened once"
    );
}

#[tokio::test]
async fn a_bad_signature_or_a_stale_timestamp_is_401_and_claims_nothing() {
    let receiver = Receiver::start().await;
    let id = "msg_refused_first";

    let forged = Delivery::signed(OTHER_SECRET, id, now(), PAYLOAD);
    let tampered = Delivery {
        payload: PAYLOAD.replace("in_42", "in_43"),
        ..Delivery::signed(SECRET, id, now(), PAYLOAD)
    };
    let stale = Delivery::signed(SECRET, id, now() - 600, PAYLOAD);
    let unsigned = Delivery {
        signature: String::new(),
        ..Delivery::signed(SECRET, id, now(), PAYLOAD)
    };
    for (what, delivery, problem) in [
        ("another secret", &forged, "bad-signature"),
        ("another body", &tampered, "bad-signature"),
        ("ten minutes old", &stale, "stale-delivery"),
        ("no signature", &unsigned, "bad-signature"),
    ] {
        let refused = receiver.deliver("acme", delivery).await;
        assert_eq!(refused.status, 401, "{what}: {refused:?}");
        assert_eq!(refused.content_type, "application/problem+json", "{what}");
        let kind = refused.body["type"].as_str().unwrap_or_default();
        assert!(kind.ends_with(problem), "{what}: {kind}");
        assert!(!refused.replayed, "{what}");
    }
    assert!(receiver.entries().is_empty(), "nothing was done");

    // The id was not claimed: the real delivery runs.
    let good = receiver
        .deliver("acme", &Delivery::signed(SECRET, id, now(), PAYLOAD))
        .await;
    assert_eq!(good.status, 200, "{good:?}");
    assert!(!good.replayed, "the first real delivery runs: {good:?}");
    assert_eq!(receiver.entries(), [entry("acme", id, 1)]);
}

#[tokio::test]
async fn two_messages_run_twice_and_two_senders_never_share_an_id() {
    let receiver = Receiver::start().await;
    let a = receiver
        .deliver("acme", &Delivery::signed(SECRET, "msg_a", now(), PAYLOAD))
        .await;
    let b = receiver
        .deliver("acme", &Delivery::signed(SECRET, "msg_b", now(), PAYLOAD))
        .await;
    assert_eq!((a.status, b.status), (200, 200));
    assert!(!a.replayed && !b.replayed);
    assert_ne!(a.body, b.body);
    // The same id from another sender is another message: the scope is sender and route.
    let c = receiver
        .deliver(
            "globex",
            &Delivery::signed(OTHER_SECRET, "msg_a", now(), PAYLOAD),
        )
        .await;
    assert_eq!(c.status, 200, "{c:?}");
    assert!(!c.replayed);
    assert_eq!(
        receiver.entries(),
        [
            entry("acme", "msg_a", 1),
            entry("acme", "msg_b", 2),
            entry("globex", "msg_a", 3)
        ]
    );
}

#[tokio::test]
async fn opaque_message_ids_are_keys_as_they_are() {
    // Standard Webhooks ids are opaque strings: senders use base64 (`=`), emails (`@`),
    // lists (`,` `;`) and spaces. Each runs once and is replayed, never refused.
    let receiver = Receiver::start().await;
    let ids = [
        "bXNnXzJLV1BCZ0xsQWZ4ZHB4MkFJNTRwUEo4NWY0Vw==",
        "delivery@hooks.example",
        "order,42;retry",
        "msg with spaces",
        "\"quoted\"",
    ];
    for (seq, id) in ids.iter().enumerate() {
        let delivery = Delivery::signed(SECRET, id, now() - 10, PAYLOAD);
        let first = receiver.deliver("acme", &delivery).await;
        assert_eq!(first.status, 200, "{id}: {first:?}");
        let again = receiver.deliver("acme", &delivery).await;
        assert!(again.replayed, "{id}: {again:?}");
        assert_eq!(again.body, first.body, "{id}");
        assert_eq!(receiver.entries().len(), seq + 1, "{id}");
    }
    // Each its own key: `"quoted"` is not `quoted`.
    let plain = Delivery::signed(SECRET, "quoted", now() - 10, PAYLOAD);
    assert!(!receiver.deliver("acme", &plain).await.replayed);
}

#[tokio::test]
async fn v1a_deliveries_signed_with_the_senders_ed25519_key_run_once() {
    let receiver = Receiver::start().await;
    let key = signing_key(7);
    let id = "msg_v1a_1";
    let first = receiver
        .deliver(
            "initech",
            &Delivery::signed_v1a(&key, id, now() - 100, PAYLOAD),
        )
        .await;
    assert_eq!(first.status, 200, "{first:?}");
    // Re-signed with a fresh timestamp: the same message, replayed.
    let again = receiver
        .deliver("initech", &Delivery::signed_v1a(&key, id, now(), PAYLOAD))
        .await;
    assert!(again.replayed, "{again:?}");
    assert_eq!(again.body, first.body);
    // Another key, another body, a stale timestamp, or a v1 signature for a v1a sender:
    // refused before anything is claimed.
    let other_key = signing_key(8);
    let tampered = Delivery {
        payload: PAYLOAD.replace("in_42", "in_43"),
        ..Delivery::signed_v1a(&key, "msg_v1a_2", now(), PAYLOAD)
    };
    for (what, delivery, problem) in [
        (
            "another key",
            Delivery::signed_v1a(&other_key, "msg_v1a_2", now(), PAYLOAD),
            "bad-signature",
        ),
        ("another body", tampered, "bad-signature"),
        (
            "ten minutes old",
            Delivery::signed_v1a(&key, "msg_v1a_2", now() - 600, PAYLOAD),
            "stale-delivery",
        ),
        (
            "a v1 signature",
            Delivery::signed(SECRET, "msg_v1a_2", now(), PAYLOAD),
            "bad-signature",
        ),
    ] {
        let refused = receiver.deliver("initech", &delivery).await;
        assert_eq!(refused.status, 401, "{what}: {refused:?}");
        let kind = refused.body["type"].as_str().unwrap_or_default();
        assert!(kind.ends_with(problem), "{what}: {kind}");
    }
    let good = receiver
        .deliver(
            "initech",
            &Delivery::signed_v1a(&key, "msg_v1a_2", now(), PAYLOAD),
        )
        .await;
    assert!(
        !good.replayed,
        "the refused deliveries claimed nothing: {good:?}"
    );
    assert_eq!(
        receiver.entries(),
        [entry("initech", id, 1), entry("initech", "msg_v1a_2", 2)]
    );
}
