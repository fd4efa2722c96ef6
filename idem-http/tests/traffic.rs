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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_409_hints_a_short_wait_not_the_whole_lease() {
    let effects = Effects::default();
    let server = Server::start(app(layer(idem(Duration::from_secs(60))), effects.clone())).await;
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
    let mut conflict = None;
    for _ in 0..200 {
        let answer = post(&client(), &url, Some("k-slow"), "{}", &[]).await;
        if answer.status == 409 {
            conflict = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let conflict = conflict.expect("a duplicate while the first runs is 409");
    assert_eq!(
        conflict.header("retry-after"),
        Some("1"),
        "not the lease's 60 s"
    );
    assert_eq!(slow.await.unwrap().status, 201);

    let longer = Server::start(app(
        layer(idem(Duration::from_secs(60))).in_flight_retry_after(Duration::from_secs(5)),
        Effects::default(),
    ))
    .await;
    let url = longer.url("/payments");
    let first = {
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
    for _ in 0..200 {
        let answer = post(&client(), &url, Some("k-slow"), "{}", &[]).await;
        if answer.status == 409 {
            assert_eq!(answer.header("retry-after"), Some("5"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(first.await.unwrap().status, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_headers_and_request_ids_are_replayed() {
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
    for name in ["content-disposition", "content-location", "x-request-id"] {
        assert_eq!(again.header(name), first.header(name), "{name}");
        assert!(again.header(name).is_some(), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_fallbacks_are_left_alone() {
    let idem = Idempotency::new(MemoryStore::new());
    let store = idem.store().clone();
    let effects = Effects::default();
    let server = Server::start(app(layer(idem.into_dyn()), effects.clone())).await;
    let typo = server.url("/paymnets");
    let keyless = post(&client(), &typo, None, "{}", &[]).await;
    assert_eq!(
        keyless.status, 404,
        "not 400 for a missing key: {keyless:?}"
    );
    let keyed = post(&client(), &typo, Some("k-typo"), "{}", &[]).await;
    assert_eq!(keyed.status, 404);
    assert!(!keyed.replayed());
    assert_eq!(
        store.len(),
        0,
        "no 404 is kept for a route that does not exist"
    );
    // Routes are still protected.
    let missing = post(&client(), &server.url("/payments"), None, "{}", &[]).await;
    assert_eq!(missing.status, 400);

    // A fallback that does real work asks to be protected.
    let idem = Idempotency::new(MemoryStore::new());
    let store = idem.store().clone();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let forwarding = Router::new()
        .fallback(move || {
            let counted = Arc::clone(&counted);
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                (StatusCode::CREATED, "forwarded")
            }
        })
        .layer(layer(idem.into_dyn()).protect_unmatched_routes(true));
    let server = Server::start(forwarding).await;
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
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
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
    tokio::time::timeout(Duration::from_secs(10), handlers.wait())
        .await
        .expect("the handler ends");
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
