//! idem-client against idem-http's layer on 127.0.0.1, through the chaos runs' fault proxy:
//! each logical operation's effect happens once and the caller gets the first answer.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use common::{client, quick};
use idem_chaos::proxy::{Fault, FaultProxy};
use idem_client::{Attempts, ClientError, IdempotencyKey, IdempotencyMiddleware, RetryPolicy};
use idem_core::{Idempotency, MemoryStore};
use idem_http::IdempotencyLayer;
use reqwest_middleware::ClientBuilder;
use tokio::net::TcpListener;

/// What the server saw.
#[derive(Default)]
struct Server {
    /// Executions of the payment handler.
    charges: AtomicU32,
    /// Requests that reached the unprotected handler.
    plain_hits: AtomicU32,
    /// Requests that reached the busy handler.
    busy_hits: AtomicU32,
    /// Requests that reached the gateway handler.
    gateway_hits: AtomicU32,
}

/// What a gateway in front of the server answers the first time: the status the request
/// names in `x-first-status` (502, 504, 408 ...); then 201.
async fn gateway(
    State(server): State<Arc<Server>>,
    headers: HeaderMap,
) -> axum::response::Response {
    let first = server.gateway_hits.fetch_add(1, Ordering::SeqCst) == 0;
    let status = headers
        .get("x-first-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u16>().ok())
        .and_then(|v| StatusCode::from_u16(v).ok());
    match status {
        Some(status) if first => (status, "upstream").into_response(),
        _ => (StatusCode::CREATED, "done").into_response(),
    }
}

async fn charge(State(server): State<Arc<Server>>, headers: HeaderMap) -> impl IntoResponse {
    if headers.contains_key("x-slow") {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    if headers.contains_key("x-very-slow") {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let n = server.charges.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, format!("charge-{n}"))
}

async fn plain(State(server): State<Arc<Server>>) -> impl IntoResponse {
    server.plain_hits.fetch_add(1, Ordering::SeqCst);
    "plain"
}

/// 503 with `Retry-After: 1` the first time, then 200.
async fn busy(State(server): State<Arc<Server>>) -> axum::response::Response {
    if server.busy_hits.fetch_add(1, Ordering::SeqCst) == 0 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", "1")],
            "busy",
        )
            .into_response();
    }
    "ready".into_response()
}

