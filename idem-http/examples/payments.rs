//! A payments service with one protected POST, on SQLite.
//!
//! ```sh
//! cargo run -p idem-http --example payments            # listens on 127.0.0.1:3000
//! PORT=3001 cargo run -p idem-http --example payments  # another port
//!
//! curl -i -X POST http://127.0.0.1:3000/payments \
//!      -H 'Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"' \
//!      -H 'Authorization: Bearer acct_42' -H 'Content-Type: application/json' \
//!      -d '{"amount": 500, "currency": "EUR"}'
//! ```
//!
//! The handler takes about two seconds (a slow payment provider), so a second request
//! sent meanwhile shows the 409.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use idem_core::{Context, Idempotency};
use idem_http::{IdempotencyLayer, Problem};
use idem_sqlite::SqliteStore;
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct PaymentRequest {
    amount: u64,
    currency: String,
}

#[derive(Serialize)]
struct Payment {
    id: String,
    amount: u64,
    currency: String,
    status: &'static str,
}

/// Creates a payment: the part that must happen once per key.
async fn create_payment(
    State(next_id): State<Arc<AtomicU64>>,
    Extension(ctx): Extension<Context>,
    Json(request): Json<PaymentRequest>,
) -> Response {
    // A slow payment provider; ctx.derive gives its call an idempotency key of its own.
    let _provider_key = ctx.derive("provider");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let id = format!("pay_{}", next_id.fetch_add(1, Ordering::SeqCst));
    let location = format!("/payments/{id}");
    let payment = Payment {
        id,
        amount: request.amount,
        currency: request.currency,
        status: "succeeded",
    };
    (StatusCode::CREATED, [("location", location)], Json(payment)).into_response()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join("idem-http-payments-example.db");
    let idem = Idempotency::new(SqliteStore::open(&path)?);
    // The scope: the caller (from its bearer token) and the operation. A real service
    // takes the principal from its authentication layer, through the request extensions.
    let layer = IdempotencyLayer::new(idem, |parts| {
        let principal = parts
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                Problem::new(StatusCode::UNAUTHORIZED, "unauthenticated", "Sign in first")
                    .detail("Send Authorization: Bearer <account>.")
            })?;
        Ok(format!("{principal}/{} {}", parts.method, parts.uri.path()))
    });
    let app = Router::new()
        .route("/payments", post(create_payment))
        .layer(layer)
        .with_state(Arc::new(AtomicU64::new(1)));

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "payments example on http://{addr} (records in {})",
        path.display()
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
