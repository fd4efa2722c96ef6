//! The layer composed with the middlewares real services stack around it and inside it,
//! each placement on a real axum router over 127.0.0.1: load shedding, timeouts, request
//! ids, compression (of answers and of requests), and a body that is always ready after
//! its client left. Auth is in `handlers.rs`, routing in `routers.rs` and `traffic/`,
//! client retries in idem-client's tests.

mod common;

use std::convert::Infallible;
use std::io::{Read as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use bytes::Bytes;
use common::{Server, client, post as send};
use idem_core::{Idempotency, MemoryStore};
use idem_http::{IdempotencyLayer, scope};
use tower::ServiceBuilder;
use tower::ServiceExt as _;

fn layer(lease: Duration) -> IdempotencyLayer {
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(lease)
        .build()
        .unwrap()
        .into_dyn();
    IdempotencyLayer::new(idem, |parts| scope::operation("acct_1", parts))
}

/// Counts its runs, sleeps as long as `x-sleep-ms` says, answers 201 with the run's
/// number and the body it got.
async fn pay(
    State(runs): State<Arc<AtomicUsize>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    let sleep = headers
        .get("x-sleep-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(sleep)).await;
    (
        StatusCode::CREATED,
        format!("payment {n} of {}", String::from_utf8_lossy(&body)),
    )
}

/// Waits (bounded: 5 s) until `runs` reaches `at_least`.
async fn wait_for(runs: &AtomicUsize, at_least: usize) {
    for _ in 0..500 {
        if runs.load(Ordering::SeqCst) >= at_least {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the handler did not run {at_least} times within 5 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_load_shed_inside_the_layer_is_released_not_held() {
    let runs = Arc::new(AtomicUsize::new(0));
    // One request at a time; the next is shed (tower's `Overloaded` error) before its
    // handler runs.
    let app = Router::new()
        .route("/payments", post(pay))
        .route_layer(
            ServiceBuilder::new()
                .layer(layer(Duration::from_secs(30)))
                .load_shed()
                .concurrency_limit(1),
        )
        .with_state(Arc::clone(&runs));
    let server = Server::start(app).await;
    let url = server.url("/payments");
    let slow = {
        let url = url.clone();
        tokio::spawn(async move {
            send(
                &client(),
                &url,
                Some("k-slow"),
                "{}",
                &[("x-sleep-ms", "400")],
            )
            .await
        })
    };
    wait_for(&runs, 1).await;
    let shed = send(&client(), &url, Some("k-shed"), "{\"n\":2}", &[]).await;
    assert_eq!(shed.status, 503, "{shed:?}");
    assert!(shed.header("retry-after").is_some());
    assert!(String::from_utf8_lossy(&shed.body).contains("overloaded"));
    assert_eq!(slow.await.unwrap().status, 201);
    // Nothing ran for the shed request: its key was released, so its retry runs now
    // instead of waiting out a lease behind a 409.
    let retried = send(&client(), &url, Some("k-shed"), "{\"n\":2}", &[]).await;
    assert_eq!(retried.status, 201, "{retried:?}");
    assert!(!retried.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_outside_the_layer_lets_the_handler_finish_for_the_retry() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/payments", post(pay))
        .route_layer(layer(Duration::from_secs(30)))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::GATEWAY_TIMEOUT,
            Duration::from_millis(100),
        ))
        .with_state(Arc::clone(&runs));
    let server = Server::start(app).await;
    let url = server.url("/payments");
    let cut = send(&client(), &url, Some("k-t"), "{}", &[("x-sleep-ms", "300")]).await;
    assert_eq!(cut.status, 504);
    // The handler goes on in a task of its own and stores its answer.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let retried = send(&client(), &url, Some("k-t"), "{}", &[("x-sleep-ms", "300")]).await;
    assert_eq!(retried.status, 201, "{retried:?}");
    assert!(retried.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_inside_the_layer_holds_the_key_whatever_status_it_answers() {
    // tower-http's timeout answers 408 by default: inside the layer it cuts the handler
    // off, perhaps after its effect, so the key is held, never released for a re-run.
    for status in [StatusCode::REQUEST_TIMEOUT, StatusCode::GATEWAY_TIMEOUT] {
        let runs = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route("/payments", post(pay))
            .route_layer(
                ServiceBuilder::new()
                    .layer(layer(Duration::from_secs(30)))
                    .layer(tower_http::timeout::TimeoutLayer::with_status_code(
                        status,
                        Duration::from_millis(100),
                    )),
            )
            .with_state(Arc::clone(&runs));
        let server = Server::start(app).await;
        let url = server.url("/payments");
        let cut = send(&client(), &url, Some("k-t"), "{}", &[("x-sleep-ms", "300")]).await;
        assert_eq!(cut.status, status.as_u16());
        let retried = send(&client(), &url, Some("k-t"), "{}", &[("x-sleep-ms", "300")]).await;
        assert_eq!(
            retried.status, 409,
            "held for the lease: {status} {retried:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{status}");
    }
}

/// The routes with tower-http's request-id layers outside the idempotency layer: each
/// request gets an id (its own `x-request-id`, or a new UUID), and the response carries
/// it back.
fn with_request_ids(runs: &Arc<AtomicUsize>) -> Router {
    use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
    Router::new()
        .route("/payments", post(pay))
        .route_layer(layer(Duration::from_secs(30)))
        .layer(
            ServiceBuilder::new()
                .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
                .layer(PropagateRequestIdLayer::x_request_id()),
        )
        .with_state(Arc::clone(runs))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_carries_the_retrys_own_request_id() {
    let runs = Arc::new(AtomicUsize::new(0));
    let server = Server::start(with_request_ids(&runs)).await;
    let url = server.url("/payments");
    let first = send(
        &client(),
        &url,
        Some("k-r"),
        "{}",
        &[("x-request-id", "req-first")],
    )
    .await;
    let again = send(
        &client(),
        &url,
        Some("k-r"),
        "{}",
        &[("x-request-id", "req-retry")],
    )
    .await;
    assert!(again.replayed());
    assert_eq!(first.header("x-request-id"), Some("req-first"));
    assert_eq!(again.header("x-request-id"), Some("req-retry"));
    assert_eq!(first.body, again.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("a gzip body");
    out
}

fn gzip(bytes: &[u8], level: u32) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compression_outside_fits_each_retry_and_inside_replays_the_first_encoding() {
    // Outside, the answer is stored plain and compressed per try; inside (the documented
    // reason not to put it there), the first try's encoding is stored and replayed
    // whatever the retry accepts.
    for outside in [true, false] {
        let runs = Arc::new(AtomicUsize::new(0));
        let compression = tower_http::compression::CompressionLayer::new().gzip(true);
        let routes = Router::new().route("/payments", post(pay));
        let app = match outside {
            true => routes
                .route_layer(layer(Duration::from_secs(30)))
                .layer(compression),
            false => routes.route_layer(
                ServiceBuilder::new()
                    .layer(layer(Duration::from_secs(30)))
                    .layer(compression),
            ),
        };
        let server = Server::start(app.with_state(Arc::clone(&runs))).await;
        let url = server.url("/payments");
        let body = format!("{{\"memo\":\"{}\"}}", "a".repeat(2048));
        let accepting = |encoding: &'static str| {
            let (url, body) = (url.clone(), body.clone());
            async move {
                let headers = [("accept-encoding", encoding)];
                send(&client(), &url, Some("k-c"), &body, &headers).await
            }
        };
        let gzipped = accepting("gzip").await;
        assert_eq!(gzipped.header("content-encoding"), Some("gzip"));
        let again = accepting("identity").await;
        assert!(again.replayed());
        match outside {
            true => {
                assert_eq!(again.header("content-encoding"), None, "compressed per try");
                assert_eq!(gunzip(&gzipped.body), again.body.to_vec());
            }
            false => assert_eq!(again.header("content-encoding"), Some("gzip")),
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_requests_are_one_request_whatever_their_compressed_bytes() {
    // A retry compresses again, at another level or with another library: other bytes,
    // the same request. Both placements: tower-http's decompression outside the layer,
    // and none (the layer fingerprints what the body decodes to).
    let json = format!("{{\"amount\":500,\"memo\":\"{}\"}}", "b".repeat(4096));
    let (fast, best) = (gzip(json.as_bytes(), 1), gzip(json.as_bytes(), 9));
    assert_ne!(fast, best);
    for decompress_outside in [true, false] {
        let runs = Arc::new(AtomicUsize::new(0));
        let mut app = Router::new()
            .route("/payments", post(pay))
            .route_layer(layer(Duration::from_secs(30)))
            .with_state(Arc::clone(&runs));
        if decompress_outside {
            app = app.layer(tower_http::decompression::RequestDecompressionLayer::new());
        }
        let server = Server::start(app).await;
        let url = server.url("/payments");
        let post_gzip = |bytes: Vec<u8>| {
            client()
                .post(&url)
                .header("content-type", "application/json")
                .header("content-encoding", "gzip")
                .header("idempotency-key", "k-gz")
                .body(bytes)
                .send()
        };
        let first = post_gzip(fast.clone()).await.unwrap();
        assert_eq!(first.status(), 201, "{decompress_outside}");
        let again = post_gzip(best.clone()).await.unwrap();
        assert_eq!(again.status(), 201, "not 422: {decompress_outside}");
        assert_eq!(
            again
                .headers()
                .get("idempotent-replayed")
                .map(|v| v.as_bytes()),
            Some(&b"true"[..])
        );
        // Another request under the key is still told apart.
        let other = gzip(json.replace("500", "900").as_bytes(), 6);
        let reused = post_gzip(other).await.unwrap();
        assert_eq!(reused.status(), 422, "{decompress_outside}");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_always_ready_after_its_client_left_ends_with_the_lease() {
    // A handler that fails (500: its key is held, nothing is stored) with a body whose
    // frames are always ready, forever. Once the client is gone, the body is read on for
    // at most a lease; it must not spin inside one poll past it.
    let layer = layer(Duration::from_millis(300));
    let handlers = layer.handlers();
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(
            |_request: http::Request<idem_http::Body>| async {
                let forever =
                    futures_util::stream::repeat(Ok::<_, Infallible>(Bytes::from_static(b"x")));
                let mut response = http::Response::new(axum::body::Body::from_stream(forever));
                *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                Ok::<_, Infallible>(response)
            },
        ));
    let request = http::Request::post("/payments")
        .header("idempotency-key", "k-forever")
        .body(axum::body::Body::from("{}"))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 500);
    // The client reads the head and goes away.
    drop(response);
    tokio::time::timeout(Duration::from_secs(10), handlers.wait())
        .await
        .expect("the detached handler outlived its lease by far");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_upload_retried_with_a_new_boundary_is_one_request() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/payments", post(pay))
        .route_layer(layer(Duration::from_secs(30)))
        .with_state(Arc::clone(&runs));
    let server = Server::start(app).await;
    let url = server.url("/payments");
    let receipt = vec![0x25u8; 3000];
    // reqwest picks a random boundary per form.
    let form = reqwest::multipart::Form::new().text("amount", "500").part(
        "receipt",
        reqwest::multipart::Part::bytes(receipt.clone())
            .file_name("receipt.pdf")
            .mime_str("application/pdf")
            .unwrap(),
    );
    let first = client()
        .post(&url)
        .header("idempotency-key", "k-up")
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 201);
    // The retry, as curl writes it: its own boundary and layout, the same parts.
    let curl_style = |amount: &str| {
        let boundary = "------------------------d74496d66958873e";
        let mut body = Vec::new();
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n{amount}\r\n").as_bytes(),
        );
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"receipt\"; filename=\"receipt.pdf\"\r\nContent-Type: application/pdf\r\n\r\n").as_bytes(),
        );
        body.extend_from_slice(&receipt);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        client()
            .post(&url)
            .header("idempotency-key", "k-up")
            .header(
                "content-type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body)
            .send()
    };
    let again = curl_style("500").await.unwrap();
    assert_eq!(again.status(), 201, "not 422 for a new boundary");
    assert_eq!(
        again
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    // Another amount under the key is another request.
    assert_eq!(curl_style("900").await.unwrap().status(), 422);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// How the handler's 201 answer goes wrong, for the `FinalHead` test.
#[derive(Clone, Copy, Debug)]
enum Breaks {
    /// Its body fails at once, before the head went: without `FinalHead`, the handler
    /// failing (500).
    AtOnce,
    /// Its body sends a chunk, pauses (the head goes), then fails.
    AfterAPause,
    /// As `AfterAPause`, with `Disposition::Hold` set by the handler.
    AfterAPauseHeld,
    /// As `AfterAPause`, with `Disposition::Release` set by the handler.
    AfterAPauseReleased,
    /// As `AfterAPause`, a gRPC answer (its status is in trailers that never come).
    AfterAPauseGrpc,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_head_decides_its_key_when_the_body_breaks_off() {
    use futures_util::StreamExt as _;
    // With `FinalHead` a stored 201 is finished with its head (a retry gets it, marked,
    // and nothing runs again); a held one stays held, a gRPC answer is held whatever it
    // carries; without `FinalHead`, held.
    let cases = [
        (Breaks::AtOnce, true, Some(201)),
        (Breaks::AtOnce, false, None),
        (Breaks::AfterAPause, true, Some(201)),
        (Breaks::AfterAPause, false, None),
        (Breaks::AfterAPauseHeld, true, None),
        (Breaks::AfterAPauseReleased, true, Some(0)),
        (Breaks::AfterAPauseGrpc, true, None),
    ];
    for (breaks, final_head, replayed) in cases {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let service = ServiceBuilder::new()
            .layer(layer(Duration::from_secs(30)))
            .service(tower::service_fn(
                move |_request: http::Request<idem_http::Body>| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async move {
                        let frames: Vec<Result<Bytes, std::io::Error>> = vec![
                            Ok(Bytes::from_static(b"{\"id\":")),
                            Err(std::io::Error::other("cut")),
                        ];
                        let pause = !matches!(breaks, Breaks::AtOnce);
                        let stream =
                            futures_util::stream::iter(frames).then(move |frame| async move {
                                if pause {
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                }
                                frame
                            });
                        let mut response =
                            http::Response::new(axum::body::Body::from_stream(stream));
                        *response.status_mut() = StatusCode::CREATED;
                        if final_head {
                            response.extensions_mut().insert(idem_http::FinalHead);
                        }
                        if let Breaks::AfterAPauseHeld = breaks {
                            response
                                .extensions_mut()
                                .insert(idem_http::Disposition::Hold);
                        }
                        if let Breaks::AfterAPauseReleased = breaks {
                            response
                                .extensions_mut()
                                .insert(idem_http::Disposition::Release);
                        }
                        if let Breaks::AfterAPauseGrpc = breaks {
                            let grpc = http::HeaderValue::from_static("application/grpc");
                            response.headers_mut().insert("content-type", grpc);
                        }
                        Ok::<_, Infallible>(response)
                    }
                },
            ));
        let call = || {
            http::Request::post("/payments")
                .header("idempotency-key", "k-head")
                .body(axum::body::Body::from("{}"))
                .unwrap()
        };
        let what = format!("{breaks:?}, final head {final_head}");
        let first = service.clone().oneshot(call()).await.unwrap();
        if let (Breaks::AtOnce, false) = (breaks, final_head) {
            // A body that fails before anything was sent is the handler failing.
            assert_eq!(first.status(), 500, "{what}");
        } else {
            assert_eq!(first.status(), 201, "{what}");
            let body = http_body_util::BodyExt::collect(first.into_body()).await;
            assert!(body.is_err(), "{what}: the first client's body is cut");
        }
        let again = service.clone().oneshot(call()).await.unwrap();
        let runs_expected = match replayed {
            // Released: the retry runs the handler again.
            Some(0) => {
                assert_eq!(again.status(), 201, "{what}: {:?}", again.headers());
                2
            }
            Some(status) => {
                assert_eq!(again.status(), status, "{what}");
                assert_eq!(
                    again.headers()["idempotent-body-not-stored"],
                    "true",
                    "{what}"
                );
                1
            }
            None => {
                assert_eq!(again.status(), 409, "{what}: held");
                1
            }
        };
        assert_eq!(
            runs.load(Ordering::SeqCst),
            runs_expected,
            "{what}: {:?}",
            again.headers()
        );
    }
}
