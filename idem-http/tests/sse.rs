//! Server-sent events through the layer, over a real loopback connection: the first
//! client gets each event as the handler sends it, a retry after the end replays the
//! whole stream, and an endless stream over the replay limit keeps flowing to the first
//! client while a retry is told at once that its body was not stored.

mod common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::routing::post;
use bytes::{Bytes, BytesMut};
use common::{Server, client};
use futures_util::Stream;
use futures_util::stream;
use idem_core::{Idempotency, MemoryStore};
use idem_http::{IdempotencyLayer, REPLAYED_HEADER};
use tokio::sync::Notify;
use tokio::time::timeout;

/// How long the test waits for anything the server should send: a bound, so that a
/// broken layer fails the test instead of hanging it, not a speed check.
const BOUND: Duration = Duration::from_secs(10);

/// The header a replay carries when the original body was over the replay limit.
const BODY_NOT_STORED: &str = "idempotent-body-not-stored";

#[derive(Clone, Default)]
struct Handler {
    /// Times the handler ran.
    runs: Arc<AtomicUsize>,
    /// Released by the test: the second event waits for it.
    second: Arc<Notify>,
}

impl Handler {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

/// One event, then (once the test says so) a second, then the end.
async fn two_events(
    State(handler): State<Handler>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    handler.runs.fetch_add(1, Ordering::SeqCst);
    let events = stream::unfold(0, move |sent| {
        let second = Arc::clone(&handler.second);
        async move {
            match sent {
                0 => Some((Ok(Event::default().event("progress").data("one")), 1)),
                1 => {
                    second.notified().await;
                    Some((Ok(Event::default().event("done").data("two")), 2))
                }
                _ => None,
            }
        }
    });
    Sse::new(events)
}

/// An event every 2 ms, forever: about 100 bytes each.
async fn endless(
    State(handler): State<Handler>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    handler.runs.fetch_add(1, Ordering::SeqCst);
    let events = stream::unfold(0u64, |n| async move {
        tokio::time::sleep(Duration::from_millis(2)).await;
        Some((
            Ok(Event::default().id(n.to_string()).data(format!("{n:0>80}"))),
            n + 1,
        ))
    });
    Sse::new(events)
}

/// The handlers behind the layer (`Some` replay limit), or not.
async fn server(max_response_body: Option<usize>) -> (Server, Handler) {
    let handler = Handler::default();
    let app = Router::new()
        .route("/events", post(two_events))
        .route("/endless", post(endless));
    let app = match max_response_body {
        Some(limit) => app.layer(
            IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| {
                Ok(parts.uri.path().to_owned())
            })
            .max_response_body(limit),
        ),
        None => app,
    };
    (
        Server::start(app.with_state(handler.clone())).await,
        handler,
    )
}

/// The first event reaches the client before the handler sends the second, or the test
/// fails (and releases the second, so that the handler ends).
async fn first_event(server: &Server, handler: &Handler, key: &str) -> (reqwest::Response, Bytes) {
    let first = timeout(BOUND, async {
        let mut response = client()
            .post(server.url("/events"))
            .header("idempotency-key", key)
            .send()
            .await
            .expect("a response");
        let chunk = response.chunk().await.expect("the body reads");
        (response, chunk)
    })
    .await;
    let Ok((response, Some(chunk))) = first else {
        handler.second.notify_one();
        panic!(
            "the first event did not reach the client within {BOUND:?}, before the second was released"
        );
    };
    (response, chunk)
}

async fn send(server: &Server, path: &str, key: &str) -> reqwest::Response {
    timeout(
        BOUND,
        client()
            .post(server.url(path))
            .header("idempotency-key", key)
            .send(),
    )
    .await
    .unwrap_or_else(|_| panic!("POST {path} ({key}): no response head within {BOUND:?}"))
    .expect("a response")
}

