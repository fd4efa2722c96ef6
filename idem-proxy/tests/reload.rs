//! Reloading the configuration while serving: the routes change between two requests of
//! one keep-alive connection, a request in flight finishes on the routes it began on,
//! and a file that does not build, or changes what needs a restart, changes nothing.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use idem_core::MemoryStore;
use idem_proxy::{Config, Proxy, ProxyError, Reloader};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A configuration file of this test's own, removed when dropped.
struct File(PathBuf);

impl File {
    fn new(name: &str, toml: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("idem-reload-{}-{name}.toml", std::process::id()));
        std::fs::write(&path, toml).unwrap();
        Self(path)
    }

    fn write(&self, toml: &str) {
        std::fs::write(&self.0, toml).unwrap();
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The test configuration on loopback port 0, and `extra` after its routes.
fn toml(upstream: SocketAddr, extra: &str) -> String {
    config_with(
        upstream,
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"",
        extra,
    )
}

async fn start(file: &File) -> (SocketAddr, Reloader, tokio::sync::oneshot::Sender<()>) {
    let (addr, reloader, stop, _) = start_on(file, MemoryStore::new()).await;
    (addr, reloader, stop)
}

/// [`start`] on `store`, with the task that runs the proxy until it has shut down.
async fn start_on(
    file: &File,
    store: MemoryStore,
) -> (
    SocketAddr,
    Reloader,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), ProxyError>>,
) {
    let config = Config::load(&file.0).unwrap();
    let proxy = Proxy::bind(config, &file.0, Arc::new(store)).await.unwrap();
    let (addr, reloader) = (proxy.local_addr(), proxy.reloader());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(proxy.run(async move {
        let _ = stopped.await;
    }));
    (addr, reloader, stop, running)
}

