//! A payments service with one protected POST, on SQLite: an authentication middleware
//! outside the idempotency layer, the scope taken from the account it verified, and a
//! handler that calls its payment provider as a step with a derived idempotency key.
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
//! The provider takes about two seconds, so a second request sent meanwhile shows the
//! 409. An amount of 0 is declined (a 402, stored); 13 makes the provider unavailable (a
//! 503 that releases the key); 504 makes it time out (a 504 that holds the key until the
//! lease ends).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem_core::driver::InterruptedKind;
use idem_core::{Idempotency, WorkError};
use idem_http::{Disposition, IdempotencyLayer, Idempotent, Problem, scope};
use idem_sqlite::SqliteStore;
use serde::{Deserialize, Serialize};

/// The account the authentication middleware verified.
#[derive(Clone, Debug)]
struct AccountId(String);

/// A stand-in for real authentication (a session lookup, a verified token's subject):
/// here a bearer token `acct_<letters or digits>` is the account. A request without one
/// goes on without an `AccountId`, and the idempotency layer's scope refuses it with 401.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let account = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|token| {
            token.len() <= 64
                && token.strip_prefix("acct_").is_some_and(|id| {
                    !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric())
                })
        });
    if let Some(account) = account {
        let account = AccountId(account.to_owned());
        request.extensions_mut().insert(account);
    }
    next.run(request).await
}

/// How a provider call fails.
#[derive(Debug, thiserror::Error)]
enum ProviderError {
    #[error("the card was declined: {0}")]
    Declined(&'static str),
    #[error("the provider is unavailable")]
    Unavailable,
    #[error("the provider did not answer in time")]
    TimedOut,
}

/// A payment provider that deduplicates by idempotency key, as Stripe's or Adyen's APIs
/// do: a call with a key it has seen answers the first call's charge.
#[derive(Clone, Default)]
struct Provider {
    charges: Arc<Mutex<HashMap<String, String>>>,
    next_charge: Arc<AtomicU64>,
}

impl Provider {
    async fn charge(&self, idempotency_key: &str, amount: u64) -> Result<String, ProviderError> {
        tokio::time::sleep(Duration::from_secs(2)).await;
        match amount {
            0 => return Err(ProviderError::Declined("nothing to charge")),
            13 => return Err(ProviderError::Unavailable),
            504 => return Err(ProviderError::TimedOut),
            _ => {}
        }
        let mut charges = self.charges.lock().unwrap_or_else(PoisonError::into_inner);
        let charge = charges
            .entry(idempotency_key.to_owned())
            .or_insert_with(|| {
                format!("ch_{}", self.next_charge.fetch_add(1, Ordering::SeqCst) + 1)
            });
        Ok(charge.clone())
    }
}

#[derive(Clone, Default)]
struct AppState {
    provider: Provider,
    next_payment: Arc<AtomicU64>,
}

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
    charge: String,
}

/// Creates a payment: the part that must happen once per key.
async fn create_payment(
    State(state): State<AppState>,
    Idempotent(ctx): Idempotent,
    Json(request): Json<PaymentRequest>,
) -> Response {
    // Each effect is a step: a retry that takes over after a crash gets the checkpointed
    // value back instead of running it again. The payment's id first, so that a takeover
    // answers the same id.
    let id = ctx
        .step("payment-id", || async {
            let n = state.next_payment.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<_, WorkError<ProviderError>>(format!("pay_{n}"))
        })
        .await;
    let id = match id {
        Ok(id) => id,
        Err(err) => return step_failed(err),
    };
    // The provider's own idempotency key: the same for every run of this request, so a
    // charge that a crash makes us send twice is answered, not made twice.
    let provider_key = ctx.derive("provider");
    let charge = ctx
        .step("charge", || async {
            state
                .provider
                .charge(&provider_key, request.amount)
                .await
                .map_err(|err| match err {
                    ProviderError::Declined(_) => WorkError::Permanent(err),
                    ProviderError::Unavailable => WorkError::Retryable(err),
                    ProviderError::TimedOut => WorkError::Unknown(err),
                })
        })
        .await;
    let charge = match charge {
        Ok(charge) => charge,
        Err(err) => return step_failed(err),
    };
    let location = format!("/payments/{id}");
    let payment = Payment {
        id,
        amount: request.amount,
        currency: request.currency,
        status: "succeeded",
        charge,
    };
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(payment),
    )
        .into_response()
}

/// The answer for a failed step, and what the layer does with it (the crate docs'
/// "Handlers" table).
fn step_failed(err: WorkError<ProviderError>) -> Response {
    let (disposition, problem) = match err {
        // Final: stored and replayed (the default for a 4xx).
        WorkError::Permanent(err) => (
            Disposition::Store,
            Problem::new(StatusCode::PAYMENT_REQUIRED, "payment-declined", "The payment was declined")
                .detail(err.to_string()),
        ),
        // Nothing happened: release the key, so that a retry runs at once (a 503 would
        // otherwise be held until the lease ends).
        WorkError::Retryable(err) => (
            Disposition::Release,
            Problem::new(StatusCode::SERVICE_UNAVAILABLE, "provider-unavailable", "The payment provider is unavailable")
                .detail(format!("{err}; nothing was charged. Retry with the same key."))
                .retry_after(1),
        ),
        // The charge may have happened: hold the key until the lease ends; a retry then
        // takes over and asks the provider again with the same provider key.
        WorkError::Unknown(err) => (
            Disposition::Hold,
            Problem::new(StatusCode::GATEWAY_TIMEOUT, "provider-timeout", "The payment provider did not answer")
                .detail(format!("{err}; the charge may have gone through. Retry with the same key after the lease: the retry finds out.")),
        ),
        WorkError::Interrupted(interrupted) => {
            // The example has no logger.
            eprintln!("a payment step was interrupted: {interrupted}");
            let problem = |status, title| Problem::new(status, "interrupted", title);
            match interrupted.kind() {
                // The step ran and its value can never be checkpointed: a takeover would
                // run it again and fail again. A stored failure ends it.
                InterruptedKind::Unstorable => (
                    Disposition::Store,
                    problem(StatusCode::INTERNAL_SERVER_ERROR, "The payment could not be recorded"),
                ),
                // Another attempt took over, or a checkpoint could not be written: a
                // takeover after the lease finishes the payment.
                InterruptedKind::LeaseLost | InterruptedKind::Store => (
                    Disposition::Hold,
                    problem(StatusCode::SERVICE_UNAVAILABLE, "The payment was interrupted")
                        .detail("Retry with the same key.")
                        .retry_after(1),
                ),
                _ => (
                    Disposition::Hold,
                    problem(StatusCode::INTERNAL_SERVER_ERROR, "The payment was interrupted"),
                ),
            }
        }
        _ => (
            Disposition::Hold,
            Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "The payment failed"),
        ),
    };
    (disposition, problem).into_response()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join("idem-http-payments-example.db");
    let idem = Idempotency::new(SqliteStore::open(&path)?);
    // The scope: the account the middleware verified, and the operation
    // ("acct_42/POST /payments"). No account: 401, never a scope shared with others.
    let layer = IdempotencyLayer::new(
        idem,
        scope::by_principal(|account: &AccountId| account.0.clone()),
    );
    let app = Router::new()
        .route("/payments", post(create_payment))
        .layer(layer)
        // The last `.layer()` is the outermost: authentication runs before the
        // idempotency layer reads the scope.
        .layer(middleware::from_fn(authenticate))
        .with_state(AppState::default());

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
