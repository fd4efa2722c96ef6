//! The receiver's router, shared by the example's `main` and by `tests/webhooks.rs`.
//!
//! The order of the layers, outermost first:
//!
//! 1. `verify`: reads the body, checks the Standard Webhooks signature and timestamp
//!    (`v1`, a shared secret's HMAC, with the `standardwebhooks` crate; `v1a`, the
//!    sender's ed25519 key, with `ed25519-dalek`), answers 401 (problem+json) when they
//!    do not hold, and
//!    hands the request on, rebuilt from the bytes it read, with the verified sender in
//!    its extensions. A forged or stale delivery never reaches the idempotency layer, so
//!    it claims no key and can neither block nor read a real delivery's answer.
//! 2. `IdempotencyLayer` keyed by the `webhook-id` header, scoped by the verified sender
//!    and the route: each message runs once; every redelivery gets the first answer.
//! 3. `receive`: the effect.
//!
//! A sender re-signs each redelivery with a fresh `webhook-timestamp`, so its
//! `webhook-signature` changes too. Neither header is part of the layer's fingerprint
//! (method, path, query and body), so a re-signed redelivery is the same request, and is
//! answered by a replay, not by 422. The body is the same on every delivery of a
//! message: Standard Webhooks senders send the same payload (its `timestamp` field is the
//! event's, not the delivery's). The timestamp's freshness is the signature check's
//! business: a delivery older than five minutes is refused before any key is looked at,
//! and a replayed capture within those five minutes hits the stored answer, not the
//! effect.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use base64::Engine as _;
use bytes::Bytes;
use ed25519_dalek::{Signature, VerifyingKey};
use idem_core::Idempotency;
use idem_http::{IdempotencyLayer, Problem};
use serde::Serialize;
use standardwebhooks::{Webhook, WebhookError};
use tower::ServiceBuilder;

/// The largest delivery read to verify it; a larger one is refused with 413.
const MAX_DELIVERY: usize = 256 * 1024;

/// How far a delivery's `webhook-timestamp` may be from now, as the spec and the
/// `standardwebhooks` crate allow.
const TOLERANCE_SECONDS: i64 = 5 * 60;

/// The senders this receiver accepts, by the name in their route (`/webhooks/{name}`),
/// each with how its deliveries are verified.
pub(crate) type Senders = HashMap<String, Verifier>;

/// How one sender's deliveries are verified.
pub(crate) enum Verifier {
    /// `v1` signatures: HMAC-SHA256 under the secret both sides share (`whsec_...`).
    Secret(Webhook),
    /// `v1a` signatures: ed25519 under the sender's key, verified with its public half
    /// (`whpk_...`), so the receiver holds nothing that can sign.
    PublicKey(VerifyingKey),
}

impl From<Webhook> for Verifier {
    fn from(webhook: Webhook) -> Self {
        Verifier::Secret(webhook)
    }
}

/// Why a delivery was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    #[error("the signature does not verify: {0}")]
    BadSignature(String),
    #[error("the timestamp is outside the tolerance: {0}")]
    Stale(String),
}

impl Verifier {
    /// A sender's ed25519 public key, as Standard Webhooks writes it: `whpk_` and the 32
    /// bytes in base64.
    pub(crate) fn public_key(key: &str) -> Result<Self, Box<dyn std::error::Error>> {
        let encoded = key
            .strip_prefix("whpk_")
            .ok_or("a public key starts with whpk_")?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(encoded)?;
        let bytes: [u8; 32] = bytes
            .try_into()
            .map_err(|_| "an ed25519 public key is 32 bytes")?;
        Ok(Verifier::PublicKey(VerifyingKey::from_bytes(&bytes)?))
    }

    fn verify(&self, payload: &[u8], headers: &HeaderMap) -> Result<(), Refused> {
        match self {
            Verifier::Secret(webhook) => {
                webhook.verify(payload, headers).map_err(|err| match err {
                    WebhookError::TimestampTooOldError | WebhookError::FutureTimestampError => {
                        Refused::Stale(err.to_string())
                    }
                    _ => Refused::BadSignature(err.to_string()),
                })
            }
            Verifier::PublicKey(key) => verify_v1a(key, payload, headers),
        }
    }
}

