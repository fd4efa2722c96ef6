//! The upstream: unreachable or silent, behind a path prefix, on HTTP/2, and answers
//! over the stored limit, framed two ways, or broken off after their head.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use idem_core::{MemoryStore, Store};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_releases_the_key_and_a_silent_one_holds_it() {
    // Nothing listens on the upstream's port: 502, and the key is free for the retry.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = free.local_addr().unwrap();
    drop(free);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let unreachable = proxy(&config(dead, ""), Arc::clone(&store)).await;
    let first = pay_once(&unreachable.url("/payments"), "acct_1", Some("k3"), "{}").await;
    assert_eq!(first.0, StatusCode::BAD_GATEWAY, "{first:?}");
    assert!(first.2.contains("upstream-unreachable"), "{first:?}");
    unreachable.shutdown().await;

    // The same store, the upstream now up: the retry runs.
    let up = Upstream::default();
    let live = proxy(
        &config(upstream(up.clone()).await, "lease = \"3s\""),
        Arc::clone(&store),
    )
    .await;
    let retry = pay_once(&live.url("/payments"), "acct_1", Some("k3"), "{}").await;
    assert_eq!(retry.0, StatusCode::CREATED, "{retry:?}");
    assert_eq!(up.runs("k3"), 1);

    // An upstream slower than upstream_timeout (2 s): 504, and the key is held, since
    // the payment may have happened; a retry within the lease is 409.
    *up.delay.lock().unwrap() = Duration::from_millis(2500);
    let slow = pay_once(&live.url("/payments"), "acct_1", Some("k4"), "{}").await;
    assert_eq!(slow.0, StatusCode::GATEWAY_TIMEOUT, "{slow:?}");
    *up.delay.lock().unwrap() = Duration::ZERO;
    // Held for the lease (3 s from the last heartbeat): the retry at once is 409.
    let held = pay_once(&live.url("/payments"), "acct_1", Some("k4"), "{}").await;
    assert_eq!(held.0, StatusCode::CONFLICT, "{held:?}");
    assert!(held.1.contains_key("retry-after"));
    // Once the lease is over, a retry takes over and runs it (this upstream dropped the
    // first run when the proxy hung up; one that finished it would be asked again, under
    // the same key, which is why the lease should cover the upstream's longest call).
    tokio::time::sleep(Duration::from_millis(3300)).await;
    let taken_over = pay_once(&live.url("/payments"), "acct_1", Some("k4"), "{}").await;
    assert_eq!(taken_over.0, StatusCode::CREATED, "{taken_over:?}");
    live.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_path_prefix_is_kept() {
    let up = Upstream::default();
    let addr = upstream(up.clone()).await;
    let toml = config(addr, "").replace(
        &format!("upstream = \"http://{addr}\""),
        &format!("upstream = \"http://{addr}/v1/\""),
    );
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let paid = pay_once(&proxy.url("/payments"), "acct_1", Some("k8"), "{}").await;
    assert_eq!(paid.0, StatusCode::CREATED, "{paid:?}");
    assert_eq!(up.runs("k8"), 1);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_upstream_is_spoken_to_without_upgrade() {
    let up = Upstream::default();
    let addr = upstream(up.clone()).await;
    let toml = config(addr, "").replace(
        "upstream_timeout = \"2s\"",
        "upstream_timeout = \"2s\"\nupstream_http2 = true",
    );
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let first = pay_once(&proxy.url("/payments"), "acct_1", Some("k12"), "{}").await;
    assert_eq!(first.0, StatusCode::CREATED, "{first:?}");
    let retry = pay_once(&proxy.url("/payments"), "acct_1", Some("k12"), "{}").await;
    assert_eq!(retry.2, first.2);
    assert_eq!(up.runs("k12"), 1);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_stored_limit_streams_whole_and_is_replayed_without_its_body() {
    // 2 MiB, over the route's 64 KiB limit.
    let big = Router::new().route(
        "/export",
        post(|| async { (StatusCode::CREATED, "x".repeat(2 << 20)) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, big).await });
    let toml = format!(
        r#"
        upstream = "http://{addr}"
        [[routes]]
        methods = ["POST"]
        path = "/export"
        scope = {{ header = "x-account-id" }}
        max_response_body = 65536
        "#
    );
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let first = pay_once(&proxy.url("/export"), "acct_1", Some("k13"), "{}").await;
    assert_eq!(first.0, StatusCode::CREATED);
    assert_eq!(first.2.len(), 2 << 20, "the whole body reached the client");
    let retry = pay_once(&proxy.url("/export"), "acct_1", Some("k13"), "{}").await;
    assert_eq!(retry.0, StatusCode::CREATED);
    assert_eq!(retry.1[idem_http::BODY_NOT_STORED_HEADER], "true");
    assert!(retry.2.is_empty());
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_framed_two_ways_reaches_the_client_framed_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // An upstream that says Content-Length: 5 and sends a chunked body of 256 KiB.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let chunk = "y".repeat(64 << 10);
                let mut answer = String::from(
                    "HTTP/1.1 201 Created\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
                );
                for _ in 0..4 {
                    answer.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
                }
                answer.push_str("0\r\n\r\n");
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    let proxy = proxy(&config(addr, ""), Arc::new(MemoryStore::new())).await;
    let first = pay_once(&proxy.url("/payments"), "acct_1", Some("k19"), "{}").await;
    assert_eq!(first.0, StatusCode::CREATED, "{:?}", first.1);
    assert_eq!(
        first.2.len(),
        256 << 10,
        "the whole body, as the chunks framed it"
    );
    if let Some(length) = first.1.get("content-length") {
        assert_eq!(length, "262144", "never the upstream's wrong length");
    }
    let retry = pay_once(&proxy.url("/payments"), "acct_1", Some("k19"), "{}").await;
    assert_eq!(retry.2.len(), 256 << 10);
    assert_eq!(retry.1["idempotent-replayed"], "true");
    proxy.shutdown().await;
}

/// How the raw upstream ends its answer after the head.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// `Content-Length: 100`, 7 bytes, then the connection closes.
    ShortThenClose,
    /// Chunked: one chunk, then the connection closes before the last chunk.
    ChunkThenClose,
    /// `Content-Length: 100`, 7 bytes, then nothing, the connection held open.
    ShortThenStall,
    /// Chunked: one chunk, then nothing, the connection held open.
    ChunkThenStall,
}

/// A raw HTTP/1.1 upstream on 127.0.0.1 that answers every request with a 201 head and a
/// body that does not end as its head says; it counts the requests it read.
async fn breaking_upstream(ending: Ending) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&requests);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let counted = Arc::clone(&counted);
            tokio::spawn(async move {
                let mut read = Vec::new();
                let mut buf = [0u8; 4096];
                // The head, and the body its Content-Length announces.
                loop {
                    let Ok(n) = socket.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    read.extend_from_slice(&buf[..n]);
                    let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&read[..end]).to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if read.len() >= end + 4 + length {
                        break;
                    }
                }
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let answer: &[u8] = match ending {
                    Ending::ShortThenClose | Ending::ShortThenStall => {
                        b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"id\":7"
                    }
                    Ending::ChunkThenClose | Ending::ChunkThenStall => {
                        b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n7\r\n{\"id\":7\r\n"
                    }
                };
                let _ = socket.write_all(answer).await;
                if let Ending::ShortThenStall | Ending::ChunkThenStall = ending {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
            });
        }
    });
    (addr, requests)
}

