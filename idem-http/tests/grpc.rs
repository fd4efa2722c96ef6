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
use tower::{Layer, Service as _, ServiceBuilder};

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

/// The health service behind `layer`, each call first sleeping as long as its
/// `x-delay-ms` metadata says, counted in `runs`.
async fn serve_slow(layer: IdempotencyLayer, runs: Arc<AtomicUsize>) -> (Server, HealthReporter) {
    let (reporter, health) = tonic_health::server::health_reporter();
    let slow = tower::service_fn(move |request: http::Request<idem_http::Body>| {
        let mut health = health.clone();
        let runs = Arc::clone(&runs);
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let delay = request
                .headers()
                .get("x-delay-ms")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(delay)).await;
            tower::Service::call(&mut health, request).await
        }
    });
    let app = Router::new().route_service("/grpc.health.v1.Health/Check", layer.layer(slow));
    (Server::start(app).await, reporter)
}

async fn channel(server: &Server) -> Channel {
    Endpoint::from_shared(server.url(""))
        .expect("a loopback URL")
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(20))
        .connect()
        .await
        .expect("an h2c connection to the test server")
}

fn plain_layer() -> IdempotencyLayer {
    IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| {
        Ok(parts.uri.path().to_owned())
    })
}

/// The layer's own refusals reach a tonic client as gRPC statuses it can act on: in
/// flight is UNAVAILABLE with a pushback (retry with the same key), a key reused for
/// another request is FAILED_PRECONDITION (send a new key), a missing key is
/// INVALID_ARGUMENT; each names its problem type. As problem documents, tonic read them
/// as a malformed message ("invalid compression flag"), the same INTERNAL for all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layers_refusals_are_grpc_statuses_a_retry_policy_can_tell_apart() {
    let runs = Arc::new(AtomicUsize::new(0));
    let (server, _reporter) = serve_slow(plain_layer(), Arc::clone(&runs)).await;
    let client = HealthClient::new(channel(&server).await);

    let first = {
        let mut client = client.clone();
        tokio::spawn(async move {
            let mut request = check("", "grpc-slow-1");
            request
                .metadata_mut()
                .insert("x-delay-ms", "600".parse().unwrap());
            client.check(request).await
        })
    };
    for _ in 0..200 {
        if runs.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let in_flight = client
        .clone()
        .check(check("", "grpc-slow-1"))
        .await
        .expect_err("the first call still runs");
    assert_eq!(in_flight.code(), Code::Unavailable, "{in_flight:?}");
    assert!(in_flight.message().contains("in progress"), "{in_flight:?}");
    assert_eq!(
        in_flight
            .metadata()
            .get("idem-problem-type")
            .map(|v| v.to_str().unwrap()),
        Some("tag:idem-http,2026:in-flight")
    );
    assert!(in_flight.metadata().get("grpc-retry-pushback-ms").is_some());
    first.await.unwrap().expect("the first call answers");

    let reused = client
        .clone()
        .check(check("other.Service", "grpc-slow-1"))
        .await
        .expect_err("another request under the key");
    assert_eq!(reused.code(), Code::FailedPrecondition, "{reused:?}");

    let keyless = client
        .clone()
        .check(tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        }))
        .await
        .expect_err("no key");
    assert_eq!(keyless.code(), Code::InvalidArgument, "{keyless:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A replay whose message was too large to store is never OK without its message (a
/// client would decode an empty one): ALREADY_EXISTS, the first status beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_without_its_message_says_so_as_a_grpc_status() {
    let runs = Arc::new(AtomicUsize::new(0));
    let (server, _reporter) =
        serve_slow(plain_layer().max_response_body(0), Arc::clone(&runs)).await;
    let mut client = HealthClient::new(channel(&server).await);
    client
        .check(check("", "grpc-big-1"))
        .await
        .expect("the first call gets its message");
    let again = client
        .check(check("", "grpc-big-1"))
        .await
        .expect_err("the message was not stored");
    assert_eq!(again.code(), Code::AlreadyExists, "{again:?}");
    assert_eq!(
        again
            .metadata()
            .get("idem-original-grpc-status")
            .map(|v| v.to_str().unwrap()),
        Some("0")
    );
    assert_eq!(replayed(again.metadata()), Some("true"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A gRPC request body of length-prefixed messages, sent over the real h2c channel: the
/// messages, and then the end of the request unless `hold_open`.
fn streamed_call(messages: usize, hold_open: bool) -> http::Request<tonic::body::Body> {
    // A `HealthCheckRequest` for the server's own status: every field at its default,
    // so the protobuf message is empty and only its 5-byte prefix travels.
    let encoded = bytes::Bytes::from_static(&[0, 0, 0, 0, 0]);
    let frames = futures_util::stream::iter(
        (0..messages).map(move |_| Ok::<_, tonic::Status>(http_body::Frame::data(encoded.clone()))),
    );
    let body: std::pin::Pin<Box<dyn futures_util::Stream<Item = _> + Send>> = if hold_open {
        use futures_util::StreamExt as _;
        Box::pin(frames.chain(futures_util::stream::pending()))
    } else {
        Box::pin(frames)
    };
    http::Request::post("/grpc.health.v1.Health/Check")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("idempotency-key", "grpc-stream-1")
        .body(tonic::body::Body::new(http_body_util::StreamBody::new(
            body,
        )))
        .unwrap()
}

/// A call that streams its request cannot be read whole before it runs: two messages,
/// or a first message whose request never ends (a bidirectional call waiting for the
/// answer), are refused as UNIMPLEMENTED, and nothing runs or is claimed. Waiting for the
/// end instead hung the bidirectional call; the client-streaming one ran on its first
/// message only, or got 413 past the body limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_streams_its_request_is_refused_clearly() {
    let runs = Arc::new(AtomicUsize::new(0));
    let (server, _reporter) = serve_slow(plain_layer(), Arc::clone(&runs)).await;
    for (messages, hold_open) in [(2, false), (1, true)] {
        let mut channel = channel(&server).await;
        let response = tower::ServiceExt::ready(&mut channel)
            .await
            .unwrap()
            .call(streamed_call(messages, hold_open));
        let response = tokio::time::timeout(Duration::from_secs(15), response)
            .await
            .expect("the layer answered within its grace")
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response
                .headers()
                .get("grpc-status")
                .map(|v| v.to_str().unwrap()),
            Some("12"),
            "{messages} messages, held open {hold_open}: {:?}",
            response.headers()
        );
    }
    // One message and the end: a unary call, protected and run.
    let mut channel = channel(&server).await;
    let unary = tower::ServiceExt::ready(&mut channel)
        .await
        .unwrap()
        .call(streamed_call(1, false))
        .await
        .unwrap();
    let body = http_body_util::BodyExt::collect(unary.into_body())
        .await
        .unwrap();
    assert_eq!(
        body.trailers()
            .and_then(|t| t.get("grpc-status"))
            .map(|v| v.to_str().unwrap()),
        Some("0")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// gRPC-web-text carries its messages in base64, so its body is read as bytes, not as
/// length-prefixed messages (four base64 characters read as a length were always over
/// the limit); a refusal keeps the caller's content type, which a gRPC-web client needs.
#[tokio::test]
async fn grpc_web_text_calls_are_read_as_bytes_and_refused_in_their_own_family() {
    use tower::ServiceExt as _;
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let service = plain_layer().layer(tower::service_fn(
        move |_request: http::Request<idem_http::Body>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async {
                let mut response = http::Response::new(idem_http::Body::empty());
                response
                    .headers_mut()
                    .insert("content-type", "application/grpc-web-text".parse().unwrap());
                response
                    .headers_mut()
                    .insert("grpc-status", "0".parse().unwrap());
                Ok::<_, std::convert::Infallible>(response)
            }
        },
    ));
    let call = |key: Option<&str>| {
        let mut request = http::Request::post("/pkg.Svc/Call")
            .header("content-type", "application/grpc-web-text");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request
            .body(idem_http::Body::from(bytes::Bytes::from_static(
                b"AAAAAAA=",
            )))
            .unwrap()
    };
    let answered = service.clone().oneshot(call(Some("web-1"))).await.unwrap();
    assert_eq!(answered.headers().get("grpc-status").unwrap(), "0");
    let again = service.clone().oneshot(call(Some("web-1"))).await.unwrap();
    assert_eq!(again.headers().get(REPLAYED_HEADER).unwrap(), "true");
    let refused = service.clone().oneshot(call(None)).await.unwrap();
    assert_eq!(refused.headers().get("grpc-status").unwrap(), "3");
    assert_eq!(
        refused.headers().get("content-type").unwrap(),
        "application/grpc-web-text"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A handler's own problem document reaches a gRPC caller as the same gRPC status fresh
/// and replayed (a gRPC client cannot read problem+json): the replay's status is read
/// back from the stored document.
#[tokio::test]
async fn a_handlers_own_problem_is_the_same_grpc_status_fresh_and_replayed() {
    use tower::ServiceExt as _;
    let service = plain_layer().layer(tower::service_fn(
        |_request: http::Request<idem_http::Body>| async {
            let declined =
                idem_http::Problem::new(http::StatusCode::PAYMENT_REQUIRED, "declined", "Declined");
            Ok::<_, std::convert::Infallible>(declined.into_http_response())
        },
    ));
    let call = || unary_call("/pkg.Svc/Pay", "pay-1");
    let first = service.clone().oneshot(call()).await.unwrap();
    let again = service.clone().oneshot(call()).await.unwrap();
    for answer in [&first, &again] {
        assert_eq!(answer.status(), 200);
        assert_eq!(answer.headers()["content-type"], "application/grpc");
        assert_eq!(answer.headers()["grpc-status"], "9");
        assert_eq!(answer.headers()["grpc-message"], "Declined");
        assert_eq!(
            answer.headers()["idem-problem-type"],
            "tag:idem-http,2026:declined"
        );
    }
    assert_eq!(again.headers().get(REPLAYED_HEADER).unwrap(), "true");
}

/// In shadow mode a call that streams its request reaches the service whole, as every
/// request does there; the refusal is only counted.
#[tokio::test]
async fn shadow_mode_passes_a_streaming_call_on_whole() {
    use tower::ServiceExt as _;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&seen);
    let service = plain_layer().shadow(true).layer(tower::service_fn(
        move |request: http::Request<idem_http::Body>| {
            let kept = Arc::clone(&kept);
            async move {
                let body = request.into_body().collect().await.unwrap().to_bytes();
                kept.lock().unwrap().push(body.to_vec());
                Ok::<_, std::convert::Infallible>(http::Response::new(idem_http::Body::empty()))
            }
        },
    ));
    let two_messages = [[0u8, 0, 0, 0, 1, 9], [0u8, 0, 0, 0, 1, 8]].concat();
    let request = http::Request::post("/pkg.Svc/Upload")
        .header("content-type", "application/grpc")
        .header("idempotency-key", "up-1")
        .body(idem_http::Body::from(bytes::Bytes::from(
            two_messages.clone(),
        )))
        .unwrap();
    let answer = service.oneshot(request).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert!(answer.headers().get("grpc-status").is_none(), "not refused");
    assert_eq!(*seen.lock().unwrap(), vec![two_messages]);
}

/// A trailers-only answer carries its status in its headers, which a replay keeps
/// (`grpc-*`) with the stored ones; a header of the service's own that is not on the
/// list (a session, an internal id) is the first call's alone, as for HTTP.
#[tokio::test]
async fn a_trailers_only_replay_keeps_its_status_and_only_the_listed_headers() {
    use tower::ServiceExt as _;
    let service = plain_layer().layer(tower::service_fn(
        |_request: http::Request<idem_http::Body>| async {
            let answer = http::Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", "6")
                .header("grpc-message", "already there")
                .header("x-internal-id", "node-7")
                .body(idem_http::Body::from(bytes::Bytes::new()))
                .unwrap();
            Ok::<_, std::convert::Infallible>(answer)
        },
    ));
    let call = || unary_call("/pkg.Svc/Create", "create-1");
    let first = service.clone().oneshot(call()).await.unwrap();
    assert_eq!(first.headers()["x-internal-id"], "node-7");
    let again = service.clone().oneshot(call()).await.unwrap();
    assert_eq!(again.headers().get(REPLAYED_HEADER).unwrap(), "true");
    assert_eq!(again.headers()["grpc-status"], "6");
    assert_eq!(again.headers()["grpc-message"], "already there");
    assert_eq!(again.headers().get("x-internal-id"), None);
}

/// A unary gRPC call of an empty message to `path`, under `key`.
fn unary_call(path: &str, key: &str) -> http::Request<idem_http::Body> {
    http::Request::post(path)
        .header("content-type", "application/grpc")
        .header("idempotency-key", key)
        .body(idem_http::Body::from(bytes::Bytes::from_static(&[
            0, 0, 0, 0, 0,
        ])))
        .unwrap()
}
