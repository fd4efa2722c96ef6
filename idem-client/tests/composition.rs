//! idem-client composed with the retry middleware users already run (reqwest-retry's
//! `RetryTransientMiddleware`), placed around it and inside it, against idem-http's layer
//! on 127.0.0.1: one `send` is one logical operation, so every try of it, whoever makes
//! it, carries one key, and the handler's effect happens once.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use idem_client::{IdempotencyKey, IdempotencyMiddleware, RetryPolicy};
use idem_core::{Idempotency, MemoryStore};
use idem_http::{Disposition, IdempotencyLayer};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::RetryTransientMiddleware;
use reqwest_retry::policies::ExponentialBackoff;

/// What the server saw.
#[derive(Default)]
struct Seen {
    /// Executions of the handler.
    charges: AtomicU32,
    /// Every `Idempotency-Key` value that reached the server.
    keys: Mutex<BTreeSet<String>>,
}

/// Charges, then answers 500 the first time and 201 after: the answer that a retry
/// middleware retries, from a handler whose effect happened.
async fn charge(State(seen): State<Arc<Seen>>) -> (StatusCode, String) {
    let n = seen.charges.fetch_add(1, Ordering::SeqCst) + 1;
    let status = if n == 1 {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::CREATED
    };
    (status, format!("charge-{n}"))
}

/// Records the key of every request, before the layer sees it.
async fn record_key(
    State(seen): State<Arc<Seen>>,
    headers: HeaderMap,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) {
        seen.keys.lock().unwrap().insert(key.to_owned());
    }
    next.run(request).await
}

/// The server: `/payments` behind idem-http's layer, whose 500 is stored (a final
/// answer, replayed to every retry of its key).
async fn start() -> (SocketAddr, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| {
        Ok(format!("tests {}", idem_http::scope::path(parts)))
    })
    .disposition(|_| Disposition::Store);
    let app = Router::new()
        .route("/payments", post(charge).route_layer(layer))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&seen),
            record_key,
        ))
        .with_state(Arc::clone(&seen));
    let addr = common::serve(app).await;
    (addr, seen)
}

fn idem() -> IdempotencyMiddleware {
    IdempotencyMiddleware::new().policy(
        RetryPolicy::default()
            .backoff(Duration::from_millis(10), Duration::from_millis(50))
            .deadline(Duration::from_secs(5)),
    )
}

fn retry() -> RetryTransientMiddleware<ExponentialBackoff> {
    let policy = ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(5), Duration::from_millis(20))
        .build_with_max_retries(3);
    RetryTransientMiddleware::new_with_policy(policy)
}

fn inner() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// reqwest-retry outside idem-client: the order a user gets adding idem-client to a
/// client that already retries.
fn retry_outside() -> ClientWithMiddleware {
    ClientBuilder::new(inner())
        .with(retry())
        .with(idem())
        .build()
}

