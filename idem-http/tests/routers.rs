//! The layer inside real axum routers, placed every way a user places it: on the outer
//! router, inside `nest`, with `route_layer`, under `nest_service`. `nest` strips its
//! prefix from the URI the inner router sees; the scope and the fingerprint must still
//! tell `/tenants/a/payments` from `/tenants/b/payments` (and `/v1` from `/v2`), or one
//! tenant's retry replays the other's answer and its handler never runs.

mod common;

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use common::{Effects, Server, client, post as send};
use idem_core::{Idempotency, MemoryStore};
use idem_http::{IdempotencyLayer, scope};

fn layer() -> IdempotencyLayer {
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
        .into_dyn();
    IdempotencyLayer::new(idem, |parts| scope::operation("acct_1", parts))
}

/// A layer whose scope leaves the path out: only the fingerprint tells the routes apart
/// (the same key on another route is a reused key: 422).
fn layer_scoped_by_account_alone() -> IdempotencyLayer {
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
        .into_dyn();
    IdempotencyLayer::new(idem, |_parts| Ok("acct_1".to_owned()))
}

async fn pay(State(effects): State<Effects>) -> String {
    let n = effects
        .runs
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        + 1;
    format!("{{\"payment\":{n}}}")
}

/// The tenant's routes, without the layer.
fn tenant(effects: &Effects) -> Router {
    Router::new()
        .route("/payments", post(pay))
        .with_state(effects.clone())
}

#[derive(Clone, Copy, Debug)]
enum Placement {
    /// `.layer` on the router that nests the tenants.
    Outer,
    /// `.layer` on each nested router.
    InsideNest,
    /// `.route_layer` on each nested router.
    RouteLayer,
    /// Each tenant a router with the layer, mounted with `nest_service`.
    NestService,
}

const PLACEMENTS: [Placement; 4] = [
    Placement::Outer,
    Placement::InsideNest,
    Placement::RouteLayer,
    Placement::NestService,
];

fn app(
    placement: Placement,
    prefixes: [&str; 2],
    layer: &IdempotencyLayer,
    effects: &Effects,
) -> Router {
    let mut app = Router::new();
    for prefix in prefixes {
        app = match placement {
            Placement::Outer => app.nest(prefix, tenant(effects)),
            Placement::InsideNest => app.nest(prefix, tenant(effects).layer(layer.clone())),
            Placement::RouteLayer => app.nest(prefix, tenant(effects).route_layer(layer.clone())),
            Placement::NestService => {
                app.nest_service(prefix, tenant(effects).layer(layer.clone()))
            }
        };
    }
    match placement {
        Placement::Outer => app.layer(layer.clone()),
        _ => app,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_routes_keep_their_own_answers_wherever_the_layer_is() {
    for prefixes in [["/tenants/a", "/tenants/b"], ["/v1", "/v2"]] {
        for placement in PLACEMENTS {
            let effects = Effects::default();
            let server = Server::start(app(placement, prefixes, &layer(), &effects)).await;
            let (a, b) = (
                server.url(&format!("{}/payments", prefixes[0])),
                server.url(&format!("{}/payments", prefixes[1])),
            );
            let first = send(&client(), &a, Some("same-key"), "{}", &[]).await;
            let other = send(&client(), &b, Some("same-key"), "{}", &[]).await;
            assert_eq!(
                (first.status, other.status),
                (200, 200),
                "{placement:?} {prefixes:?}"
            );
            assert!(
                !other.replayed(),
                "{placement:?} {prefixes:?}: {} got {}'s answer",
                prefixes[1],
                prefixes[0]
            );
            assert_ne!(first.body, other.body, "{placement:?} {prefixes:?}");
            let again = send(&client(), &a, Some("same-key"), "{}", &[]).await;
            assert!(again.replayed(), "{placement:?} {prefixes:?}");
            assert_eq!(again.body, first.body, "{placement:?} {prefixes:?}");
            assert_eq!(effects.runs(), 2, "{placement:?} {prefixes:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_on_another_nested_route_is_refused() {
    for placement in PLACEMENTS {
        let effects = Effects::default();
        let layer = layer_scoped_by_account_alone();
        let server = Server::start(app(placement, ["/v1", "/v2"], &layer, &effects)).await;
        let first = send(&client(), &server.url("/v1/payments"), Some("k"), "{}", &[]).await;
        let other = send(&client(), &server.url("/v2/payments"), Some("k"), "{}", &[]).await;
        assert_eq!(first.status, 200, "{placement:?}");
        assert_eq!(other.status, 422, "{placement:?}: {:?}", other.body);
        assert_eq!(effects.runs(), 1, "{placement:?}");
    }
}

#[test]
fn the_path_is_the_one_the_client_sent() {
    let (mut parts, ()) = http::Request::post("/payments")
        .body(())
        .unwrap()
        .into_parts();
    assert_eq!(scope::path(&parts), "/payments");
    parts.extensions.insert(axum::extract::OriginalUri(
        "/tenants/a/payments?x=1".parse().unwrap(),
    ));
    assert_eq!(scope::path(&parts), "/tenants/a/payments");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nest_with_a_path_parameter_keeps_each_tenant_apart() {
    // One nest serves every tenant: `/tenants/{tenant}`, the layer inside it.
    let effects = Effects::default();
    let app = Router::new().nest("/tenants/{tenant}", tenant(&effects).layer(layer()));
    let server = Server::start(app).await;
    let a = send(
        &client(),
        &server.url("/tenants/a/payments"),
        Some("k"),
        "{}",
        &[],
    )
    .await;
    let b = send(
        &client(),
        &server.url("/tenants/b/payments"),
        Some("k"),
        "{}",
        &[],
    )
    .await;
    assert!(!b.replayed(), "b got a's answer");
    assert_ne!(a.body, b.body);
    assert_eq!(effects.runs(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_around_the_whole_router_sees_the_whole_path() {
    // As a tower layer around the router (no `OriginalUri` yet): the URI is the client's.
    let effects = Effects::default();
    let router = Router::new()
        .nest("/v1", tenant(&effects))
        .nest("/v2", tenant(&effects));
    let app = tower::ServiceBuilder::new()
        .map_response(|response: http::Response<idem_http::Body>| {
            response.map(axum::body::Body::new)
        })
        .layer(layer())
        .service(router);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = tokio::spawn(async move {
        axum::serve(listener, tower::make::Shared::new(app))
            .await
            .unwrap();
    });
    let url = |path: &str| format!("http://{addr}{path}");
    let v1 = send(&client(), &url("/v1/payments"), Some("k"), "{}", &[]).await;
    let v2 = send(&client(), &url("/v2/payments"), Some("k"), "{}", &[]).await;
    assert_eq!((v1.status, v2.status), (200, 200));
    assert!(!v2.replayed(), "v2 got v1's answer");
    assert_eq!(effects.runs(), 2);
    served.abort();
}
