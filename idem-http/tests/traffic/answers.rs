//! The answers the layer adjusts: the 409's hint, headers replayed, axum's fallbacks,
//! per-route requirements, problem links and replay hooks.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post as route_post;
use http::{HeaderValue, Request, Response, StatusCode};
use idem_core::{Idempotency, MemoryStore};
use idem_http::{Body, IdempotencyLayer, KeyRequirement};
use tower::Layer;

use crate::common::{self, Effects, Server, app, client, layer, post};
use crate::support::idem;

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
