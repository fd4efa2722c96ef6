//! The layer under real traffic, on a real server on 127.0.0.1: a store that holds less
//! than the layer's default, the 409's hint, headers replayed, axum's fallbacks, the
//! inner service's backpressure, handlers whose client went away, panics, and the
//! settings that adjust answers.

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::routing::post as route_post;
use common::{Effects, Server, app, client, layer, post};
use http::{HeaderValue, Request, Response, StatusCode};
use idem_core::key::StepName;
use idem_core::record::Lease;
use idem_core::store::{ClaimOutcome, ClaimRequest, RenewOutcome, WriteOutcome};
use idem_core::{Idempotency, Key, MemoryStore, Record, Store, StoreError};
use idem_http::{BODY_NOT_STORED_HEADER, Body, IdempotencyLayer, KeyRequirement};
use tower::{Layer, Service};

/// The memory store, declaring a record limit like DynamoDB's 400 000-byte item.
#[derive(Clone)]
struct Capped {
    inner: MemoryStore,
    limit: usize,
}

#[async_trait]
impl Store for Capped {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(request).await
    }
    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.inner.complete(lease, response).await
    }
    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.inner.fail(lease, response).await
    }
    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        self.inner.release(lease).await
    }
    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        self.inner.renew(lease, extend).await
    }
    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        self.inner.checkpoint(lease, step, value).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }
    fn max_record_bytes(&self) -> Option<usize> {
        Some(self.limit)
    }
}

