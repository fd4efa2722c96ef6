//! The proxy in front of a misbehaving HTTP/2 upstream, spoken to with the h2 crate
//! itself: a stream it refuses (`REFUSED_STREAM`) was not processed, and its key is free.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::http::{Response, StatusCode};
use common::*;
use idem_core::MemoryStore;

/// An h2c upstream that refuses the first `refuse` streams and answers 201 to the rest;
/// counts the streams it answered.
async fn refusing_upstream(refuse: usize) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&answered);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let (answered, seen) = (Arc::clone(&counted), Arc::clone(&seen));
            tokio::spawn(async move {
                let Ok(mut connection) = h2::server::handshake(socket).await else {
                    return;
                };
                while let Some(Ok((_request, mut respond))) = connection.accept().await {
                    if seen.fetch_add(1, Ordering::SeqCst) < refuse {
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                        continue;
                    }
                    answered.fetch_add(1, Ordering::SeqCst);
                    let head = Response::builder().status(201).body(()).unwrap();
                    let _ = respond.send_response(head, true);
                }
            });
        }
    });
    (addr, answered)
}

/// The proxy in front of the h2c upstream at `addr`, which does not process the first
/// stream and answers `answered` to the rest: the first try is 502 with its key
/// released, and the retry runs once, at once, then replays.
async fn released_then_run_once(addr: std::net::SocketAddr, answered: Arc<AtomicUsize>) {
    let toml = config_with(addr, "upstream_http2 = true", "");
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let url = proxy.url("/payments");

    let (status, _, body) = pay_once(&url, "a", Some("k1"), "{}").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(body.contains("upstream-refused"), "{body}");
    assert_eq!(answered.load(Ordering::SeqCst), 0);

    // Released, not held for the lease: the retry reaches the upstream at once.
    let (status, _, body) = pay_once(&url, "a", Some("k1"), "{}").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, headers, _) = pay_once(&url, "a", Some("k1"), "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(answered.load(Ordering::SeqCst), 1);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_releases_its_key_and_the_retry_runs_once() {
    let (addr, answered) = refusing_upstream(1).await;
    released_then_run_once(addr, answered).await;
}

/// An h2c upstream whose first connection reads the first stream's head and answers it
/// with `GOAWAY`, `NO_ERROR`, and `last_stream_id`, then closes it, written frame by
/// frame on the socket. With 0, a graceful shutdown that took none of the streams (RFC
/// 9113, section 6.8, says they were not processed); with 1, one that took the request
/// and then lost the connection. Later connections answer 201. Counts the streams
/// answered.
async fn going_away_upstream(last_stream_id: u8) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&answered);
    tokio::spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut preface = [0u8; 24];
            if socket.read_exact(&mut preface).await.is_err() {
                return;
            }
            // Our SETTINGS (none), then the client's frames until a HEADERS.
            let _ = socket.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await;
            for _ in 0..16 {
                let mut head = [0u8; 9];
                if socket.read_exact(&mut head).await.is_err() {
                    return;
                }
                let length =
                    usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
                let mut payload = vec![0u8; length];
                if socket.read_exact(&mut payload).await.is_err() {
                    return;
                }
                match head[3] {
                    // SETTINGS, not an ACK: acknowledged.
                    4 if head[4] & 1 == 0 => {
                        let _ = socket.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).await;
                    }
                    // HEADERS: gone away, taking no stream.
                    1 => {
                        let goaway = [
                            0,
                            0,
                            8,
                            7,
                            0,
                            0,
                            0,
                            0,
                            0,
                            0,
                            0,
                            0,
                            last_stream_id,
                            0,
                            0,
                            0,
                            0,
                        ];
                        let _ = socket.write_all(&goaway).await;
                        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                        return;
                    }
                    _ => {}
                }
            }
        });
        while let Ok((socket, _)) = listener.accept().await {
            let answered = Arc::clone(&counted);
            tokio::spawn(async move {
                let Ok(mut connection) = h2::server::handshake(socket).await else {
                    return;
                };
                while let Some(Ok((_request, mut respond))) = connection.accept().await {
                    answered.fetch_add(1, Ordering::SeqCst);
                    let head = Response::builder().status(201).body(()).unwrap();
                    let _ = respond.send_response(head, true);
                }
            });
        }
    });
    (addr, answered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_past_a_graceful_goaway_releases_its_key() {
    let (addr, answered) = going_away_upstream(0).await;
    released_then_run_once(addr, answered).await;
}

/// The same graceful `GOAWAY`, but its last stream id is the request's: the upstream
/// took it, and then closed the connection. It may have run: the key is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_a_goaway_kept_and_then_lost_holds_its_key() {
    let (addr, answered) = going_away_upstream(1).await;
    let toml = config_with(addr, "upstream_http2 = true", "");
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let url = proxy.url("/payments");
    let (status, _, body) = pay_once(&url, "a", Some("k1"), "{}").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(body.contains("upstream-broken"), "{body}");
    let (status, _, body) = pay_once(&url, "a", Some("k1"), "{}").await;
    assert_eq!(status, StatusCode::CONFLICT, "held, not run again: {body}");
    assert_eq!(answered.load(Ordering::SeqCst), 0);
    proxy.shutdown().await;
}
