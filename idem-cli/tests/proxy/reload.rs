//! SIGHUP: the routes reloaded without dropping a connection, traces passed through.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_testkit::Namespace;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{replica, wait_for};

/// A raw HTTP/1.1 upstream on 127.0.0.1 that answers every request 201 and closes;
/// counts the requests per `Idempotency-Key`.
async fn counting_upstream() -> (SocketAddr, Arc<std::sync::Mutex<HashMap<String, usize>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let runs: Arc<std::sync::Mutex<HashMap<String, usize>>> = Arc::default();
    let counted = Arc::clone(&runs);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let runs = Arc::clone(&counted);
            tokio::spawn(async move {
                let mut read = Vec::new();
                let mut buf = [0u8; 4096];
                // Bounded: the head and a small body, within 10 s.
                let _ = tokio::time::timeout(Duration::from_secs(10), async {
                    while !String::from_utf8_lossy(&read).contains("\r\n\r\n{}") {
                        match socket.read(&mut buf).await {
                            Ok(n) if n > 0 => read.extend_from_slice(&buf[..n]),
                            _ => return,
                        }
                    }
                })
                .await;
                let text = String::from_utf8_lossy(&read).to_ascii_lowercase();
                let key = text
                    .lines()
                    .find_map(|line| line.strip_prefix("idempotency-key: "))
                    .unwrap_or("")
                    .trim()
                    .to_owned();
                *runs.lock().unwrap().entry(key).or_default() += 1;
                if let Some(trace) = text
                    .lines()
                    .find_map(|line| line.strip_prefix("traceparent: "))
                {
                    *runs
                        .lock()
                        .unwrap()
                        .entry(format!("traceparent {}", trace.trim()))
                        .or_default() += 1;
                }
                let _ = socket
                    .write_all(
                        b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    (addr, runs)
}

/// A keyed `POST` of `{}` on an open connection; the answer's head, read whole.
async fn post_on(connection: &mut TcpStream, path: &str, key: &str) -> String {
    post_with(connection, path, key, "").await
}

/// [`post_on`] with `extra` header lines (each ending in CRLF).
async fn post_with(connection: &mut TcpStream, path: &str, key: &str, extra: &str) -> String {
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: idem\r\nx-account-id: acct_1\r\nidempotency-key: {key}\r\n{extra}content-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}"
    );
    connection.write_all(request.as_bytes()).await.unwrap();
    let mut read = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let n = connection.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "the connection was dropped: {}",
                String::from_utf8_lossy(&read)
            );
            read.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&read).to_ascii_lowercase();
            if let Some(end) = text.find("\r\n\r\n") {
                let length: usize = text[..end]
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if read.len() >= end + 4 + length {
                    return text[..end].to_owned();
                }
            }
        }
    })
    .await
    .expect("answered within 10 s")
}

/// Waits (at most 20 s) until the log file says `what`.
fn wait_for_log(log: &Path, what: &str) {
    let started = Instant::now();
    while !std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains(what)
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the log never said {what:?}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sighup_reloads_the_routes_without_dropping_a_connection_and_traces_pass_through() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let namespace = Namespace::fresh();
    let config = dir.join(format!("idem-proxy-hup-{}.toml", namespace.as_str()));
    let db = dir.join(format!("idem-proxy-hup-{}.db", namespace.as_str()));
    let log = dir.join(format!("idem-proxy-hup-{}.log", namespace.as_str()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (upstream, runs) = runtime.block_on(counting_upstream());
    let file = |routes: &str| {
        format!(
            "upstream = \"http://{upstream}\"\nstore = \"sqlite://{}\"\nmigrate = true\n\n[defaults]\nscope = {{ header = \"x-account-id\" }}\n\n[[routes]]\nmethods = [\"POST\"]\npath = \"/payments\"\n{routes}",
            db.display()
        )
    };
    std::fs::write(&config, file("")).unwrap();
    let (mut proxy, addr, admin) = replica(&config, &[], log.clone());
    runtime.block_on(wait_for(
        &format!("http://{admin}/readyz"),
        Duration::from_secs(20),
    ));
    let pid = proxy.0.id().to_string();
    let hangup = || {
        let status = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
        assert!(status.success());
    };
    let mut connection = runtime.block_on(TcpStream::connect(addr)).unwrap();
    let runs_of = |key: &str| runs.lock().unwrap().get(key).copied().unwrap_or(0);

    // `/orders` is on no route: passed on unprotected, run each time.
    for _ in 0..2 {
        let head = runtime.block_on(post_on(&mut connection, "/orders", "k-before"));
        assert!(head.starts_with("http/1.1 201"), "{head}");
    }
    assert_eq!(runs_of("k-before"), 2);

    // A file that does not parse: logged, nothing changes, the process serves on.
    std::fs::write(&config, "upstream = [").unwrap();
    hangup();
    wait_for_log(&log, "was not reloaded");
    assert!(
        proxy.0.try_wait().unwrap().is_none(),
        "a bad file stops nothing"
    );

    std::fs::write(
        &config,
        file("\n[[routes]]\nmethods = [\"POST\"]\npath = \"/orders\"\n"),
    )
    .unwrap();
    hangup();
    wait_for_log(&log, "reloaded the configuration");
    // The same connection, the new routes: `/orders` is protected.
    let first = runtime.block_on(post_on(&mut connection, "/orders", "k-after"));
    let again = runtime.block_on(post_on(&mut connection, "/orders", "k-after"));
    assert!(first.starts_with("http/1.1 201"), "{first}");
    assert!(again.contains("idempotent-replayed: true"), "{again}");
    assert_eq!(runs_of("k-after"), 1);

    // A caller's W3C trace context goes on to the upstream untouched, and its trace id
    // is in the access log line.
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let header = format!("traceparent: {trace}\r\n");
    let traced = runtime.block_on(post_with(&mut connection, "/payments", "k-trace", &header));
    assert!(traced.starts_with("http/1.1 201"), "{traced}");
    assert_eq!(runs_of(&format!("traceparent {trace}")), 1);
    wait_for_log(&log, "trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"");
    drop(proxy);
    let _ = std::fs::remove_file(&config);
    let _ = std::fs::remove_file(&db);
    let _ = std::fs::remove_file(&log);
}
