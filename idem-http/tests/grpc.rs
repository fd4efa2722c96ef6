//! A tonic gRPC service (the standard health check, its code generated in tonic-health)
//! behind the layer, served over h2c on 127.0.0.1 and called with tonic's own client:
//! the gRPC status and message (in the trailers for OK, in the headers of a trailers-only
//! answer for NOT_FOUND) reach the first caller and every retry, and the service runs once
//! per key.
//!
//! tonic's client takes an HTTP 200 without trailers for OK (other gRPC clients call it
//! an error), so the client's channel is wrapped to see the raw HTTP/2 answer: where
//! `grpc-status` arrived, in the headers or in the trailers.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use common::Server;
use http::{HeaderMap, HeaderName};
use http_body_util::BodyExt;
use idem_core::{Idempotency, MemoryStore};
use idem_http::{DEFAULT_STORED_HEADERS, IdempotencyLayer, REPLAYED_HEADER};
use tonic::Code;
use tonic::metadata::MetadataMap;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::HealthReporter;
use tower::util::BoxCloneService;
use tower::{Layer, ServiceBuilder};

/// The client's channel, its answers watched.
type Watched = BoxCloneService<
    http::Request<tonic::body::Body>,
    http::Response<tonic::body::Body>,
    tonic::transport::Error,
>;

/// The last raw answer the client got: its headers, and its trailers if any came.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<(HeaderMap, Option<HeaderMap>)>>);

impl Seen {
    fn headers(&self) -> HeaderMap {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .clone()
    }

    fn trailers(&self) -> Option<HeaderMap> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .clone()
    }

    /// `channel`, recording each answer's headers and trailers here.
    fn watch(&self, channel: Channel) -> Watched {
        let seen = self.clone();
        let service = ServiceBuilder::new()
            .map_response(move |response: http::Response<tonic::body::Body>| {
                *seen.0.lock().unwrap_or_else(PoisonError::into_inner) =
                    (response.headers().clone(), None);
                let seen = seen.clone();
                response.map(|body| {
                    tonic::body::Body::new(body.map_frame(move |frame| {
                        if let Some(trailers) = frame.trailers_ref() {
                            seen.0.lock().unwrap_or_else(PoisonError::into_inner).1 =
                                Some(trailers.clone());
                        }
                        frame
                    }))
                })
            })
            .service(channel);
        BoxCloneService::new(service)
    }
}

/// The health service behind the layer, and how many times a request reached it.
struct Grpc {
    server: Server,
    runs: Arc<AtomicUsize>,
    // Kept alive for the test's length: it owns the statuses the service reports.
    _reporter: HealthReporter,
}

impl Grpc {
    /// The health service behind the layer.
    async fn start() -> Self {
        Self::serve(true).await
    }

    /// The health service, behind the layer or not.
    async fn serve(protected: bool) -> Self {
        let (reporter, health) = tonic_health::server::health_reporter();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = {
            let runs = Arc::clone(&runs);
            ServiceBuilder::new()
                .map_request(move |request: http::Request<idem_http::Body>| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    request
                })
                .service(health)
        };
        // A gRPC call is a POST, which the default methods protect; the key travels in
        // the request metadata, which is HTTP/2 headers. A trailers-only answer (any
        // non-OK status) carries grpc-status and grpc-message in its headers, so they are
        // stored beside the defaults, or a replay would lose its status.
        let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| {
            Ok(parts.uri.path().to_owned())
        })
        .stored_headers(DEFAULT_STORED_HEADERS.into_iter().chain([
            HeaderName::from_static("grpc-status"),
            HeaderName::from_static("grpc-message"),
            HeaderName::from_static("grpc-status-details-bin"),
        ]));
        let route = "/grpc.health.v1.Health/Check";
        let app = if protected {
            Router::new().route_service(route, layer.layer(counted))
        } else {
            let unprotected = ServiceBuilder::new()
                .map_request(|request: http::Request<axum::body::Body>| {
                    request.map(idem_http::Body::new)
                })
                .service(counted);
            Router::new().route_service(route, unprotected)
        };
        Self {
            server: Server::start(app).await,
            runs,
            _reporter: reporter,
        }
    }

    async fn client(&self, seen: &Seen) -> HealthClient<Watched> {
        let channel = Endpoint::from_shared(self.server.url(""))
            .expect("a loopback URL")
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("an h2c connection to the test server");
        HealthClient::new(seen.watch(channel))
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

/// A health check of `service` with the idempotency key `key` in its metadata.
fn check(service: &str, key: &str) -> tonic::Request<HealthCheckRequest> {
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: service.to_owned(),
    });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().expect("an ASCII key"));
    request
}