/// The next chunk of `response`'s body, within the bound.
async fn next_chunk(response: &mut reqwest::Response, what: &str) -> Option<Bytes> {
    timeout(BOUND, response.chunk())
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {BOUND:?}"))
        .expect("the body reads")
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

/// The control: without the layer, the first event comes before the second is released.
#[tokio::test]
async fn without_the_layer_the_first_event_comes_first() {
    let (server, handler) = server(None).await;
    let (mut response, chunk) = first_event(&server, &handler, "sse-1").await;
    assert!(
        String::from_utf8_lossy(&chunk).contains("data: one"),
        "{chunk:?}"
    );
    handler.second.notify_one();
    while next_chunk(&mut response, "the rest of the stream")
        .await
        .is_some()
    {}
    assert_eq!(handler.runs(), 1);
}

#[tokio::test]
async fn events_reach_the_first_client_as_they_come_and_a_retry_replays_the_stream() {
    let (server, handler) = server(Some(idem_http::DEFAULT_MAX_RESPONSE_BODY)).await;

    // The handler holds the second event back until the test releases it, so the
    // first event can only arrive now if the layer streams.
    let (mut first, chunk) = first_event(&server, &handler, "sse-1").await;
    assert_eq!(first.status(), 200);
    assert_eq!(header(&first, "content-type"), Some("text/event-stream"));
    assert_eq!(header(&first, REPLAYED_HEADER), None);
    let mut whole = BytesMut::from(&chunk[..]);
    assert!(
        String::from_utf8_lossy(&whole).contains("data: one"),
        "{whole:?}"
    );
    assert!(
        !String::from_utf8_lossy(&whole).contains("data: two"),
        "the second event was not released yet: {whole:?}"
    );

    handler.second.notify_one();
    while let Some(chunk) = next_chunk(&mut first, "the rest of the stream").await {
        whole.extend_from_slice(&chunk);
    }
    let whole = whole.freeze();
    let text = String::from_utf8_lossy(&whole);
    assert!(text.contains("event: progress\ndata: one\n\n"), "{text:?}");
    assert!(text.ends_with("event: done\ndata: two\n\n"), "{text:?}");

    let mut again = send(&server, "/events", "sse-1").await;
    assert_eq!(again.status(), 200);
    assert_eq!(header(&again, REPLAYED_HEADER), Some("true"));
    assert_eq!(header(&again, "content-type"), Some("text/event-stream"));
    let mut replayed = BytesMut::new();
    while let Some(chunk) = next_chunk(&mut again, "the replay").await {
        replayed.extend_from_slice(&chunk);
    }
    assert_eq!(
        replayed.freeze(),
        whole,
        "the replay is the whole stream, byte for byte"
    );
    assert_eq!(handler.runs(), 1, "the handler ran once");
}

#[tokio::test]
async fn an_endless_stream_over_the_limit_keeps_flowing_and_a_retry_gets_no_body() {
    const LIMIT: usize = 4096;
    let (server, handler) = server(Some(LIMIT)).await;

    let mut first = send(&server, "/endless", "sse-endless").await;
    assert_eq!(first.status(), 200);
    let mut received = 0;
    while received <= 4 * LIMIT {
        let chunk = next_chunk(&mut first, "the endless stream")
            .await
            .expect("an endless stream does not end");
        received += chunk.len();
    }

    // The first stream is still going: the retry gets the original status, no body, and
    // the headers saying it is a replay whose body was not stored.
    let again = send(&server, "/endless", "sse-endless").await;
    assert_eq!(again.status(), 200, "the original status");
    assert_eq!(header(&again, REPLAYED_HEADER), Some("true"));
    assert_eq!(header(&again, BODY_NOT_STORED), Some("true"));
    let body = timeout(BOUND, again.bytes())
        .await
        .unwrap_or_else(|_| panic!("the retry's body did not end within {BOUND:?}"))
        .expect("the body reads");
    assert!(body.is_empty(), "an empty body: {body:?}");

    // And the first client still receives.
    let more = next_chunk(&mut first, "the endless stream after the retry")
        .await
        .expect("an endless stream does not end");
    assert!(!more.is_empty());
    assert_eq!(handler.runs(), 1, "the handler ran once");
    drop(first);
}