/// The promise at the edge: once the upstream's 201 head has arrived, the request ran.
/// A body that then breaks off (or does not finish in time) finishes the key with that
/// status, without the body; a retry gets it, marked, and never reaches the upstream
/// again. The key was held before, and forwarded again after the lease: two executions
/// of a request the proxy saw succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_whose_body_breaks_off_after_its_head_is_never_run_again() {
    for ending in [
        Ending::ShortThenClose,
        Ending::ChunkThenClose,
        Ending::ShortThenStall,
        Ending::ChunkThenStall,
    ] {
        let (addr, requests) = breaking_upstream(ending).await;
        let proxy = proxy(
            &config(addr, "lease = \"2s\""),
            Arc::new(MemoryStore::new()),
        )
        .await;
        let url = proxy.url("/payments");
        let send = || {
            client()
                .post(&url)
                .header("x-account-id", "acct_1")
                .header("content-type", "application/json")
                .header("idempotency-key", "k-broken")
                .body("{}")
                .send()
        };
        // The client's connection is cut: after the head, or before it reached the
        // client (hyper holds a head back until the body's first bytes).
        if let Ok(first) = send().await {
            assert_eq!(first.status().as_u16(), 201, "{ending:?}");
            assert!(first.bytes().await.is_err(), "{ending:?}: the body is cut");
        }
        // The cut comes once the key is finished: a retry it prompts at once is a replay,
        // not 409.
        let at_once = send().await.expect("the retry is answered");
        assert_eq!(
            at_once.headers()["idempotent-replayed"],
            "true",
            "{ending:?}"
        );
        // Past the lease: a held key would be taken over and forwarded again here.
        tokio::time::sleep(Duration::from_millis(2200)).await;
        let again = send().await.expect("the retry is answered");
        assert_eq!(again.status().as_u16(), 201, "{ending:?}");
        assert_eq!(again.headers()["idempotent-replayed"], "true", "{ending:?}");
        assert_eq!(
            again.headers()["idempotent-body-not-stored"],
            "true",
            "{ending:?}"
        );
        assert_eq!(
            requests.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "{ending:?}: the upstream ran it once"
        );
        proxy.shutdown().await;
    }
}

/// `max_response_body` above the driver's own 1 MiB: a 1.5 MiB answer is replayed whole.
/// The driver's cap was never raised, so such answers replayed with an empty body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_up_to_max_response_body_are_replayed_whole_past_a_mebibyte() {
    let (up, proxy) = started("max_request_body = 4194304\nmax_response_body = 4194304").await;
    let url = proxy.url("/payments");
    // The upstream echoes the request (within axum's 2 MiB default): a 1.5 MiB body
    // makes a 1.5 MiB answer.
    let body = format!("{{\"memo\":\"{}\"}}", "m".repeat(1536 * 1024));
    let first = pay_once(&url, "acct_1", Some("k-big"), &body).await;
    assert_eq!(first.0, StatusCode::CREATED, "{:?}", first.1);
    assert!(first.2.len() > 1536 * 1024);
    let again = pay_once(&url, "acct_1", Some("k-big"), &body).await;
    assert_eq!(again.1["idempotent-replayed"], "true");
    assert!(
        !again.1.contains_key("idempotent-body-not-stored"),
        "{:?}",
        again.1
    );
    assert_eq!(again.2, first.2, "the whole answer, replayed");
    assert_eq!(up.runs("k-big"), 1);
    proxy.shutdown().await;
}
