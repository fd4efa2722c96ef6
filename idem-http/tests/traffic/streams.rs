//! Streamed answers: streams that end at once or never, gRPC streams kept by their
//! status, and streams whose client left.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use axum::Router;
use axum::routing::post as route_post;
use http::{HeaderValue, Response};
use idem_http::{BODY_NOT_STORED_HEADER, GRPC_ORIGINAL_STATUS_HEADER};

use crate::common::{self, Server, client, layer, post};
use crate::support::{finished_after_leaving, idem, impatient, read_one_chunk_and_leave};

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

    /// The same frames, ready from the first poll (so the layer reads them whole before
    /// the head, up to its bound).
    fn ready(frames: Vec<http_body::Frame<bytes::Bytes>>) -> Self {
        Self {
            woke: true,
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
    grpc_answer(status, Staggered::new)
}

/// A gRPC answer of 3 000 bytes (x, y, z) and `status` in its trailers, its frames in the
/// body `body` makes of them.
fn grpc_answer(
    status: &'static str,
    body: fn(Vec<http_body::Frame<bytes::Bytes>>) -> Staggered,
) -> Response<axum::body::Body> {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static(status));
    let body = body(vec![
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
                let chosen = headers.contains_key("x-store");
                async move {
                    let mut response = grpc_stream(status);
                    if chosen {
                        response
                            .extensions_mut()
                            .insert(idem_http::Disposition::Store);
                    }
                    response
                }
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
    assert_eq!(replay.header(GRPC_ORIGINAL_STATUS_HEADER), Some("0"));
    // UNAVAILABLE, but the handler chose to store it: the handler decided, so the key is
    // finished as soon as the body passes the limit, as for any answer, before its status
    // comes, and the record holds no first status.
    let stored = [("x-fail", "1"), ("x-store", "1")];
    let chosen = post(&client(), &url, Some("k-chosen"), "{}", &stored).await;
    assert_eq!(chosen.body.len(), 3000);
    let replay = post(&client(), &url, Some("k-chosen"), "{}", &stored).await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.header(BODY_NOT_STORED_HEADER), Some("true"));
    assert_eq!(replay.header(GRPC_ORIGINAL_STATUS_HEADER), None);
    assert_eq!(replay.header("grpc-status"), Some("6"));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
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

/// A body too large to store finishes its key without it, then streams on to the client
/// still reading; a client that leaves stops it, however long the body would run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_past_the_limit_streams_on_and_stops_when_its_client_leaves() {
    let layer = layer(idem(Duration::from_secs(30))).max_response_body(1500);
    let handlers = layer.handlers();
    let app = Router::new()
        .route(
            "/export",
            route_post(|headers: http::HeaderMap| async move {
                let endless = headers.contains_key("x-endless");
                let frames = futures_util::stream::unfold(0u64, move |n| async move {
                    if !endless && n == 6 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    Some((
                        Ok::<_, Infallible>(http_body::Frame::data(bytes::Bytes::from(vec![
                            b'a';
                            1000
                        ]))),
                        n + 1,
                    ))
                });
                Response::new(axum::body::Body::new(http_body_util::StreamBody::new(
                    frames,
                )))
            }),
        )
        .layer(layer);
    let server = Server::start(app).await;
    let url = server.url("/export");
    let whole = post(&client(), &url, Some("k-export"), "{}", &[]).await;
    assert_eq!(whole.body.len(), 6000, "the whole body, past the limit");
    let replay = post(&client(), &url, Some("k-export"), "{}", &[]).await;
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.header(BODY_NOT_STORED_HEADER), Some("true"));
    // An endless body: read past the limit (the key is finished by then), then leave.
    let mut endless = client()
        .post(&url)
        .header("idempotency-key", "k-endless")
        .header("content-type", "application/json")
        .header("x-endless", "1")
        .body("{}")
        .send()
        .await
        .unwrap();
    let mut read = 0;
    while read < 3000 {
        let chunk = tokio::time::timeout(Duration::from_secs(10), endless.chunk())
            .await
            .expect("the body streams")
            .unwrap()
            .expect("an endless body");
        read += chunk.len();
    }
    drop(endless);
    tokio::time::timeout(Duration::from_secs(10), handlers.wait())
        .await
        .expect("the rest stops with its client");
}

/// A body whose frames are always ready: `frames` data frames of `len` bytes each, then
/// its trailers; counts the frames it made.
struct AlwaysReady {
    made: Arc<AtomicUsize>,
    len: usize,
    frames: usize,
    trailers: Option<http::HeaderMap>,
}

impl http_body::Body for AlwaysReady {
    type Data = bytes::Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Infallible>>> {
        if self.made.load(Ordering::SeqCst) == self.frames {
            return Poll::Ready(
                self.trailers
                    .take()
                    .map(|t| Ok(http_body::Frame::trailers(t))),
            );
        }
        self.made.fetch_add(1, Ordering::SeqCst);
        Poll::Ready(Some(Ok(http_body::Frame::data(bytes::Bytes::from(vec![
            b'a';
            self.len
        ])))))
    }
}

