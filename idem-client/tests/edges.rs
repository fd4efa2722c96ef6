//! idem-client at the edges real servers and outages put it on: servers that stall a try
//! or a body (raw TCP on 127.0.0.1), in-flight answers other than idem-http's defaults,
//! large conflicts, stream and multipart bodies, bare keys, an outage against a retry
//! budget, and an operation that ends without an answer and is finished by hand with its
//! key.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use common::{client, quick};
use idem_chaos::proxy::{Fault, FaultProxy};
use idem_client::{
    Attempts, ClientError, HeaderForm, IdempotencyKey, IdempotencyMiddleware, RetryPolicy, key_of,
};
use idem_core::{Idempotency, MemoryStore};
use idem_http::IdempotencyLayer;
use reqwest_middleware::ClientWithMiddleware;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::retry::budget::TpsBudget;

/// What the server saw.
#[derive(Default)]
struct Seen {
    /// Executions of the protected handler.
    charges: AtomicU32,
    /// Requests that reached the unprotected handlers.
    hits: AtomicU32,
    /// Every raw `Idempotency-Key` header value.
    headers: Mutex<Vec<String>>,
    /// Bodies the protected handler ran with.
    bodies: Mutex<Vec<Vec<u8>>>,
}

async fn charge(
    State(seen): State<Arc<Seen>>,
    headers: HeaderMap,
    body: bytes::Bytes,
) -> impl IntoResponse {
    if let Some(value) = headers.get("idempotency-key") {
        seen.headers
            .lock()
            .unwrap()
            .push(value.to_str().unwrap().to_owned());
    }
    if headers.contains_key("x-slow") {
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    seen.bodies.lock().unwrap().push(body.to_vec());
    let n = seen.charges.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, format!("charge-{n}"))
}

/// Stripe's answer while a key's first request runs, twice; then 201.
async fn stripe_style(State(seen): State<Arc<Seen>>) -> axum::response::Response {
    if seen.hits.fetch_add(1, Ordering::SeqCst) < 2 {
        let body = r#"{"error":{"code":"idempotency_key_in_use","message":"another request with this key is in progress","type":"invalid_request_error"}}"#;
        return (
            StatusCode::CONFLICT,
            [("content-type", "application/json")],
            body,
        )
            .into_response();
    }
    (StatusCode::CREATED, "done").into_response()
}

/// A 409 problem of the API's own, 100 KiB long.
async fn large_conflict(State(seen): State<Arc<Seen>>) -> axum::response::Response {
    seen.hits.fetch_add(1, Ordering::SeqCst);
    let detail = "x".repeat(100 * 1024);
    let body = format!(r#"{{"type":"https://api.example.com/order-exists","detail":"{detail}"}}"#);
    (
        StatusCode::CONFLICT,
        [("content-type", "application/problem+json")],
        body,
    )
        .into_response()
}

/// 503 without `Retry-After`, always.
async fn down(State(seen): State<Arc<Seen>>) -> axum::response::Response {
    seen.hits.fetch_add(1, Ordering::SeqCst);
    StatusCode::SERVICE_UNAVAILABLE.into_response()
}

/// The server: `/payments` behind idem-http's layer (its problem types under a base of
/// the server's own on `/custom-base`), the others without it.
async fn start() -> (SocketAddr, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let layer = || {
        IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| {
            Ok(format!("tests {}", idem_http::scope::path(parts)))
        })
    };
    let app = Router::new()
        .route("/payments", post(charge).route_layer(layer()))
        .route(
            "/custom-base",
            post(charge).route_layer(layer().problem_type_base("https://errors.example.com/idem/")),
        )
        .route("/stripe", post(stripe_style))
        .route("/large-conflict", post(large_conflict))
        .route("/down", post(down))
        .with_state(Arc::clone(&seen));
    let addr = common::serve(app).await;
    (addr, seen)
}

/// How the raw server treats one connection.
#[derive(Clone, Copy, Debug)]
enum Conn {
    /// Reads the request and never answers.
    Silent,
    /// Answers a 409 problem's head and part of its body, then stalls.
    StalledConflict,
    /// Answers 201 `done`.
    Created,
}