/// Sends a keyed `POST` on an open HTTP/1.1 connection and reads its answer whole (by its
/// `Content-Length`): the status and the head.
async fn post(
    connection: &mut TcpStream,
    addr: SocketAddr,
    path: &str,
    key: &str,
) -> (u16, String) {
    let body = "{}";
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nx-account-id: acct_1\r\nidempotency-key: {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    connection.write_all(request.as_bytes()).await.unwrap();
    let mut read = Vec::new();
    let mut buf = [0u8; 4096];
    let answer = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let n = connection.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "the connection closed: {}",
                String::from_utf8_lossy(&read)
            );
            read.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&read).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let head = text[..end].to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .expect("answers with a length");
                if read.len() >= end + 4 + length {
                    return head;
                }
            }
        }
    })
    .await
    .expect("answered within 10 s");
    let status = answer[9..12].parse().unwrap();
    (status, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_swaps_the_routes_between_two_requests_of_one_connection() {
    let up = Upstream::default();
    let upstream = upstream(up.clone()).await;
    let file = File::new("swap", &toml(upstream, ""));
    let (addr, reloader, stop) = start(&file).await;
    let mut connection = TcpStream::connect(addr).await.unwrap();

    // `/free` is on no route: a keyed request passes unprotected, and runs each time.
    assert_eq!(post(&mut connection, addr, "/free", "k-free").await.0, 201);
    assert_eq!(post(&mut connection, addr, "/free", "k-free").await.0, 201);
    assert_eq!(up.runs("k-free"), 2);

    // A request in flight on the old routes while the file changes and is reloaded.
    *up.delay.lock().unwrap() = Duration::from_millis(600);
    let mut other = TcpStream::connect(addr).await.unwrap();
    let arrived = up.arrived.notified();
    let in_flight = tokio::spawn(async move {
        let answer = post(&mut other, addr, "/payments", "k-flight").await;
        (answer, other)
    });
    arrived.await;
    file.write(&toml(
        upstream,
        "[[routes]]\nmethods = [\"POST\"]\npath = \"/free\"",
    ));
    let reloaded = reloader
        .reload_file(|_| {})
        .await
        .expect("the new file builds");
    assert_eq!(reloaded.routes, 2);
    let ((status, _), mut other) = in_flight.await.unwrap();
    assert_eq!(status, 201, "the request in flight finished");
    *up.delay.lock().unwrap() = Duration::ZERO;

    // The same connections, the new routes: `/free` is protected now.
    assert_eq!(post(&mut connection, addr, "/free", "k-new").await.0, 201);
    let (status, head) = post(&mut connection, addr, "/free", "k-new").await;
    assert_eq!(status, 201);
    assert!(head.contains("idempotent-replayed: true"), "{head}");
    assert_eq!(up.runs("k-new"), 1);
    // And the old ones still hold what they stored.
    let (status, head) = post(&mut other, addr, "/payments", "k-flight").await;
    assert_eq!(status, 201);
    assert!(head.contains("idempotent-replayed: true"), "{head}");
    assert_eq!(up.runs("k-flight"), 1);
    let _ = stop.send(());
}

/// Whether a reload's error is the expected one.
type Refusal = fn(&ProxyError) -> bool;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_does_not_build_or_needs_a_restart_changes_nothing() {
    let up = Upstream::default();
    let upstream = upstream(up.clone()).await;
    let file = File::new("refused", &toml(upstream, ""));
    let (addr, reloader, stop) = start(&file).await;
    let mut connection = TcpStream::connect(addr).await.unwrap();

    let refusals: [(String, Refusal); 4] = [
        ("upstream = 5".to_owned(), |err| {
            matches!(err, ProxyError::Route(_))
        }),
        (
            // Two routes that cannot be told apart.
            toml(
                upstream,
                "[[routes]]\nmethods = [\"POST\"]\npath = \"/payments\"",
            ),
            |err| matches!(err, ProxyError::Route(_)),
        ),
        (
            toml(upstream, "").replace("listen = \"127.0.0.1:0\"", "listen = \"127.0.0.1:1\""),
            |err| matches!(err, ProxyError::NeedsRestart { setting: "listen" }),
        ),
        (
            format!("max_concurrent_requests = 7\n{}", toml(upstream, "")),
            |err| {
                matches!(
                    err,
                    ProxyError::NeedsRestart {
                        setting: "client limits"
                    }
                )
            },
        ),
    ];
    for (n, (text, expected)) in refusals.into_iter().enumerate() {
        file.write(&text);
        let err = reloader.reload_file(|_| {}).await.expect_err("refused");
        assert!(expected(&err), "{err:?}");
        // Still the running configuration, on the same connection.
        let key = format!("k-{n}");
        assert_eq!(post(&mut connection, addr, "/payments", &key).await.0, 201);
        let (_, head) = post(&mut connection, addr, "/payments", &key).await;
        assert!(head.contains("idempotent-replayed: true"), "{err}: {head}");
    }
    let _ = stop.send(());
}

/// A request running on routes two reloads replaced, whose client goes away: its handler
/// goes on in the background, counted, and a shutdown waits for it to store its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_waits_for_handlers_of_routes_replaced_twice() {
    let up = Upstream::default();
    let upstream = upstream(up.clone()).await;
    let file = File::new("retired", &toml(upstream, ""));
    let store = MemoryStore::new();
    let (addr, reloader, stop, running) = start_on(&file, store.clone()).await;
    *up.delay.lock().unwrap() = Duration::from_millis(1200);

    let arrived = up.arrived.notified();
    let impatient = tokio::spawn(async move {
        reqwest::Client::builder()
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap()
            .post(format!("http://{addr}/payments"))
            .header("x-account-id", "acct_1")
            .header("idempotency-key", "k-orphan")
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
    });
    arrived.await;
    for _ in 0..2 {
        reloader
            .reload_file(|_| {})
            .await
            .expect("the same file builds");
    }
    assert!(
        impatient.await.unwrap().is_err(),
        "the client went away first"
    );
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("shut down within its grace")
        .unwrap()
        .unwrap();
    // Stored before the shutdown ended: a replica on the same store replays it.
    let (addr, _, stop, _) = start_on(&file, store).await;
    let mut connection = TcpStream::connect(addr).await.unwrap();
    let (status, head) = post(&mut connection, addr, "/payments", "k-orphan").await;
    assert_eq!(status, 201, "{head}");
    assert!(head.contains("idempotent-replayed: true"), "{head}");
    assert_eq!(up.runs("k-orphan"), 1);
    let _ = stop.send(());
}