/// A `v1a` delivery: one of the space-separated `v1a,<base64>` signatures in
/// `webhook-signature` is the sender's ed25519 signature of `{id}.{timestamp}.{payload}`,
/// and the timestamp is within the tolerance.
fn verify_v1a(key: &VerifyingKey, payload: &[u8], headers: &HeaderMap) -> Result<(), Refused> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| Refused::BadSignature(format!("no {name} header")))
    };
    let id = header(standardwebhooks::HEADER_WEBHOOK_ID)?;
    let timestamp = header(standardwebhooks::HEADER_WEBHOOK_TIMESTAMP)?;
    let at: i64 = timestamp
        .parse()
        .map_err(|_| Refused::BadSignature("the timestamp is not a number".into()))?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    if now.abs_diff(at) > TOLERANCE_SECONDS.unsigned_abs() {
        return Err(Refused::Stale(format!("{} seconds away", now.abs_diff(at))));
    }
    let mut signed = format!("{id}.{timestamp}.").into_bytes();
    signed.extend_from_slice(payload);
    let verifies = header(standardwebhooks::HEADER_WEBHOOK_SIGNATURE)?
        .split(' ')
        .filter_map(|candidate| candidate.strip_prefix("v1a,"))
        .filter_map(|encoded| {
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .ok()
        })
        .filter_map(|bytes| Signature::from_slice(&bytes).ok())
        .any(|signature| key.verify_strict(&signed, &signature).is_ok());
    match verifies {
        true => Ok(()),
        false => Err(Refused::BadSignature("no v1a signature verifies".into())),
    }
}

/// Who sent a delivery whose signature held: put in the request's extensions by
/// `verify`, read by the idempotency scope and the handler.
#[derive(Clone, Debug)]
pub(crate) struct Sender(pub(crate) String);

/// What the deliveries did: the effect that must happen once per message.
#[derive(Clone, Default)]
pub(crate) struct Ledger(Arc<Mutex<Vec<Entry>>>);

/// One processed message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Entry {
    /// The sender, by name.
    pub(crate) sender: String,
    /// The message's `webhook-id`.
    pub(crate) id: String,
    /// Which entry this is, from 1.
    pub(crate) seq: usize,
}

impl Ledger {
    /// The processed messages, in order.
    pub(crate) fn entries(&self) -> Vec<Entry> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn record(&self, sender: String, id: String) -> Entry {
        let mut entries = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = Entry {
            sender,
            id,
            seq: entries.len() + 1,
        };
        entries.push(entry.clone());
        entry
    }
}

/// The receiver: `POST /webhooks/{sender}` for each of `senders`, verified, then run once
/// per `webhook-id` through `idem`, then recorded in `ledger`.
pub(crate) fn app(senders: Senders, idem: Idempotency, ledger: Ledger) -> Router {
    let idempotency = IdempotencyLayer::new(idem, |parts| {
        // `verify` put the sender there; without it the request was not verified, which
        // the layer order rules out.
        let Sender(sender) = parts.extensions.get::<Sender>().ok_or_else(|| {
            Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "unverified",
                "The delivery reached the idempotency layer unverified",
            )
        })?;
        Ok(format!(
            "{sender}/{} {}",
            parts.method,
            idem_http::scope::path(parts)
        ))
    })
    .header(HeaderName::from_static(standardwebhooks::HEADER_WEBHOOK_ID));
    let stack = ServiceBuilder::new()
        // Outermost: nothing unverified goes further.
        .layer(middleware::from_fn_with_state(Arc::new(senders), verify))
        .layer(idempotency);
    Router::new()
        .route("/webhooks/{sender}", post(receive))
        .layer(stack)
        .with_state(ledger)
}

/// Verifies a delivery before anything is claimed or done.
async fn verify(State(senders): State<Arc<Senders>>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let name = parts
        .uri
        .path()
        .strip_prefix("/webhooks/")
        .unwrap_or_default()
        .to_owned();
    let Some(verifier) = senders.get(&name) else {
        return Problem::new(StatusCode::NOT_FOUND, "unknown-sender", "No such sender")
            .into_response()
            .into_response();
    };
    let Ok(payload) = axum::body::to_bytes(body, MAX_DELIVERY).await else {
        return Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "delivery-too-large",
            "The delivery is too large",
        )
        .detail(format!(
            "Deliveries are read whole to verify them, up to {MAX_DELIVERY} bytes."
        ))
        .into_response()
        .into_response();
    };
    if let Err(err) = verifier.verify(&payload, &parts.headers) {
        return refused(&err);
    }
    parts.extensions.insert(Sender(name));
    next.run(Request::from_parts(parts, Body::from(payload)))
        .await
}

/// 401 for a delivery whose signature or timestamp does not hold.
fn refused(err: &Refused) -> Response {
    let (slug, title) = match err {
        Refused::Stale(_) => (
            "stale-delivery",
            "The delivery's timestamp is outside the tolerance",
        ),
        Refused::BadSignature(_) => ("bad-signature", "The delivery's signature does not verify"),
    };
    Problem::new(StatusCode::UNAUTHORIZED, slug, title)
        .detail(format!("Refused before anything was done: {err}."))
        .into_response()
        .into_response()
}

/// The effect: record the message, once.
async fn receive(
    State(ledger): State<Ledger>,
    Extension(Sender(sender)): Extension<Sender>,
    headers: HeaderMap,
    _payload: Bytes,
) -> Response {
    let id = headers
        .get(standardwebhooks::HEADER_WEBHOOK_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (StatusCode::OK, Json(ledger.record(sender, id))).into_response()
}