/// A router whose `POST /ready` answers an [`AlwaysReady`] body made by `body`.
fn always_ready(
    layer: idem_http::IdempotencyLayer,
    body: impl Fn() -> AlwaysReady + Clone + Send + Sync + 'static,
) -> Router {
    Router::new()
        .route(
            "/ready",
            route_post(move || {
                let body = body.clone();
                async move { Response::new(axum::body::Body::new(body())) }
            }),
        )
        .layer(layer)
}

fn ready_request(key: &str) -> http::Request<axum::body::Body> {
    http::Request::post("/ready")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(axum::body::Body::from("{}"))
        .unwrap()
}

/// The head goes out once 1 024 frames of a ready body are read, or more than the
/// response limit or 64 KiB (whichever is larger), whichever comes first: a body whose
/// frames are always ready is neither held in memory nor read without end before its
/// client hears anything. The client here never reads the body: the frames read are
/// those before the head, then the rest waits for the client (eight in flight, the
/// ninth waiting to be sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_body_is_read_at_most_64_kib_or_1024_frames_before_its_head_goes_out() {
    use tower::ServiceExt as _;
    // Empty frames never fill 64 KiB, and are stored whole; 10 000-byte frames pass 64 KiB
    // at the 7th (never totalling exactly 64 KiB), or a limit of 100 000 at the 11th, and
    // are too large to store either way. Past the limit the key is finished and the rest
    // read by another task, so the count goes on to the ninth meanwhile.
    let cases: [(usize, usize, usize, std::ops::RangeInclusive<usize>, bool); 3] = [
        (0, 2_000, 1000, 1024..=1024, true),
        (10_000, 2_000, 1000, 7..=9, false),
        (10_000, 2_000, 100_000, 11..=11, false),
    ];
    for (len, frames, limit, read_with_head, whole) in cases {
        let layer = layer(idem(Duration::from_secs(30))).max_response_body(limit);
        let handlers = layer.handlers();
        let made = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&made);
        let app = always_ready(layer, move || AlwaysReady {
            made: Arc::clone(&counted),
            len,
            frames,
            trailers: None,
        });
        let key = format!("k-ready-{len}-{limit}");
        let head = tokio::time::timeout(
            Duration::from_secs(10),
            app.clone().oneshot(ready_request(&key)),
        )
        .await
        .expect("the head goes out")
        .unwrap();
        assert_eq!(head.status(), 200);
        let read = made.load(Ordering::SeqCst);
        assert!(
            read_with_head.contains(&read),
            "{read} frames of {len} bytes read with the head out (limit {limit}), not {read_with_head:?}"
        );
        // The client leaves: a body that fits is read on to its end for the record; one
        // too large (its key finished already) stops.
        drop(head);
        tokio::time::timeout(Duration::from_secs(10), handlers.wait())
            .await
            .expect("the handler ends");
        assert_eq!(made.load(Ordering::SeqCst) == frames, whole);
        let replay = app.oneshot(ready_request(&key)).await.unwrap();
        assert_eq!(
            replay
                .headers()
                .get(idem_http::REPLAYED_HEADER)
                .map(|v| v.as_bytes()),
            Some(&b"true"[..])
        );
        assert_eq!(
            !replay.headers().contains_key(BODY_NOT_STORED_HEADER),
            whole
        );
    }
}

/// A ready body of exactly 64 KiB is answered whole, its length told; a byte more and it
/// streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_body_of_64_kib_is_answered_whole_and_a_byte_more_streams() {
    use http_body::Body as _;
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;
    for extra in [0, 1] {
        let app = Router::new()
            .route(
                "/ready",
                route_post(move || async move {
                    let mut frames: Vec<_> = (0..8).map(|_| chunk(b'a', 8192)).collect();
                    if extra > 0 {
                        frames.push(chunk(b'b', extra));
                    }
                    Response::new(axum::body::Body::new(Staggered::ready(frames)))
                }),
            )
            .layer(layer(idem(Duration::from_secs(30))).max_response_body(1000));
        let head = tokio::time::timeout(Duration::from_secs(10), app.oneshot(ready_request("k")))
            .await
            .expect("the head goes out")
            .unwrap();
        let told = head.body().size_hint().exact();
        let body = head.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), 65_536 + extra);
        assert_eq!(
            told,
            (extra == 0).then_some(65_536),
            "{extra} byte(s) past 64 KiB"
        );
    }
}