/// The server on 127.0.0.1: `/payments` behind idem-http's layer, `/plain` and `/busy`
/// without it.
async fn start() -> (SocketAddr, Arc<Server>) {
    let server = Arc::new(Server::default());
    let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| {
        Ok(format!("tests {}", parts.uri.path()))
    });
    let app = Router::new()
        .route("/payments", post(charge).route_layer(layer))
        .route("/plain", post(plain))
        .route("/busy", get(busy))
        .route("/gateway", post(gateway))
        .with_state(Arc::clone(&server));
    let addr = common::serve(app).await;
    (addr, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_lost_after_the_server_processed_is_retried_and_replayed() {
    let (addr, server) = start().await;
    let proxy = FaultProxy::start(addr, 7).await.unwrap();
    // The next request reaches the server, which runs it; its answer never comes back.
    proxy.inject(Fault::CutAfterRequest);
    let client = client(IdempotencyMiddleware::new().policy(quick()));
    let response = client
        .post(format!("http://{}/payments", proxy.addr()))
        .with_extension(IdempotencyKey::new("order-1").unwrap())
        .body("amount=500")
        .send()
        .await
        .unwrap();
    let attempts = response.extensions().get::<Attempts>().cloned().unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(
        response.text().await.unwrap(),
        "charge-1",
        "the first answer"
    );
    assert!(attempts.attempts >= 2, "{attempts:?}");
    assert!(attempts.replayed, "{attempts:?}");
    assert_eq!(server.charges.load(Ordering::SeqCst), 1, "charged once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn automatic_keys_make_a_post_safe_to_retry() {
    let (addr, server) = start().await;
    let proxy = FaultProxy::start(addr, 8).await.unwrap();
    proxy.inject(Fault::CutAfterRequest);
    let client = client(IdempotencyMiddleware::new().policy(quick()));
    // No key given: the middleware makes one for this call and keeps it across its tries.
    let response = client
        .post(format!("http://{}/payments", proxy.addr()))
        .body("amount=500")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.text().await.unwrap(), "charge-1");
    assert_eq!(server.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_without_a_key_is_never_retried() {
    let (addr, server) = start().await;
    let proxy = FaultProxy::start(addr, 9).await.unwrap();
    proxy.inject(Fault::CutAfterRequest);
    let client = client(
        IdempotencyMiddleware::new()
            .without_automatic_keys()
            .policy(quick()),
    );
    let result = client
        .post(format!("http://{}/plain", proxy.addr()))
        .body("once")
        .send()
        .await;
    assert!(result.is_err(), "the cut answer is the caller's to handle");
    // Let a retry, were there one, arrive.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.plain_hits.load(Ordering::SeqCst), 1, "sent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_with_one_key_charge_once_and_agree() {
    let (addr, server) = start().await;
    let client = client(IdempotencyMiddleware::new().policy(quick()));
    let url = format!("http://{addr}/payments");
    let sends: Vec<_> = (0..6)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let response = client
                    .post(url)
                    .with_extension(IdempotencyKey::new("order-shared").unwrap())
                    .header("x-slow", "1")
                    .body("amount=500")
                    .send()
                    .await
                    .unwrap();
                (response.status(), response.text().await.unwrap())
            })
        })
        .collect();
    for send in sends {
        let (status, body) = send.await.unwrap();
        assert_eq!((status, body.as_str()), (StatusCode::CREATED, "charge-1"));
    }
    assert_eq!(server.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured() {
    let (addr, server) = start().await;
    let client = client(IdempotencyMiddleware::new().policy(quick()));
    let started = std::time::Instant::now();
    let response = client
        .get(format!("http://{addr}/busy"))
        .send()
        .await
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.extensions().get::<Attempts>().unwrap().attempts, 2);
    assert_eq!(server.busy_hits.load(Ordering::SeqCst), 2);
    // The server asked for a second; the deadline bounds the wait from above.
    assert!(waited >= Duration::from_secs(1), "{waited:?}");
    assert!(waited < Duration::from_secs(15), "{waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_for_another_request_is_answered_not_retried() {
    let (addr, server) = start().await;
    let client = client(IdempotencyMiddleware::new().policy(quick()));
    let url = format!("http://{addr}/payments");
    let send = |body: &'static str| {
        client
            .post(url.clone())
            .with_extension(IdempotencyKey::new("order-reused").unwrap())
            .body(body)
            .send()
    };
    assert_eq!(
        send("amount=500").await.unwrap().status(),
        StatusCode::CREATED
    );
    let reused = send("amount=900").await.unwrap();
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reused.extensions().get::<Attempts>().unwrap().attempts, 1);
    assert!(reused.text().await.unwrap().contains("key-reused"));
    assert_eq!(server.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_flight_is_polled_until_the_deadline_and_no_longer() {
    let (addr, server) = start().await;
    let url = format!("http://{addr}/payments");
    let first = {
        let (client, url) = (client(IdempotencyMiddleware::new()), url.clone());
        tokio::spawn(async move {
            client
                .post(url)
                .with_extension(IdempotencyKey::new("order-long").unwrap())
                .header("x-very-slow", "1")
                .body("amount=500")
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let impatient = client(
        IdempotencyMiddleware::new().policy(
            RetryPolicy::default()
                .backoff(Duration::ZERO, Duration::ZERO)
                .deadline(Duration::from_millis(500)),
        ),
    );
    let started = std::time::Instant::now();
    let answer = impatient
        .post(url)
        .with_extension(IdempotencyKey::new("order-long").unwrap())
        .header("x-very-slow", "1")
        .body("amount=500")
        .send()
        .await;
    let waited = started.elapsed();
    // Still in flight at the deadline: the last poll's 409, or, when the deadline cut
    // that poll short (a loaded machine), the deadline's error after the polls.
    let attempts = match answer {
        Ok(response) => {
            assert_eq!(
                response.status(),
                StatusCode::CONFLICT,
                "still in flight at the deadline"
            );
            response.extensions().get::<Attempts>().unwrap().attempts
        }
        Err(reqwest_middleware::Error::Middleware(err)) => {
            match err.downcast_ref::<ClientError>() {
                Some(ClientError::DeadlineExceeded { attempts, key }) => {
                    assert_eq!(key.as_ref().map(IdempotencyKey::as_str), Some("order-long"));
                    *attempts
                }
                _ => panic!("{err:?}"),
            }
        }
        Err(err) => panic!("{err:?}"),
    };
    // Polled, with a pause between polls even under a zero backoff, and stopped at the
    // deadline (10 ms pauses: at most about 50 polls in 500 ms).
    assert!((2..=60).contains(&attempts), "{attempts} polls");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    assert_eq!(first.await.unwrap(), StatusCode::CREATED);
    assert_eq!(server.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_is_bounded_by_the_deadline() {
    // Accepts connections and never answers.
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let inner = reqwest::Client::builder().no_proxy().build().unwrap();
    let client = ClientBuilder::new(inner)
        .with(
            IdempotencyMiddleware::new()
                .policy(RetryPolicy::default().deadline(Duration::from_millis(300))),
        )
        .build();
    let started = std::time::Instant::now();
    let err = client
        .post(format!("http://{addr}/payments"))
        .with_extension(IdempotencyKey::new("order-silent").unwrap())
        .body("amount=500")
        .send()
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(
        common::client_error(&err),
        ClientError::DeadlineExceeded {
            attempts: 1,
            key: Some(_)
        }
    ));
    held.abort();
}

#[tokio::test]
async fn a_stream_body_is_refused_up_front_when_buffering_is_off() {
    let (addr, server) = start().await;
    let client = client(IdempotencyMiddleware::new().buffer_streams(0));
    let stream = futures_stream();
    let err = client
        .post(format!("http://{addr}/payments"))
        .with_extension(IdempotencyKey::new("order-stream").unwrap())
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap_err();
    assert!(matches!(
        common::client_error(&err),
        ClientError::BodyNotReplayable
    ));
    assert_eq!(server.charges.load(Ordering::SeqCst), 0, "nothing was sent");
}

/// A one-chunk stream, made without a stream crate.
fn futures_stream()
-> impl futures_core::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send + Sync + 'static {
    struct Once(Option<bytes::Bytes>);
    impl futures_core::Stream for Once {
        type Item = Result<bytes::Bytes, std::io::Error>;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            std::task::Poll::Ready(self.0.take().map(Ok))
        }
    }
    Once(Some(bytes::Bytes::from_static(b"amount=500")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateways_timeouts_are_retried_and_a_500_is_an_answer() {
    for (status, retried) in [(502, true), (504, true), (408, true), (500, false)] {
        let (addr, server) = start().await;
        let client = client(IdempotencyMiddleware::new().policy(quick()));
        let response = client
            .post(format!("http://{addr}/gateway"))
            .with_extension(IdempotencyKey::new("order-9").unwrap())
            .header("x-first-status", status.to_string())
            .body("amount=500")
            .send()
            .await
            .unwrap();
        let hits = server.gateway_hits.load(Ordering::SeqCst);
        if retried {
            assert_eq!((response.status().as_u16(), hits), (201, 2), "{status}");
        } else {
            assert_eq!((response.status().as_u16(), hits), (status, 1), "{status}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_durations_are_taken_as_a_day() {
    let (addr, _server) = start().await;
    let policy = RetryPolicy::default()
        .deadline(Duration::MAX)
        .backoff(Duration::from_millis(10), Duration::MAX);
    let response = client(IdempotencyMiddleware::new().policy(policy))
        .post(format!("http://{addr}/payments"))
        .body("amount=500")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
}
