//! `idem proxy` for real, on 127.0.0.1: a Python (Flask) payments service that counts its
//! executions in a database, two proxy replicas sharing one PostgreSQL table, and clients
//! that retry through a fault proxy dropping answers, with concurrent duplicates on both
//! replicas. Each logical payment runs once upstream, and every client gets the first
//! response.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem_testkit::{Namespace, service_url};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A child process killed when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until `url` answers 200, for at most `patience`.
async fn wait_for(url: &str, patience: Duration) {
    let started = Instant::now();
    let client = reqwest::Client::new();
    while started.elapsed() < patience {
        if let Ok(response) = client.get(url).send().await
            && response.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} did not answer within {patience:?}");
}

/// The Flask app of idem-proxy's examples, on its own port and database.
fn flask(python: &str, dir: &Path) -> (Killed, String) {
    let port = free_port();
    let app = Path::new(env!("CARGO_MANIFEST_DIR")).join("../idem-proxy/examples/upstream/app.py");
    let child = Command::new(python)
        .arg(app)
        .args(["--port", &port.to_string()])
        .arg("--db")
        .arg(dir.join("payments.db"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("flask.log")).unwrap())
        .spawn()
        .expect("start the Flask app");
    (Killed(child), format!("http://127.0.0.1:{port}"))
}

/// One `idem proxy` replica; its address, read from what it prints.
fn replica(config: &Path, store: &[String], log: PathBuf) -> (Killed, SocketAddr, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(store)
        .args(["proxy", "--config"])
        .arg(config)
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .env_remove("IDEM_STORE")
        .env_remove("IDEM_TABLE")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start idem proxy");
    let stdout = child.stdout.take().unwrap();
    let child = Killed(child);
    // "idem proxy: listening on http://ADDR (admin on http://ADDR), store ..."; the
    // migration's line may come first. Read on a thread of its own, waited for 30 s.
    let (lines, said) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().take(5) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Ok(line) = said.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        let line = line.expect("read the proxy's output");
        if let Some(rest) = line.strip_prefix("idem proxy: listening on http://") {
            let (addr, rest) = rest.split_once(' ').unwrap();
            let admin = rest
                .trim_start_matches("(admin on http://")
                .split_once(')')
                .unwrap()
                .0;
            return (child, addr.parse().unwrap(), admin.parse().unwrap());
        }
    }
    panic!("idem proxy did not say where it listens");
}

/// A TCP proxy in front of the replicas, in turn, that drops every `nth` answer: the
/// request goes through, the response is read and thrown away, the client's connection
/// is cut.
async fn fault_proxy(
    replicas: Vec<SocketAddr>,
    nth: usize,
    dropped: Arc<AtomicUsize>,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut count = 0usize;
        while let Ok((mut client, _)) = listener.accept().await {
            count += 1;
            let target = replicas[count % replicas.len()];
            let drop_answer = count.is_multiple_of(nth);
            let dropped = Arc::clone(&dropped);
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(target).await else {
                    return;
                };
                let (mut client_read, mut client_write) = client.split();
                let (mut server_read, mut server_write) = server.split();
                let upload = async {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                    // The client is done: so is the replica's side of the connection.
                    let _ = server_write.shutdown().await;
                };
                let download = async {
                    if drop_answer {
                        let mut buf = [0u8; 4096];
                        // The answer arrived; the client never sees it.
                        if matches!(server_read.read(&mut buf).await, Ok(n) if n > 0) {
                            dropped.fetch_add(1, Ordering::SeqCst);
                        }
                    } else {
                        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                    }
                    let _ = client_write.shutdown().await;
                };
                // Bounded: a connection lasts at most 30 s.
                let _ = tokio::time::timeout(Duration::from_secs(30), async {
                    tokio::join!(upload, download);
                })
                .await;
            });
        }
    });
    addr
}

