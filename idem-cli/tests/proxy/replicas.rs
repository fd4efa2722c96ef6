//! Two replicas on one PostgreSQL table in front of the Flask service, clients retrying
//! through faults: each payment runs once, and every client gets the first response.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem_testkit::{Namespace, service_url};

use crate::faults::{cutting_proxy, fault_proxy};
use crate::support::{Killed, free_port, replica, wait_for};

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