/// A raw HTTP/1.1 server on 127.0.0.1 treating its connections as `script` says, the
/// last entry for every later one; it counts the requests it read.
async fn raw_server(script: Vec<Conn>) -> (SocketAddr, Arc<AtomicU32>) {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&requests);
    tokio::spawn(async move {
        let mut held = Vec::new();
        for index in 0usize.. {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let conn = script[index.min(script.len() - 1)];
            let counted = Arc::clone(&counted);
            held.push(tokio::spawn(serve_raw(socket, conn, counted)));
        }
    });
    (addr, requests)
}

async fn serve_raw(mut socket: TcpStream, conn: Conn, requests: Arc<AtomicU32>) {
    let mut read = Vec::new();
    let mut buf = [0u8; 4096];
    // One request: its head, then as many body bytes as its Content-Length says.
    loop {
        let Ok(n) = socket.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        read.extend_from_slice(&buf[..n]);
        if let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&read[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if read.len() >= end + 4 + length {
                break;
            }
        }
    }
    requests.fetch_add(1, Ordering::SeqCst);
    match conn {
        Conn::Silent => tokio::time::sleep(Duration::from_secs(30)).await,
        Conn::StalledConflict => {
            let head = "HTTP/1.1 409 Conflict\r\ncontent-type: application/problem+json\r\ncontent-length: 200\r\n\r\n{\"type\":\"tag:idem-http,2026:in-fl";
            let _ = socket.write_all(head.as_bytes()).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        Conn::Created => {
            let answer =
                "HTTP/1.1 201 Created\r\ncontent-length: 4\r\nconnection: close\r\n\r\ndone";
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_the_server_never_answers_ends_at_its_own_timeout_and_is_tried_again() {
    let (addr, requests) = raw_server(vec![Conn::Silent, Conn::Created]).await;
    let client = client(
        IdempotencyMiddleware::new().policy(quick().attempt_timeout(Duration::from_millis(300))),
    );
    let response = client
        .post(format!("http://{addr}/payments"))
        .body("amount=500")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.extensions().get::<Attempts>().unwrap().attempts, 2);
    assert_eq!(requests.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_whose_body_stalls_is_bounded_by_the_try_timeout() {
    let (addr, requests) = raw_server(vec![Conn::StalledConflict, Conn::Created]).await;
    let client = client(
        IdempotencyMiddleware::new().policy(quick().attempt_timeout(Duration::from_millis(300))),
    );
    let send = client
        .post(format!("http://{addr}/payments"))
        .body("amount=500")
        .send();
    // Bounded here only so that a regression fails instead of hanging the suite.
    let response = tokio::time::timeout(Duration::from_secs(20), send)
        .await
        .expect("the stalled 409 body held the caller")
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(requests.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_without_an_answer_comes_back_with_its_key_to_finish_by_hand() {
    let (addr, seen) = start().await;
    let proxy = FaultProxy::start(addr, 11).await.unwrap();
    // The only try reaches the server, which charges; its answer never comes back.
    proxy.inject(Fault::CutAfterRequest);
    let once = client(IdempotencyMiddleware::new().policy(quick().max_attempts(1)));
    let err = once
        .post(format!("http://{}/payments", proxy.addr()))
        .body("amount=500")
        .send()
        .await
        .unwrap_err();
    let key = key_of(&err)
        .cloned()
        .expect("the automatic key is on the error");
    let reqwest_middleware::Error::Middleware(inner) = &err else {
        panic!("{err:?}")
    };
    assert!(
        matches!(
            inner.downcast_ref::<ClientError>(),
            Some(ClientError::Unanswered { attempts: 1, .. })
        ),
        "{err:?}"
    );
    assert!(
        !format!("{err:?}").contains(key.as_str()),
        "the key is never shown whole"
    );
    // Later, by hand, with the key: the first result, not a second charge.
    let response = once
        .post(format!("http://{addr}/payments"))
        .with_extension(key.clone())
        .body("amount=500")
        .send()
        .await
        .unwrap();
    let attempts = response.extensions().get::<Attempts>().cloned().unwrap();
    assert!(attempts.replayed);
    assert_eq!(attempts.key.as_ref(), Some(&key));
    assert_eq!(response.text().await.unwrap(), "charge-1");
    assert_eq!(seen.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_holds_the_automatic_key_the_server_saw() {
    let (addr, seen) = start().await;
    let response = client(IdempotencyMiddleware::new())
        .post(format!("http://{addr}/payments"))
        .body("amount=500")
        .send()
        .await
        .unwrap();
    let key = response
        .extensions()
        .get::<Attempts>()
        .unwrap()
        .key
        .clone()
        .unwrap();
    assert_eq!(*seen.headers.lock().unwrap(), vec![key.header_value()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripe_style_in_flight_409_is_polled() {
    let (addr, seen) = start().await;
    let response = client(IdempotencyMiddleware::new().policy(quick()))
        .post(format!("http://{addr}/stripe"))
        .body("amount=500")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.extensions().get::<Attempts>().unwrap().attempts, 3);
    assert_eq!(seen.hits.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_http_under_its_own_problem_base_is_polled() {
    let (addr, seen) = start().await;
    let url = format!("http://{addr}/custom-base");
    let send = |client: ClientWithMiddleware, url: String| async move {
        let response = client
            .post(url)
            .with_extension(IdempotencyKey::new("order-base").unwrap())
            .header("x-slow", "1")
            .body("amount=500")
            .send()
            .await
            .unwrap();
        (response.status(), response.text().await.unwrap())
    };
    let first = tokio::spawn(send(client(IdempotencyMiddleware::new()), url.clone()));
    tokio::time::sleep(Duration::from_millis(150)).await;
    // Arrives while the first runs: polled to the first's answer, not handed a 409.
    let second = send(client(IdempotencyMiddleware::new().policy(quick())), url).await;
    assert_eq!(second, (StatusCode::CREATED, "charge-1".to_owned()));
    assert_eq!(
        first.await.unwrap(),
        (StatusCode::CREATED, "charge-1".to_owned())
    );
    assert_eq!(seen.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_conflict_of_the_apis_own_is_an_answer_with_its_whole_body() {
    let (addr, seen) = start().await;
    let response = client(IdempotencyMiddleware::new().policy(quick()))
        .post(format!("http://{addr}/large-conflict"))
        .body("amount=500")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(response.extensions().get::<Attempts>().unwrap().attempts, 1);
    let body = response.text().await.unwrap();
    assert_eq!(
        body.len(),
        100 * 1024 + r#"{"type":"https://api.example.com/order-exists","detail":""}"#.len()
    );
    assert!(body.starts_with(r#"{"type":"https://api.example.com/order-exists""#));
    assert!(body.ends_with(r#"x"}"#));
    assert_eq!(seen.hits.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_upload_is_sent_again_with_one_boundary_under_one_key() {
    let (addr, seen) = start().await;
    let proxy = FaultProxy::start(addr, 12).await.unwrap();
    proxy.inject(Fault::CutAfterRequest);
    let form = reqwest::multipart::Form::new().text("amount", "500").part(
        "receipt",
        reqwest::multipart::Part::bytes(vec![7u8; 4096]).file_name("receipt.bin"),
    );
    let response = client(IdempotencyMiddleware::new().policy(quick()))
        .post(format!("http://{}/payments", proxy.addr()))
        .multipart(form)
        .send()
        .await
        .unwrap();
    // The retry carried the same bytes as the try that ran, so it was replayed, not
    // refused as another request under the same key.
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(response.extensions().get::<Attempts>().unwrap().replayed);
    assert_eq!(response.text().await.unwrap(), "charge-1");
    assert_eq!(seen.charges.load(Ordering::SeqCst), 1);
    let bodies = seen.bodies.lock().unwrap();
    assert!(bodies[0].windows(4096).any(|w| w.iter().all(|b| *b == 7)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_body_over_the_buffer_is_refused_before_anything_is_sent() {
    let (addr, seen) = start().await;
    let chunk = bytes::Bytes::from(vec![1u8; 64 * 1024]);
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = vec![Ok(chunk.clone()), Ok(chunk)];
    let err = client(IdempotencyMiddleware::new().buffer_streams(100 * 1024))
        .post(format!("http://{addr}/payments"))
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap_err();
    assert!(matches!(
        common::client_error(&err),
        ClientError::BodyTooLarge { limit: 102_400 }
    ));
    assert_eq!(seen.charges.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_keys_go_unquoted_and_idem_http_reads_both_forms_as_one_key() {
    let (addr, seen) = start().await;
    let url = format!("http://{addr}/payments");
    let key = IdempotencyKey::new("order-bare").unwrap();
    let quoted = client(IdempotencyMiddleware::new())
        .post(&url)
        .with_extension(key.clone())
        .body("amount=500")
        .send()
        .await
        .unwrap();
    assert_eq!(quoted.text().await.unwrap(), "charge-1");
    let bare_client = client(IdempotencyMiddleware::new().header_form(HeaderForm::Bare));
    let bare = bare_client
        .post(&url)
        .with_extension(key)
        .body("amount=500")
        .send()
        .await
        .unwrap();
    assert!(bare.extensions().get::<Attempts>().unwrap().replayed);
    assert_eq!(bare.text().await.unwrap(), "charge-1");
    assert_eq!(
        *seen.headers.lock().unwrap(),
        vec!["\"order-bare\"".to_owned()],
        "the replay never reached the handler"
    );
    let err = bare_client
        .post(&url)
        .with_extension(IdempotencyKey::new("order 7").unwrap())
        .body("amount=500")
        .send()
        .await
        .unwrap_err();
    assert!(matches!(
        common::client_error(&err),
        ClientError::KeyNotAToken
    ));
    assert_eq!(seen.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_budget_bounds_the_load_an_outage_gets() {
    let operations = 100u32;
    let policy = RetryPolicy::default()
        .backoff(Duration::from_millis(1), Duration::from_millis(2))
        .deadline(Duration::from_secs(15));
    let mut hits = Vec::new();
    for middleware in [
        IdempotencyMiddleware::new().without_retry_budget(),
        // 1 retry a second over 10 s, plus one per ten operations.
        IdempotencyMiddleware::new().retry_budget(TpsBudget::new(Duration::from_secs(10), 1, 0.1)),
    ] {
        let (addr, seen) = start().await;
        let client = client(middleware.policy(policy.clone()));
        for _ in 0..operations {
            let response = client
                .post(format!("http://{addr}/down"))
                .body("amount=500")
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
        hits.push(seen.hits.load(Ordering::SeqCst));
    }
    // Without a budget every operation takes its 5 tries; with one, the retries are at
    // most the reserve (10) plus a tenth of the operations (10).
    assert_eq!(hits[0], operations * 5);
    assert!(hits[1] <= operations + 20, "{hits:?}");
    assert!(hits[1] > operations, "some retries were allowed: {hits:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_the_budget_refuses_ends_with_the_last_error_and_the_key() {
    // A port nothing listens on: every try is a connection error.
    let closed = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    // A budget with no reserve and nothing to earn: no retry at all.
    let client = client(
        IdempotencyMiddleware::new()
            .policy(quick())
            .retry_budget(TpsBudget::new(Duration::from_secs(1), 0, 0.0)),
    );
    let err = client
        .post(format!("http://{closed}/payments"))
        .body("amount=500")
        .send()
        .await
        .unwrap_err();
    let reqwest_middleware::Error::Middleware(inner) = &err else {
        panic!("{err:?}")
    };
    match inner.downcast_ref::<ClientError>() {
        Some(ClientError::Unanswered {
            attempts,
            key,
            last,
        }) => {
            assert_eq!(*attempts, 1);
            assert_eq!(key_of(&err), Some(key));
            assert!(last.is_connect(), "{last:?}");
        }
        other => panic!("{other:?}"),
    }
}