fn replayed(metadata: &MetadataMap) -> Option<&str> {
    metadata
        .get(REPLAYED_HEADER)
        .and_then(|value| value.to_str().ok())
}

fn grpc_status(headers: Option<&HeaderMap>) -> Option<&str> {
    headers?.get("grpc-status")?.to_str().ok()
}

/// The control: without the layer, the watched channel sees OK in the trailers.
#[tokio::test]
async fn without_the_layer_ok_is_in_the_trailers() {
    let grpc = Grpc::serve(false).await;
    let seen = Seen::default();
    let mut client = grpc.client(&seen).await;
    client
        .check(check("", "grpc-ok-1"))
        .await
        .expect("the call answers OK");
    assert_eq!(grpc_status(seen.trailers().as_ref()), Some("0"));
    assert_eq!(grpc_status(Some(&seen.headers())), None);
}

/// OK is in the trailers (`grpc-status: 0` after the message): the first caller and the
/// retry both get the message and the status.
#[tokio::test]
async fn an_ok_call_keeps_its_trailers_fresh_and_replayed() {
    let grpc = Grpc::start().await;
    let seen = Seen::default();
    let mut client = grpc.client(&seen).await;
    let serving = HealthCheckResponse {
        status: ServingStatus::Serving as i32,
    };

    let first = client
        .check(check("", "grpc-ok-1"))
        .await
        .expect("the first call answers OK (grpc-status 0 in its trailers)");
    assert_eq!(first.get_ref(), &serving);
    assert_eq!(
        replayed(first.metadata()),
        None,
        "the first answer is fresh"
    );
    assert_eq!(
        grpc_status(seen.trailers().as_ref()),
        Some("0"),
        "the first answer ends with its trailers (headers {:?})",
        seen.headers()
    );

    let again = client
        .check(check("", "grpc-ok-1"))
        .await
        .expect("the retry answers OK too (the stored trailers replayed)");
    assert_eq!(again.get_ref(), &serving);
    assert_eq!(replayed(again.metadata()), Some("true"));
    assert_eq!(
        grpc_status(seen.trailers().as_ref()),
        Some("0"),
        "the replay ends with the stored trailers (headers {:?})",
        seen.headers()
    );
    assert_eq!(grpc.runs(), 1, "the service ran once for the key");

    // Another key is another call.
    let other = client
        .check(check("", "grpc-ok-2"))
        .await
        .expect("another key's call answers OK");
    assert_eq!(other.get_ref(), &serving);
    assert_eq!(replayed(other.metadata()), None);
    assert_eq!(grpc.runs(), 2, "the service ran once per key");
}

/// NOT_FOUND is a trailers-only answer: HTTP 200, grpc-status and grpc-message in the
/// headers, no body. The layer's status policy sees the 200 and stores it.
#[tokio::test]
async fn a_not_found_call_keeps_its_status_fresh_and_replayed() {
    let grpc = Grpc::start().await;
    let seen = Seen::default();
    let mut client = grpc.client(&seen).await;

    let first = client
        .check(check("no.such.Service", "grpc-nf-1"))
        .await
        .expect_err("an unknown service is NOT_FOUND");
    assert_eq!(first.code(), Code::NotFound, "{first:?}");
    assert_eq!(first.message(), "service not registered");
    assert_eq!(
        replayed(first.metadata()),
        None,
        "the first answer is fresh"
    );

    let again = client
        .check(check("no.such.Service", "grpc-nf-1"))
        .await
        .expect_err("the retry is NOT_FOUND too");
    assert_eq!(again.code(), Code::NotFound, "{again:?}");
    assert_eq!(again.message(), "service not registered");
    assert_eq!(replayed(again.metadata()), Some("true"));
    assert_eq!(
        grpc_status(Some(&seen.headers())),
        Some("5"),
        "the replay is trailers-only, as the first answer"
    );
    assert_eq!(grpc.runs(), 1, "the service ran once for the key");
}