/// Trailers go with the body: a body too large to store is stored without its trailers,
/// whether it was read whole before its head (under 64 KiB) or streamed past its room;
/// its client gets them either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_too_large_to_store_is_stored_without_its_trailers_however_it_came() {
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-checksum", HeaderValue::from_static("abc"));
    // 30 000 bytes are read whole before the head; 100 000 pass 64 KiB and stream.
    for frames in [3, 10] {
        let app = always_ready(
            layer(idem(Duration::from_secs(30))).max_response_body(1000),
            {
                let trailers = trailers.clone();
                move || AlwaysReady {
                    made: Arc::new(AtomicUsize::new(0)),
                    len: 10_000,
                    frames,
                    trailers: Some(trailers.clone()),
                }
            },
        );
        let key = format!("k-trailers-{frames}");
        let first = app.clone().oneshot(ready_request(&key)).await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(10), first.into_body().collect())
            .await
            .expect("the body ends")
            .unwrap();
        assert_eq!(first.trailers(), Some(&trailers), "the client gets them");
        assert_eq!(first.to_bytes().len(), frames * 10_000);
        let replay = app.oneshot(ready_request(&key)).await.unwrap();
        assert_eq!(
            replay
                .headers()
                .get(BODY_NOT_STORED_HEADER)
                .map(|v| v.as_bytes()),
            Some(&b"true"[..]),
            "{frames} frames"
        );
        let replay = replay.into_body().collect().await.unwrap();
        assert_eq!(
            replay.trailers(),
            None,
            "{frames} frames: stored without them"
        );
        assert!(replay.to_bytes().is_empty());
    }
}

/// A body of exactly the response limit is stored whole, whether it was ready at once or
/// streamed; a byte more and it is stored without its body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_exactly_at_the_limit_is_stored_whole_and_a_byte_more_is_not() {
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;
    for streamed in [false, true] {
        for extra in [0, 1] {
            let app = Router::new()
                .route(
                    "/ready",
                    route_post(move || async move {
                        let frames =
                            vec![chunk(b'a', 500), chunk(b'b', 500), chunk(b'c', 500 + extra)];
                        match streamed {
                            true => Response::new(axum::body::Body::new(Staggered::new(frames))),
                            false => Response::new(axum::body::Body::new(Staggered::ready(frames))),
                        }
                    }),
                )
                .layer(layer(idem(Duration::from_secs(30))).max_response_body(1500));
            let what = format!("streamed {streamed}, {extra} byte(s) past the limit");
            let first = app.clone().oneshot(ready_request("k-limit")).await.unwrap();
            let first = tokio::time::timeout(Duration::from_secs(10), first.into_body().collect())
                .await
                .expect("the body ends")
                .unwrap()
                .to_bytes();
            assert_eq!(first.len(), 1500 + extra, "{what}");
            let replay = app.oneshot(ready_request("k-limit")).await.unwrap();
            assert_eq!(
                replay.headers().contains_key(BODY_NOT_STORED_HEADER),
                extra > 0,
                "{what}"
            );
            let replayed = replay.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(
                replayed,
                if extra == 0 {
                    first
                } else {
                    bytes::Bytes::new()
                },
                "{what}"
            );
        }
    }
}

/// A gRPC answer read whole before its head: stored whole with its trailers when it fits;
/// too large, stored with its status when its status decides, and without it (as when it
/// streams past the limit) when its handler chose to store it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_grpc_answer_keeps_its_status_as_a_streamed_one_does() {
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;
    for (limit, chosen, original) in [
        (1 << 20, false, None),
        (1500, false, Some("0")),
        (1500, true, None),
    ] {
        let app = Router::new()
            .route(
                "/svc/Call",
                route_post(move || async move {
                    let mut response = grpc_answer("0", Staggered::ready);
                    if chosen {
                        response
                            .extensions_mut()
                            .insert(idem_http::Disposition::Store);
                    }
                    response
                }),
            )
            .layer(layer(idem(Duration::from_secs(30))).max_response_body(limit));
        let call = || {
            http::Request::post("/svc/Call")
                .header("idempotency-key", "k-ready-grpc")
                .header("content-type", "application/grpc")
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let what = format!("limit {limit}, chosen {chosen}");
        let first = app.clone().oneshot(call()).await.unwrap();
        let first = first.into_body().collect().await.unwrap();
        assert_eq!(
            first
                .trailers()
                .and_then(|t| t.get("grpc-status"))
                .map(|v| v.as_bytes()),
            Some(&b"0"[..]),
            "{what}"
        );
        let replay = app.oneshot(call()).await.unwrap();
        assert_eq!(
            replay
                .headers()
                .get(idem_http::REPLAYED_HEADER)
                .map(|v| v.as_bytes()),
            Some(&b"true"[..]),
            "{what}"
        );
        let told = replay
            .headers()
            .get(GRPC_ORIGINAL_STATUS_HEADER)
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(told.as_deref(), original, "{what}");
        if limit < 3000 {
            // Stored without its message: ALREADY_EXISTS, and said so.
            assert_eq!(replay.headers()["grpc-status"], "6", "{what}");
            assert_eq!(replay.headers()[BODY_NOT_STORED_HEADER], "true", "{what}");
        }
        let replay = replay.into_body().collect().await.unwrap();
        if limit > 3000 {
            // Stored whole: the same bytes, in order, and the same trailers.
            assert_eq!(
                replay
                    .trailers()
                    .and_then(|t| t.get("grpc-status"))
                    .map(|v| v.as_bytes()),
                Some(&b"0"[..])
            );
            let expected: Vec<u8> = [b'x', b'y', b'z']
                .iter()
                .flat_map(|b| vec![*b; 1000])
                .collect();
            assert_eq!(replay.to_bytes(), expected);
        }
    }
}