/// reqwest-retry inside idem-client.
fn retry_inside() -> ClientWithMiddleware {
    ClientBuilder::new(inner())
        .with(idem())
        .with(retry())
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_automatic_key_is_one_for_the_whole_send_whichever_side_retries() {
    for (order, client) in [("outside", retry_outside()), ("inside", retry_inside())] {
        let (addr, seen) = start().await;
        let response = client
            .post(format!("http://{addr}/payments"))
            .body("amount=500")
            .send()
            .await
            .unwrap();
        // The 500 is the operation's answer: retried, it is replayed, never run again.
        assert_eq!(response.status(), 500, "retry {order}");
        assert_eq!(response.text().await.unwrap(), "charge-1", "retry {order}");
        assert_eq!(
            seen.charges.load(Ordering::SeqCst),
            1,
            "retry {order}: charged once"
        );
        let keys = seen.keys.lock().unwrap().clone();
        assert_eq!(
            keys.len(),
            1,
            "retry {order}: one key for every try, got {keys:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sends_are_two_operations() {
    let (addr, seen) = start().await;
    let client = retry_outside();
    for _ in 0..2 {
        let _ = client
            .post(format!("http://{addr}/payments"))
            .body("amount=500")
            .send()
            .await
            .unwrap();
    }
    assert_eq!(seen.keys.lock().unwrap().len(), 2, "a key per send");
    assert_eq!(seen.charges.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_callers_own_goes_on_every_try() {
    let (addr, seen) = start().await;
    let response = retry_outside()
        .post(format!("http://{addr}/payments"))
        .with_extension(IdempotencyKey::new("order-1187").unwrap())
        .body("amount=500")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    let keys = seen.keys.lock().unwrap().clone();
    assert_eq!(keys, BTreeSet::from(["\"order-1187\"".to_owned()]));
    assert_eq!(seen.charges.load(Ordering::SeqCst), 1);
}

/// A signing middleware, as auth middlewares are: it signs each request it sends,
/// over the key header (which it must see), with a fresh signature each time.
struct Sign(AtomicU32);

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Sign {
    async fn handle(
        &self,
        mut request: reqwest::Request,
        extensions: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        let key = request
            .headers()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none")
            .to_owned();
        let signature = format!("sig-{n} over {key}");
        request
            .headers_mut()
            .insert("x-signature", signature.parse().unwrap());
        next.run(request, extensions).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signing_middleware_inside_signs_every_try_over_the_key() {
    let tries: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let seen = Arc::clone(&tries);
    // 503 the first time, then 201: the middleware tries again.
    let app = Router::new().route(
        "/signed",
        post(move |headers: HeaderMap| {
            let seen = Arc::clone(&seen);
            async move {
                let header = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned()
                };
                let mut tries = seen.lock().unwrap();
                tries.push((header("idempotency-key"), header("x-signature")));
                match tries.len() {
                    1 => StatusCode::SERVICE_UNAVAILABLE,
                    _ => StatusCode::CREATED,
                }
            }
        }),
    );
    let addr = common::serve(app).await;
    let client = ClientBuilder::new(inner())
        .with(idem())
        .with(Sign(AtomicU32::new(0)))
        .build();
    let response = client
        .post(format!("http://{addr}/signed"))
        .body("amount=500")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let tries = tries.lock().unwrap().clone();
    assert_eq!(tries.len(), 2, "{tries:?}");
    assert_eq!(tries[0].0, tries[1].0, "one key for both tries");
    assert!(
        tries[0].0.starts_with('"'),
        "the key was set before signing"
    );
    assert_ne!(tries[0].1, tries[1].1, "each try signed afresh");
    assert!(tries[1].1.ends_with(&tries[1].0), "signed over the key");
}

/// Never retries a 5xx: the strategy to give reqwest-retry if it stays beside idem-client.
struct No5xx;

impl reqwest_retry::RetryableStrategy for No5xx {
    fn handle(
        &self,
        res: &reqwest_middleware::Result<reqwest::Response>,
    ) -> Option<reqwest_retry::Retryable> {
        match res {
            Ok(response) if response.status().is_server_error() => None,
            other => reqwest_retry::default_on_request_success(other.as_ref().ok()?)
                .or(Some(reqwest_retry::Retryable::Fatal)),
        }
    }
}

/// The hazard idem-client's docs name: reqwest-retry's default strategy retries a 500,
/// which idem-http's default holds for a lease (the effect may have happened); the
/// retries poll it, and once the lease ends one takes the key over and the handler runs
/// again. With a strategy that never retries a 5xx, the 500 is the answer and the handler
/// runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_retrys_default_strategy_runs_a_held_500_again_after_the_lease() {
    for (strategy, charges) in [("default", 2), ("no 5xx", 1)] {
        let seen = Arc::new(Seen::default());
        let short_lease = idem_core::Idempotency::builder(MemoryStore::new())
            .lease(Duration::from_millis(300))
            .build()
            .unwrap();
        let layer = IdempotencyLayer::new(short_lease, |parts| {
            Ok(format!("tests {}", idem_http::scope::path(parts)))
        });
        let app = Router::new()
            .route("/payments", post(charge).route_layer(layer))
            .with_state(Arc::clone(&seen));
        let addr = common::serve(app).await;
        let policy = ExponentialBackoff::builder()
            .retry_bounds(Duration::from_millis(5), Duration::from_millis(20))
            .build_with_max_retries(3);
        let builder = ClientBuilder::new(inner());
        let builder = match strategy {
            "default" => builder.with(RetryTransientMiddleware::new_with_policy(policy)),
            _ => builder.with(RetryTransientMiddleware::new_with_policy_and_strategy(
                policy, No5xx,
            )),
        };
        let client = builder.with(idem()).build();
        let response = client
            .post(format!("http://{addr}/payments"))
            .body("amount=500")
            .send()
            .await
            .unwrap();
        assert_eq!(seen.charges.load(Ordering::SeqCst), charges, "{strategy}");
        let expected = if charges == 2 { 201 } else { 500 };
        assert_eq!(response.status().as_u16(), expected, "{strategy}");
    }
}

/// idem-http says when a key is held until its lease ends (after a 500 it did not keep):
/// nothing changes before its `Retry-After`, so idem-client does not poll sooner, and a
/// deadline that ends first hands the 409 back at once instead of polling it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_until_its_lease_ends_is_not_polled_sooner() {
    let seen = Arc::new(Seen::default());
    let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| {
        Ok(format!("tests {}", idem_http::scope::path(parts)))
    });
    let app = Router::new()
        .route("/payments", post(charge).route_layer(layer))
        .with_state(Arc::clone(&seen));
    let addr = common::serve(app).await;
    let client = ClientBuilder::new(inner()).with(idem()).build();
    let send = || {
        client
            .post(format!("http://{addr}/payments"))
            .header("idempotency-key", "k-held")
            .body("amount=500")
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), 500, "a 500 is an answer");
    let again = send().await.unwrap();
    assert_eq!(again.status(), 409);
    let attempts = again
        .extensions()
        .get::<idem_client::Attempts>()
        .expect("idem-client's count")
        .attempts;
    assert_eq!(
        attempts, 1,
        "held for 30 s, past the 5 s deadline: not polled"
    );
    assert_eq!(seen.charges.load(Ordering::SeqCst), 1);
}