/// A TCP proxy between the replicas and the upstream that cuts every `nth` connection
/// mid-answer: the upstream's response head and one byte of its body go through, then
/// both sides are closed.
async fn cutting_proxy(upstream: SocketAddr, nth: usize, cut: Arc<AtomicUsize>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut count = 0usize;
        while let Ok((mut replica, _)) = listener.accept().await {
            count += 1;
            let cut_this = count.is_multiple_of(nth);
            let cut = Arc::clone(&cut);
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut replica_read, mut replica_write) = replica.split();
                let (mut server_read, mut server_write) = server.split();
                let upload = async {
                    let _ = tokio::io::copy(&mut replica_read, &mut server_write).await;
                    let _ = server_write.shutdown().await;
                };
                let download = async {
                    if !cut_this {
                        let _ = tokio::io::copy(&mut server_read, &mut replica_write).await;
                        return;
                    }
                    // The head, then one byte of the body, then nothing.
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 1];
                    while let Ok(1) = server_read.read(&mut buf).await {
                        seen.push(buf[0]);
                        let _ = replica_write.write_all(&buf).await;
                        if let Some(head) = seen.windows(4).position(|w| w == b"\r\n\r\n")
                            && seen.len() > head + 4
                        {
                            cut.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                    }
                };
                // Bounded: a connection lasts at most 30 s; a cut one ends at the cut.
                let _ = tokio::time::timeout(Duration::from_secs(30), async {
                    if cut_this {
                        tokio::select! {
                            () = upload => {}
                            () = download => {}
                        }
                    } else {
                        tokio::join!(upload, download);
                    }
                })
                .await;
            });
        }
    });
    addr
}

/// What one client got for its payment: the body, and whether it was a replay.
#[derive(Debug)]
struct Got {
    body: String,
    replayed: bool,
    attempts: usize,
}

/// Sends one logical payment until it gets its 201, retrying dropped answers and 409s.
async fn pay(url: String, account: String, key: String, amount: u32) -> Got {
    // A new connection for every attempt, so each meets the fault proxy's choice afresh.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let body = format!(r#"{{"amount":{amount},"currency":"EUR"}}"#);
    for attempt in 1..=200 {
        let sent = client
            .post(&url)
            .header("x-account-id", &account)
            .header("idempotency-key", &key)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(response) if response.status().as_u16() == 201 => {
                let replayed = response.headers().get("idempotent-replayed").is_some();
                // A body cut short (its upstream leg was cut mid-answer) is retried: the
                // retry replays the stored head.
                if let Ok(body) = response.text().await {
                    return Got {
                        body,
                        replayed,
                        attempts: attempt,
                    };
                }
            }
            // In flight on the other replica, or the first answer was dropped: retry. A
            // 502 is an upstream leg broken before its head (the key held): retry too.
            Ok(response) if matches!(response.status().as_u16(), 409 | 502) => {}
            Ok(response) => panic!(
                "{key}: unexpected {}: {}",
                response.status(),
                response.text().await.unwrap_or_default()
            ),
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(25 + 10 * (attempt as u64 % 5))).await;
    }
    panic!("{key}: no answer after 200 attempts");
}

