//! A webhook receiver: Standard Webhooks signatures verified, each `webhook-id` run once,
//! on SQLite.
//!
//! ```sh
//! cargo run -p idem-http --example webhooks            # listens on 127.0.0.1:3000
//! PORT=3001 WEBHOOK_SECRET=whsec_... cargo run -p idem-http --example webhooks
//! # and a sender `initech` signing `v1a` (ed25519), verified with its public key:
//! WEBHOOK_PUBLIC_KEY=whpk_... cargo run -p idem-http --example webhooks
//! ```
//!
//! It prints a signed `curl` delivery from the sender `acme` to try (valid for five
//! minutes); send it twice and the second answer is the first one replayed, with
//! `idempotent-replayed: true`. `app.rs` holds the router and the order of its layers.

mod app;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_core::Idempotency;
use idem_sqlite::SqliteStore;
use standardwebhooks::Webhook;

/// A demo secret, for when `WEBHOOK_SECRET` is not set: never use it for real.
const DEMO_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secret = std::env::var("WEBHOOK_SECRET").unwrap_or_else(|_| DEMO_SECRET.to_owned());
    let path = std::env::temp_dir().join("idem-http-webhooks-example.db");
    // Senders retry a failed delivery for a day or more (and people redeliver by hand):
    // records are kept a week, so a late redelivery is still answered, not run again.
    let idem = Idempotency::builder(SqliteStore::open(&path)?)
        .retention(Duration::from_secs(7 * 24 * 3600))
        .build()?
        .into_dyn();
    let mut senders = HashMap::from([("acme".to_owned(), Webhook::new(&secret)?.into())]);
    // A sender that signs `v1a` (ed25519): its public key, `whpk_...`, when given.
    if let Ok(public_key) = std::env::var("WEBHOOK_PUBLIC_KEY") {
        senders.insert(
            "initech".to_owned(),
            app::Verifier::public_key(&public_key)?,
        );
    }
    let ledger = app::Ledger::default();
    let app = app::app(senders, idem, ledger.clone());

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "webhooks example on http://{addr} (records in {})",
        path.display()
    );

    // A delivery to try, signed as a sender would sign it.
    let id = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W";
    let payload =
        r#"{"type":"invoice.paid","timestamp":"2026-01-01T00:00:00Z","data":{"invoice":"in_42"}}"#;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let timestamp = i64::try_from(now)?;
    let signature = Webhook::new(&secret)?.sign(id, timestamp, payload.as_bytes())?;
    println!(
        "curl -i -X POST http://{addr}/webhooks/acme -H 'content-type: application/json' \\\n  \
         -H 'webhook-id: {id}' -H 'webhook-timestamp: {timestamp}' \\\n  \
         -H 'webhook-signature: {signature}' -d '{payload}'"
    );

    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // What ran in this process: one entry per message, however often it came.
    for entry in ledger.entries() {
        println!(
            "processed {} from {} (#{})",
            entry.id, entry.sender, entry.seq
        );
    }
    Ok(())
}