/// Waits for the handler a client left to be moved to a task of its own (the server sees
/// the disconnect a little after the client gives up), then for it to end; both bounded.
async fn finished_after_leaving(handlers: &idem_http::Handlers) {
    for _ in 0..200 {
        if handlers.running() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::timeout(Duration::from_secs(10), handlers.wait())
        .await
        .expect("the handler ends");
}

/// A client that gives up after `after`, as a timeout layer or an impatient caller does.
fn impatient(after: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(after)
        .build()
        .unwrap()
}

/// Starts a streamed answer under `key`, reads its first chunk (bounded: 10 s) and
/// goes away.
async fn read_one_chunk_and_leave(url: &str, key: &str) {
    let mut first = client()
        .post(url)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    let chunk = tokio::time::timeout(Duration::from_secs(10), first.chunk())
        .await
        .expect("a first chunk comes")
        .unwrap();
    assert!(chunk.is_some());
}

fn idem(lease: Duration) -> Idempotency {
    Idempotency::builder(MemoryStore::new())
        .lease(lease)
        .build()
        .unwrap()
        .into_dyn()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_holds_less_than_the_default_still_replays_the_status() {
    // The layer's default (960 KiB) is over DynamoDB's item; the store's limit wins.
    let store = Capped {
        inner: MemoryStore::new(),
        limit: 400_000,
    };
    let effects = Effects::default();
    let server = Server::start(app(
        layer(Idempotency::new(store).into_dyn()),
        effects.clone(),
    ))
    .await;
    let url = server.url("/payments");
    let first = post(
        &client(),
        &url,
        Some("k-big"),
        "{}",
        &[("x-response-bytes", "500000")],
    )
    .await;
    assert_eq!((first.status, first.body.len()), (201, 500_000));
    let retry = post(&client(), &url, Some("k-big"), "{}", &[]).await;
    assert_eq!(
        retry.status, 201,
        "a payment that succeeded never looks failed: {retry:?}"
    );
    assert!(retry.replayed());
    assert_eq!(retry.header(BODY_NOT_STORED_HEADER), Some("true"));
    assert_eq!(retry.header("location"), first.header("location"));
    // Under the limit, the body is kept.
    let small = post(
        &client(),
        &url,
        Some("k-small"),
        "{}",
        &[("x-response-bytes", "300000")],
    )
    .await;
    let again = post(&client(), &url, Some("k-small"), "{}", &[]).await;
    assert_eq!((again.status, again.body.clone()), (201, small.body));
    assert_eq!(effects.runs(), 2);
}

/// The 409 a duplicate gets while a slow first request runs under `layer`.
async fn conflict_beside_a_slow_request(layer: IdempotencyLayer) -> common::Answer {
    let effects = Effects::default();
    let server = Server::start(app(layer, effects.clone())).await;
    let url = server.url("/payments");
    let slow = {
        let url = url.clone();
        tokio::spawn(async move {
            post(
                &client(),
                &url,
                Some("k-slow"),
                "{}",
                &[("x-sleep-ms", "1500")],
            )
            .await
        })
    };
    // Only once the slow request runs, so that the duplicate never claims the key first.
    effects.wait_for_runs(1).await;
    let duplicate = post(&client(), &url, Some("k-slow"), "{}", &[]).await;
    assert_eq!(slow.await.unwrap().status, 201);
    assert_eq!(effects.runs(), 1);
    duplicate
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_409_hints_a_short_wait_not_the_whole_lease() {
    let conflict = conflict_beside_a_slow_request(layer(idem(Duration::from_secs(60)))).await;
    assert_eq!(conflict.status, 409);
    assert_eq!(
        conflict.header("retry-after"),
        Some("1"),
        "not the lease's 60 s"
    );
    let longer = layer(idem(Duration::from_secs(60))).in_flight_retry_after(Duration::from_secs(5));
    let conflict = conflict_beside_a_slow_request(longer).await;
    assert_eq!(conflict.status, 409);
    assert_eq!(conflict.header("retry-after"), Some("5"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_headers_are_replayed_and_request_ids_are_not() {
    let app = Router::new()
        .route(
            "/exports",
            route_post(|| async {
                let mut response = Response::new(axum::body::Body::from("id,amount\n7,500\n"));
                *response.status_mut() = StatusCode::CREATED;
                let headers = response.headers_mut();
                headers.insert(
                    "content-disposition",
                    HeaderValue::from_static("attachment; filename=\"e.csv\""),
                );
                headers.insert(
                    "content-location",
                    HeaderValue::from_static("/exports/7.csv"),
                );
                headers.insert("x-request-id", HeaderValue::from_static("req-1"));
                response
            }),
        )
        .layer(layer(idem(Duration::from_secs(30))));
    let server = Server::start(app).await;
    let url = server.url("/exports");
    let first = post(&client(), &url, Some("k-csv"), "{}", &[]).await;
    let again = post(&client(), &url, Some("k-csv"), "{}", &[]).await;
    assert!(again.replayed());
    for name in ["content-disposition", "content-location"] {
        assert_eq!(again.header(name), first.header(name), "{name}");
        assert!(again.header(name).is_some(), "{name}");
    }
    // The first try's request id belongs to it: never handed to a retry.
    assert_eq!(first.header("x-request-id"), Some("req-1"));
    assert_eq!(again.header("x-request-id"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_fallbacks_are_left_alone_where_the_layer_can_tell() {
    // `route_layer` wraps the routes only: a typo is axum's 404, nothing claimed.
    let idem = Idempotency::new(MemoryStore::new());
    let store = idem.store().clone();
    let effects = Effects::default();
    let routes = Router::new()
        .route(
            "/payments",
            route_post(|| async { (StatusCode::CREATED, "charged") }),
        )
        .route_layer(layer(idem.into_dyn()));
    let server = Server::start(routes).await;
    let typo = server.url("/paymnets");
    assert_eq!(post(&client(), &typo, None, "{}", &[]).await.status, 404);
    assert_eq!(
        post(&client(), &typo, Some("k-typo"), "{}", &[])
            .await
            .status,
        404
    );
    assert_eq!(store.len(), 0);
    let _ = effects;

    // `Router::layer` wraps the fallback too: without a key the fallback answers as it
    // would without the layer (404, not 400 for a missing key); with one, it is
    // protected (a 404 is released, never kept); left alone entirely when asked.
    let idem = Idempotency::new(MemoryStore::new());
    let store = idem.store().clone();
    let server = Server::start(app(layer(idem.into_dyn()), Effects::default())).await;
    let typo = server.url("/paymnets");
    let keyless = post(&client(), &typo, None, "{}", &[]).await;
    assert_eq!(
        keyless.status, 404,
        "the fallback's own answer: {keyless:?}"
    );
    let keyed = post(&client(), &typo, Some("k-typo"), "{}", &[]).await;
    let again = post(&client(), &typo, Some("k-typo"), "{}", &[]).await;
    assert_eq!((keyed.status, again.status), (404, 404));
    assert!(!again.replayed(), "a 404 is never kept");
    let _ = store;
    // The routes still need their key.
    let missing = post(&client(), &server.url("/payments"), None, "{}", &[]).await;
    assert_eq!(missing.status, 400);

    // A service under `nest_service` looks like a fallback to a layer outside it (no
    // `MatchedPath`): a keyless request reaches it, a keyed one is protected. Wrapped
    // itself, it requires its key.
    let idem = Idempotency::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let nested = tower::service_fn(move |_request: Request<axum::body::Body>| {
        let counted = Arc::clone(&counted);
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            let mut response = Response::new(axum::body::Body::from("nested"));
            *response.status_mut() = StatusCode::CREATED;
            Ok::<_, Infallible>(response)
        }
    });
    let server = Server::start(
        Router::new()
            .nest_service("/svc", nested.clone())
            .layer(layer(idem.into_dyn())),
    )
    .await;
    let url = server.url("/svc/charge");
    assert_eq!(post(&client(), &url, None, "{}", &[]).await.status, 201);
    post(&client(), &url, Some("k-n"), "{}", &[]).await;
    assert!(
        post(&client(), &url, Some("k-n"), "{}", &[])
            .await
            .replayed()
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the keyless one, and the keyed one once"
    );
    let wrapped_nested = layer(Idempotency::new(MemoryStore::new()).into_dyn()).layer(
        tower::util::MapRequestLayer::new(|r: Request<Body>| r.map(axum::body::Body::new))
            .layer(nested.clone()),
    );
    let server = Server::start(Router::new().nest_service("/svc", wrapped_nested)).await;
    let missing = post(&client(), &server.url("/svc/charge"), None, "{}", &[]).await;
    assert_eq!(missing.status, 400, "wrapped itself, it requires its key");

    let idem = Idempotency::new(MemoryStore::new());
    let store = idem.store().clone();
    let effects = Effects::default();
    let server = Server::start(app(
        layer(idem.into_dyn()).leave_unmatched_routes(true),
        effects.clone(),
    ))
    .await;
    let typo = server.url("/paymnets");
    let keyless = post(&client(), &typo, None, "{}", &[]).await;
    assert_eq!(
        keyless.status, 404,
        "not 400 for a missing key: {keyless:?}"
    );
    assert_eq!(
        post(&client(), &typo, Some("k-typo"), "{}", &[])
            .await
            .status,
        404
    );
    assert_eq!(
        store.len(),
        0,
        "nothing claimed for a route that does not exist"
    );
    // Routes are still protected.
    let missing = post(&client(), &server.url("/payments"), None, "{}", &[]).await;
    assert_eq!(missing.status, 400);

    // A service the user wrapped by hand is never taken for a fallback, even mounted as
    // one: it is protected.
    let idem = Idempotency::new(MemoryStore::new());
    let store = idem.store().clone();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let forwarder = tower::service_fn(move |_request: Request<axum::body::Body>| {
        let counted = Arc::clone(&counted);
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            let mut response = Response::new(Body::from(bytes::Bytes::from_static(b"forwarded")));
            *response.status_mut() = StatusCode::CREATED;
            Ok::<_, Infallible>(response)
        }
    });
    let wrapped = layer(idem.into_dyn()).leave_unmatched_routes(true).layer(
        tower::util::MapRequestLayer::new(|r: Request<Body>| r.map(axum::body::Body::new))
            .layer(forwarder),
    );
    let server = Server::start(Router::new().fallback_service(wrapped)).await;
    let url = server.url("/anything");
    assert_eq!(post(&client(), &url, None, "{}", &[]).await.status, 400);
    post(&client(), &url, Some("k-f"), "{}", &[]).await;
    let again = post(&client(), &url, Some("k-f"), "{}", &[]).await;
    assert!(again.replayed());
    assert_eq!((runs.load(Ordering::SeqCst), store.len()), (1, 1));
}

/// A service that is ready only when told.
#[derive(Clone)]
struct Gate {
    open: Arc<AtomicBool>,
}

impl Service<Request<Body>> for Gate {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        if self.open.load(Ordering::SeqCst) {
            Poll::Ready(Ok(()))
        } else {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    fn call(&mut self, _request: Request<Body>) -> Self::Future {
        std::future::ready(Ok(Response::new(Body::from(bytes::Bytes::from_static(
            b"ok",
        )))))
    }
}

#[tokio::test]
async fn the_inner_services_backpressure_reaches_the_server() {
    let open = Arc::new(AtomicBool::new(false));
    let layer = IdempotencyLayer::new(idem(Duration::from_secs(30)), |parts| {
        Ok(parts.uri.path().to_owned())
    });
    let mut service = layer.layer(Gate {
        open: Arc::clone(&open),
    });
    let waker = std::task::Waker::noop();
    let mut cx = TaskContext::from_waker(waker);
    let ready = <_ as Service<Request<Body>>>::poll_ready(&mut service, &mut cx);
    assert!(
        ready.is_pending(),
        "not ready while the inner service is not"
    );
    open.store(true, Ordering::SeqCst);
    let ready = <_ as Service<Request<Body>>>::poll_ready(&mut service, &mut cx);
    assert!(ready.is_ready());
    let request = Request::post("/jobs")
        .header("idempotency-key", "j-1")
        .body(Body::empty())
        .unwrap();
    let response = service.call(request).await.unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_waits_for_handlers_whose_client_went_away() {
    let idem = idem(Duration::from_secs(30));
    let effects = Effects::default();
    let layer = layer(idem);
    let handlers = layer.handlers();
    let server = Server::start(app(layer, effects.clone())).await;
    let url = server.url("/payments");
    let impatient = impatient(Duration::from_millis(200));
    let gone = common::post_with(
        &impatient,
        &url,
        Some("k-gone"),
        "{}",
        &[("x-sleep-ms", "1000")],
    )
    .await;
    assert!(gone.is_err(), "the client gave up first");
    // The handler outlived its request: it is counted until it has stored its answer.
    let mut counted = false;
    for _ in 0..100 {
        if handlers.running() == 1 {
            counted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(counted, "the detached handler is tracked");
    finished_after_leaving(&handlers).await;
    assert_eq!(handlers.running(), 0);
    let retry = post(&client(), &url, Some("k-gone"), "{}", &[]).await;
    assert!(
        retry.replayed(),
        "its answer was stored before the wait ended: {retry:?}"
    );
    assert_eq!(effects.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_answers_500_and_holds_the_key() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let app = Router::new()
        .route(
            "/payments",
            route_post(move || {
                let counted = Arc::clone(&counted);
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    if counted.load(Ordering::SeqCst) > 0 {
                        panic!("the handler broke after its effect");
                    }
                    "unreachable"
                }
            }),
        )
        .layer(layer(idem(Duration::from_secs(30))));
    let server = Server::start(app).await;
    let url = server.url("/payments");
    let broke = post(&client(), &url, Some("k-panic"), "{}", &[]).await;
    assert_eq!(broke.status, 500);
    assert_eq!(broke.problem(), "handler-failed");
    let retry = post(&client(), &url, Some("k-panic"), "{}", &[]).await;
    assert_eq!(retry.status, 409, "held: the effect may have happened");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_route_requirements_problem_links_and_replay_hooks() {
    let layer = layer(idem(Duration::from_secs(30)))
        .requirement_with(|parts| {
            (parts.uri.path() == "/payments" && parts.headers.contains_key("x-exempt"))
                .then_some(KeyRequirement::Ignored)
        })
        .problem_type_base("https://docs.example.com/problems/")
        .on_replay(|response| {
            response
                .headers_mut()
                .insert("cache-status", HeaderValue::from_static("idem; hit"));
        });
    let effects = Effects::default();
    let server = Server::start(app(layer, effects.clone())).await;
    let url = server.url("/payments");
    let exempt = post(&client(), &url, None, "{}", &[("x-exempt", "1")]).await;
    assert_eq!(exempt.status, 201, "exempt from the key: {exempt:?}");
    let missing = post(&client(), &url, None, "{}", &[]).await;
    assert_eq!(missing.status, 400);
    assert_eq!(
        missing.json()["type"],
        "https://docs.example.com/problems/missing-key"
    );
    let first = post(&client(), &url, Some("k-hook"), "{}", &[]).await;
    assert_eq!(first.header("cache-status"), None);
    let again = post(&client(), &url, Some("k-hook"), "{}", &[]).await;
    assert_eq!(again.header("cache-status"), Some("idem; hit"));
    assert_eq!(effects.runs(), 2);
}

/// A body that is not ready when first polled (so the layer streams it), then gives its
/// frames at once.
struct Staggered {
    woke: bool,
    frames: std::collections::VecDeque<http_body::Frame<bytes::Bytes>>,
}

impl Staggered {
    fn new(frames: Vec<http_body::Frame<bytes::Bytes>>) -> Self {
        Self {
            woke: false,
            frames: frames.into(),
        }
    }
}

impl http_body::Body for Staggered {
    type Data = bytes::Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Infallible>>> {
        if !self.woke {
            self.woke = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(self.frames.pop_front().map(Ok))
    }
}

fn chunk(byte: u8, len: usize) -> http_body::Frame<bytes::Bytes> {
    http_body::Frame::data(bytes::Bytes::from(vec![byte; len]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_ends_as_soon_as_it_starts_reaches_the_client_and_is_kept() {
    // The head goes out and the work ends in the same poll: the frames already sent
    // still reach the client, and the record keeps them.
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let app = Router::new()
        .route(
            "/reports",
            route_post(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async {
                    let body =
                        Staggered::new(vec![chunk(b'a', 10), chunk(b'b', 10), chunk(b'c', 10)]);
                    Response::new(axum::body::Body::new(body))
                }
            }),
        )
        .layer(layer(idem(Duration::from_secs(30))));
    let server = Server::start(app).await;
    let url = server.url("/reports");
    let first = post(&client(), &url, Some("k-s"), "{}", &[]).await;
    let expected: Vec<u8> = [b'a', b'b', b'c']
        .iter()
        .flat_map(|b| vec![*b; 10])
        .collect();
    assert_eq!((first.status, first.body.to_vec()), (200, expected.clone()));
    let again = post(&client(), &url, Some("k-s"), "{}", &[]).await;
    assert!(again.replayed());
    assert_eq!(again.body.to_vec(), expected);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

fn grpc_stream(status: &'static str) -> Response<axum::body::Body> {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static(status));
    let body = Staggered::new(vec![
        chunk(b'x', 1000),
        chunk(b'y', 1000),
        chunk(b'z', 1000),
        http_body::Frame::trailers(trailers),
    ]);
    let mut response = Response::new(axum::body::Body::new(body));
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_grpc_stream_is_kept_or_held_by_the_status_in_its_trailers() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let app = Router::new()
        .route(
            "/svc/Call",
            route_post(move |headers: http::HeaderMap| {
                counted.fetch_add(1, Ordering::SeqCst);
                let status = if headers.contains_key("x-fail") {
                    "14"
                } else {
                    "0"
                };
                async move { grpc_stream(status) }
            }),
        )
        .layer(layer(idem(Duration::from_secs(30))).max_response_body(1500));
    let server = Server::start(app).await;
    let url = server.url("/svc/Call");
    // UNAVAILABLE after 3000 bytes: the call may have had its effect, the key is held.
    let failed = post(&client(), &url, Some("k-fail"), "{}", &[("x-fail", "1")]).await;
    assert_eq!(failed.body.len(), 3000, "the first client gets it whole");
    let retry = post(&client(), &url, Some("k-fail"), "{}", &[("x-fail", "1")]).await;
    assert_eq!(retry.status, 409, "held, not kept as done: {retry:?}");
    // OK after 3000 bytes: kept without the body.
    let ok = post(&client(), &url, Some("k-ok"), "{}", &[]).await;
    assert_eq!(ok.body.len(), 3000);
    let replay = post(&client(), &url, Some("k-ok"), "{}", &[]).await;
    assert!(replay.replayed());
    assert_eq!(replay.header(BODY_NOT_STORED_HEADER), Some("true"));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_stream_whose_client_left_finishes_its_key() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let layer = layer(idem(Duration::from_millis(500)));
    let handlers = layer.handlers();
    let app = Router::new()
        .route(
            "/events",
            route_post(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async {
                    let ticks = futures_util::stream::unfold(0u64, |n| async move {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        Some((
                            Ok::<_, Infallible>(http_body::Frame::data(bytes::Bytes::from(
                                format!("data: {n}\n\n"),
                            ))),
                            n + 1,
                        ))
                    });
                    let mut response = Response::new(axum::body::Body::new(
                        http_body_util::StreamBody::new(ticks),
                    ));
                    response.headers_mut().insert(
                        "content-type",
                        HeaderValue::from_static("text/event-stream"),
                    );
                    response
                }
            }),
        )
        .layer(layer);
    let server = Server::start(app).await;
    let url = server.url("/events");
    read_one_chunk_and_leave(&url, "k-endless").await;
    // Well under the limit, and never ending: once nobody reads, the key is finished.
    let mut finished = None;
    for _ in 0..200 {
        let answer = post(&client(), &url, Some("k-endless"), "{}", &[]).await;
        if answer.status != 409 {
            finished = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let finished = finished.expect("the key is finished after the client left");
    assert_eq!(finished.status, 200);
    assert!(finished.replayed());
    assert_eq!(finished.header(BODY_NOT_STORED_HEADER), Some("true"));
    tokio::time::timeout(Duration::from_secs(10), handlers.wait())
        .await
        .expect("no handler runs on for ever");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A codec that wraps every value in a 200-byte envelope.
#[derive(Debug)]
struct Envelope;

impl idem_core::Codec for Envelope {
    fn encode(
        &self,
        _: &idem_core::codec::StoredAt<'_>,
        plain: Vec<u8>,
    ) -> Result<Vec<u8>, idem_core::codec::CodecError> {
        let mut out = vec![b'#'; 200];
        out.extend_from_slice(&plain);
        Ok(out)
    }

    fn decode<'a>(
        &self,
        _: &idem_core::codec::StoredAt<'_>,
        stored: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [u8]>, idem_core::codec::CodecError> {
        Ok(std::borrow::Cow::Borrowed(
            stored.get(200..).unwrap_or_default(),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codec_that_adds_much_still_replays_a_success_as_a_success() {
    let idem = Idempotency::builder(MemoryStore::new())
        .max_response_bytes(4000)
        .codec(Envelope)
        .build()
        .unwrap()
        .into_dyn();
    let effects = Effects::default();
    let server = Server::start(app(layer(idem), effects.clone())).await;
    let url = server.url("/payments");
    let first = post(
        &client(),
        &url,
        Some("k-env"),
        "{}",
        &[("x-response-bytes", "3800")],
    )
    .await;
    assert_eq!((first.status, first.body.len()), (201, 3800));
    let retry = post(&client(), &url, Some("k-env"), "{}", &[]).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(retry.header(BODY_NOT_STORED_HEADER), Some("true"));
    let small = post(
        &client(),
        &url,
        Some("k-small"),
        "{}",
        &[("x-response-bytes", "100")],
    )
    .await;
    let again = post(&client(), &url, Some("k-small"), "{}", &[]).await;
    assert_eq!(
        again.body, small.body,
        "under the room, kept whole through the codec"
    );
    assert_eq!(effects.runs(), 2);
}

/// A service whose `call` itself panics, before any future exists.
#[derive(Clone)]
struct PanicsInCall;

impl Service<Request<Body>> for PanicsInCall {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Request<Body>) -> Self::Future {
        panic!("the handler broke in call");
    }
}

#[tokio::test]
async fn a_handler_that_panics_in_call_answers_500_and_holds_the_key() {
    use tower::ServiceExt;
    let layer = IdempotencyLayer::new(idem(Duration::from_secs(30)), |parts| {
        Ok(parts.uri.path().to_owned())
    });
    let service = layer.layer(PanicsInCall);
    let request = || {
        Request::post("/jobs")
            .header("idempotency-key", "j-panic")
            .body(Body::empty())
            .unwrap()
    };
    let broke = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(broke.status(), 500);
    let retry = service.oneshot(request()).await.unwrap();
    assert_eq!(retry.status(), 409, "held: the effect may have happened");
}

/// A streamed body: each chunk after a pause, then its end.
fn paced(chunks: &'static [&'static str], pause: Duration) -> axum::body::Body {
    let frames = futures_util::stream::unfold(0usize, move |i| async move {
        let chunk = chunks.get(i)?;
        tokio::time::sleep(pause).await;
        Some((
            Ok::<_, Infallible>(http_body::Frame::data(bytes::Bytes::from_static(
                chunk.as_bytes(),
            ))),
            i + 1,
        ))
    });
    axum::body::Body::new(http_body_util::StreamBody::new(frames))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_left_before_it_began_is_kept_whole() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let layer = layer(idem(Duration::from_secs(30)));
    let handlers = layer.handlers();
    let app = Router::new()
        .route(
            "/batches",
            route_post(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    Response::new(paced(
                        &["payout 1\n", "payout 2\n"],
                        Duration::from_millis(10),
                    ))
                }
            }),
        )
        .layer(layer);
    let server = Server::start(app).await;
    let url = server.url("/batches");
    let impatient = impatient(Duration::from_millis(150));
    assert!(
        common::post_with(&impatient, &url, Some("k-batch"), "{}", &[])
            .await
            .is_err()
    );
    finished_after_leaving(&handlers).await;
    let retry = post(&client(), &url, Some("k-batch"), "{}", &[]).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(
        &retry.body[..],
        b"payout 1\npayout 2\n",
        "the whole stream was kept"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_longer_than_its_content_length_says_is_kept_whole() {
    // hyper stops reading a body once its Content-Length is sent; that is not a client
    // going away.
    let app = Router::new()
        .route(
            "/sized",
            route_post(|| async {
                let mut response =
                    Response::new(paced(&["abc", "def", ""], Duration::from_millis(10)));
                response
                    .headers_mut()
                    .insert("content-length", HeaderValue::from_static("6"));
                response
            }),
        )
        .layer(layer(idem(Duration::from_secs(30))));
    let server = Server::start(app).await;
    let url = server.url("/sized");
    let first = post(&client(), &url, Some("k-len"), "{}", &[]).await;
    assert_eq!(&first.body[..], b"abcdef");
    let mut replay = None;
    for _ in 0..200 {
        let answer = post(&client(), &url, Some("k-len"), "{}", &[]).await;
        if answer.status != 409 {
            replay = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let replay = replay.expect("the record is finished");
    assert!(replay.replayed());
    assert_eq!(&replay.body[..], b"abcdef", "{replay:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_stream_whose_client_left_is_kept_by_its_status_not_run_again() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let layer = layer(idem(Duration::from_millis(500)));
    let handlers = layer.handlers();
    let app = Router::new()
        .route(
            "/svc/Call",
            route_post(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    grpc_stream("0")
                }
            }),
        )
        .layer(layer);
    let server = Server::start(app).await;
    let url = server.url("/svc/Call");
    let impatient = impatient(Duration::from_millis(150));
    assert!(
        common::post_with(&impatient, &url, Some("k-rpc"), "{}", &[])
            .await
            .is_err()
    );
    finished_after_leaving(&handlers).await;
    tokio::time::sleep(Duration::from_millis(600)).await; // past the lease
    let retry = post(&client(), &url, Some("k-rpc"), "{}", &[]).await;
    assert!(retry.replayed(), "kept by its grpc-status: {retry:?}");
    assert_eq!(retry.body.len(), 3000);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never run again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_stream_whose_client_left_finishes_its_key_within_a_lease() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let layer = layer(idem(Duration::from_millis(500)));
    let handlers = layer.handlers();
    let app = Router::new()
        .route(
            "/events",
            route_post(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async {
                    // One event, then nothing, for ever (a long poll, a rare event).
                    let once = futures_util::stream::once(async {
                        Ok::<_, Infallible>(http_body::Frame::data(bytes::Bytes::from_static(
                            b"data: 1\n\n",
                        )))
                    });
                    let quiet =
                        futures_util::StreamExt::chain(once, futures_util::stream::pending());
                    Response::new(axum::body::Body::new(http_body_util::StreamBody::new(
                        quiet,
                    )))
                }
            }),
        )
        .layer(layer);
    let server = Server::start(app).await;
    let url = server.url("/events");
    read_one_chunk_and_leave(&url, "k-quiet").await;
    tokio::time::timeout(Duration::from_secs(10), handlers.wait())
        .await
        .expect("a quiet stream does not hold its key for ever");
    let retry = post(&client(), &url, Some("k-quiet"), "{}", &[]).await;
    assert_eq!(retry.status, 200, "{retry:?}");
    assert_eq!(retry.header(BODY_NOT_STORED_HEADER), Some("true"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_beside_the_request_does_not_abandon_its_work() {
    use tower::ServiceExt;
    let effects = Effects::default();
    let layer = layer(idem(Duration::from_secs(30)));
    let handlers = layer.handlers();
    let app = app(layer, effects.clone());
    let request = || {
        Request::post("/payments")
            .header("idempotency-key", "k-beside")
            .header("content-type", "application/json")
            .header("x-sleep-ms", "200")
            .body(axum::body::Body::from("{}"))
            .unwrap()
    };
    // Another future of the same task panics while the request runs.
    let task = tokio::spawn({
        let app = app.clone();
        async move {
            let request = app.oneshot(request());
            let beside = async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                panic!("something else in this task broke");
            };
            tokio::join!(request, beside)
        }
    });
    assert!(task.await.is_err(), "the task panicked");
    tokio::time::timeout(Duration::from_secs(10), handlers.wait())
        .await
        .expect("the work finished elsewhere");
    let retry = app.oneshot(request()).await.unwrap();
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(effects.runs(), 1);
}

/// A codec that doubles every value (hex, as some envelopes do).
#[derive(Debug)]
struct Hex;

impl idem_core::Codec for Hex {
    fn encode(
        &self,
        _: &idem_core::codec::StoredAt<'_>,
        plain: Vec<u8>,
    ) -> Result<Vec<u8>, idem_core::codec::CodecError> {
        Ok(plain
            .iter()
            .flat_map(|b| format!("{b:02x}").into_bytes())
            .collect())
    }

    fn decode<'a>(
        &self,
        _: &idem_core::codec::StoredAt<'_>,
        stored: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [u8]>, idem_core::codec::CodecError> {
        let plain = stored
            .chunks(2)
            .map(|pair| {
                u8::from_str_radix(std::str::from_utf8(pair).unwrap_or("00"), 16).unwrap_or(0)
            })
            .collect();
        Ok(std::borrow::Cow::Owned(plain))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codec_whose_overhead_grows_still_replays_a_success_as_a_success() {
    let idem = Idempotency::builder(MemoryStore::new())
        .max_response_bytes(4000)
        .codec(Hex)
        .build()
        .unwrap()
        .into_dyn();
    let effects = Effects::default();
    let server = Server::start(app(layer(idem), effects.clone())).await;
    let url = server.url("/payments");
    post(
        &client(),
        &url,
        Some("k-hex"),
        "{}",
        &[("x-response-bytes", "2500")],
    )
    .await;
    let retry = post(&client(), &url, Some("k-hex"), "{}", &[]).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(retry.header(BODY_NOT_STORED_HEADER), Some("true"));
    let small = post(
        &client(),
        &url,
        Some("k-hex-small"),
        "{}",
        &[("x-response-bytes", "500")],
    )
    .await;
    let again = post(&client(), &url, Some("k-hex-small"), "{}", &[]).await;
    assert_eq!(again.body, small.body);
}