#[test]
fn two_replicas_on_postgres_run_each_payment_once_through_dropped_answers() {
    let Some(postgres) = service_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let Some(python) = service_url("IDEM_TEST_FLASK_PYTHON") else {
        return;
    };
    let namespace = Namespace::fresh();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("idem-proxy-{}", namespace.as_str()));
    std::fs::create_dir_all(&dir).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let (_flask, upstream) = flask(&python, &dir);
    runtime.block_on(wait_for(
        &format!("{upstream}/health"),
        Duration::from_secs(30),
    ));

    // The replicas reach the upstream through a proxy that cuts every 7th connection
    // mid-answer: the head says 201, the body breaks off.
    let cut = Arc::new(AtomicUsize::new(0));
    let flask_addr: SocketAddr = upstream.trim_start_matches("http://").parse().unwrap();
    let cutter = runtime.block_on(cutting_proxy(flask_addr, 7, Arc::clone(&cut)));
    let config = dir.join("idem.toml");
    std::fs::write(
        &config,
        format!(
            r#"
            upstream = "http://{cutter}"
            upstream_timeout = "4s"
            connect_timeout = "1s"
            shutdown_grace = "10s"
            # Both replicas create the table at start: safe from several processes at once.
            migrate = true

            [defaults]
            scope = {{ header = "x-account-id" }}
            lease = "5s"

            [[routes]]
            methods = ["POST"]
            path = "/payments"
            "#
        ),
    )
    .unwrap();
    let table = format!("idem_proxy_{}", namespace.as_str());
    let store = vec!["--store".to_owned(), postgres, "--table".to_owned(), table];
    let (mut one, one_addr, one_admin) = replica(&config, &store, dir.join("replica-1.log"));
    let (_two, two_addr, two_admin) = replica(&config, &store, dir.join("replica-2.log"));

    let payments = 30u32;
    let dropped = Arc::new(AtomicUsize::new(0));
    let results = runtime.block_on(async {
        wait_for(
            &format!("http://{one_admin}/readyz"),
            Duration::from_secs(20),
        )
        .await;
        wait_for(
            &format!("http://{two_admin}/readyz"),
            Duration::from_secs(20),
        )
        .await;
        let front = fault_proxy(vec![one_addr, two_addr], 3, Arc::clone(&dropped)).await;
        let url = format!("http://{front}/payments");
        // Two clients per payment at once (a double click), each retrying on its own.
        let mut clients = Vec::new();
        for i in 0..payments {
            for _ in 0..2 {
                let (url, account, key) =
                    (url.clone(), format!("acct_{}", i % 4), format!("pay-{i}"));
                clients.push(tokio::spawn(async move {
                    let got = pay(url, account, key.clone(), 100 + i).await;
                    (key, got)
                }));
            }
        }
        let mut results: HashMap<String, Vec<Got>> = HashMap::new();
        for client in clients {
            let (key, got) = client.await.unwrap();
            results.entry(key).or_default().push(got);
        }
        results
    });

    // Every client of a payment got the same, first response.
    let mut replays = 0;
    let mut retried = 0;
    for (key, got) in &results {
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].body, got[1].body, "{key}: {got:?}");
        replays += got.iter().filter(|g| g.replayed).count();
        retried += got.iter().filter(|g| g.attempts > 1).count();
    }
    // The storm really was one: answers were dropped, and retries replayed.
    let dropped = dropped.load(Ordering::SeqCst);
    assert!(dropped > 0, "the fault proxy dropped no answer");
    assert!(replays >= payments as usize, "{replays} replays");
    assert!(retried > 0);

    // The upstream's own count: each payment executed once.
    let executions: serde_json::Value = runtime.block_on(async {
        reqwest::get(format!("{upstream}/payments/executions"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    for i in 0..payments {
        assert_eq!(
            executions["by_key"][format!("pay-{i}")],
            1,
            "pay-{i}: {executions}"
        );
    }
    assert_eq!(executions["executions"], payments, "{executions}");
    let cut = cut.load(Ordering::SeqCst);
    assert!(cut > 0, "the upstream leg was never cut mid-answer");
    // Each replica logged every request it answered, without a key or a caller.
    let logs: String = ["replica-1.log", "replica-2.log"]
        .iter()
        .map(|name| std::fs::read_to_string(dir.join(name)).unwrap_or_default())
        .collect();
    let access = logs
        .lines()
        .filter(|line| line.contains("idem_proxy::access"))
        .count();
    assert!(
        access >= 2 * payments as usize,
        "{access} access lines:\n{logs}"
    );
    assert!(
        logs.lines()
            .any(|line| line.contains("idem_proxy::access") && line.contains("status=201")),
        "{logs}"
    );
    assert!(
        !logs.contains("pay-") && !logs.contains("acct_"),
        "a key or a caller was logged:\n{logs}"
    );
    println!(
        "{payments} payments, 2 clients each, 2 replicas: {dropped} answers dropped, {cut} upstream answers cut mid-body, {replays} replays, 1 execution each"
    );

    // SIGTERM: the replica stops gracefully, with exit code 0.
    let status = Command::new("kill")
        .args(["-TERM", &one.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let started = Instant::now();
    let code = loop {
        if let Some(code) = one.0.try_wait().unwrap() {
            break code;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(code.success(), "{code:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_sigterm_stops_at_once() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let namespace = Namespace::fresh();
    let config = dir.join(format!("idem-proxy-term-{}.toml", namespace.as_str()));
    let db = dir.join(format!("idem-proxy-term-{}.db", namespace.as_str()));
    // A long shutdown delay: the first SIGTERM alone would keep it serving for a minute.
    std::fs::write(
        &config,
        format!(
            r#"
            upstream = "http://127.0.0.1:{}"
            store = "sqlite://{}"
            migrate = true
            shutdown_delay = "60s"
            "#,
            free_port(),
            db.display()
        ),
    )
    .unwrap();
    let (mut proxy, _, admin) = replica(&config, &[], dir.join("term.log"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(wait_for(
        &format!("http://{admin}/readyz"),
        Duration::from_secs(20),
    ));
    let pid = proxy.0.id().to_string();
    let term = || {
        let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(status.success());
    };
    term();
    // The first one began a graceful shutdown: not ready, still running.
    let started = Instant::now();
    loop {
        let ready = runtime.block_on(async {
            reqwest::get(format!("http://{admin}/readyz"))
                .await
                .map(|r| r.status().as_u16())
                .ok()
        });
        if ready == Some(503) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "not unready after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        proxy.0.try_wait().unwrap().is_none(),
        "gone before its delay"
    );
    term();
    let started = Instant::now();
    let code = loop {
        if let Some(code) = proxy.0.try_wait().unwrap() {
            break code;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no exit after a second SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code.code(), Some(143), "a cut shutdown is not a clean one");
    let _ = std::fs::remove_file(&config);
    let _ = std::fs::remove_file(&db);
}

#[test]
fn a_configuration_mistake_names_the_file_and_line_and_exits_2() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let config = dir.join(format!(
        "idem-proxy-bad-{}.toml",
        Namespace::fresh().as_str()
    ));
    std::fs::write(
        &config,
        "upstream = \"http://127.0.0.1:1\"\n\n[[routes]]\nmethods = [\"POST\"]\npath = \"/payments\"\nscope = { header = \"x-account-id\" }\nlease = \"soon\"\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["proxy", "--check", "--config"])
        .arg(&config)
        .env_remove("IDEM_STORE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("{}:7:9:", config.display())),
        "file, line and column: {stderr}"
    );
    assert!(stderr.contains("\"30s\""), "what to write: {stderr}");
    let _ = std::fs::remove_file(&config);
}

#[test]
fn check_opens_the_store_and_exits_without_serving() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let name = Namespace::fresh();
    let config = dir.join(format!("idem-proxy-check-{}.toml", name.as_str()));
    let db = dir.join(format!("idem-proxy-check-{}.db", name.as_str()));
    std::fs::write(
        &config,
        format!(
            "upstream = \"http://127.0.0.1:1\"\nstore = \"sqlite://{}\"\nmigrate = true\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n[defaults]\nscope = {{ header = \"x-account-id\" }}\n[[routes]]\nmethods = [\"POST\"]\npath = \"/payments\"\n",
            db.display()
        ),
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["proxy", "--check", "--config"])
        .arg(&config)
        .env_remove("IDEM_STORE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(
        stdout.contains("listening on http://127.0.0.1:"),
        "{stdout}"
    );
    assert!(stdout.contains("not serving"), "{stdout}");
    assert!(db.exists(), "migrate = true created the database");
    let _ = std::fs::remove_file(&config);
    let _ = std::fs::remove_file(&db);
}

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
