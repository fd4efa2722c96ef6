//! The inner service: its backpressure, handlers whose client went away and a graceful
//! shutdown, and panics in or beside a handler.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use axum::Router;
use axum::routing::post as route_post;
use http::{Request, Response};
use idem_http::{Body, IdempotencyLayer};
use tower::{Layer, Service};

use crate::common::{self, Effects, Server, app, client, layer, post};
use crate::support::{finished_after_leaving, idem, impatient};

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
    assert_eq!(handlers.orphaned(), 1, "and counted as its client's gone");
    finished_after_leaving(&handlers).await;
    assert_eq!((handlers.running(), handlers.orphaned()), (0, 0));
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
