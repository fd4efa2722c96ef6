//! The limits clients are held to, against the proxy in process with real misbehaving
//! clients on raw TCP: slow heads, idle connections, trickled bodies, too many
//! connections, too many requests; per-route upstream timeouts; and a readiness that does
//! not fall with a slow store.

mod common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use axum::http::StatusCode;
use common::*;
use idem_core::key::StepName;
use idem_core::record::{Lease, Record};
use idem_core::store::{ClaimOutcome, ClaimRequest, RenewOutcome, WriteOutcome};
use idem_core::{Key, MemoryStore, Store, StoreError};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the server closes the connection (or resets it); fails after 10 s.
async fn assert_closed(stream: &mut TcpStream, what: &str) -> String {
    let mut seen = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "{what}: the proxy kept the connection open");
    String::from_utf8_lossy(&seen).into_owned()
}

/// Sends a `GET /health` on `stream` and reads its answer (the upstream's `ok`).
async fn health_on(stream: &mut TcpStream) {
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: proxy\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buffer = [0u8; 4096];
        while !seen.ends_with(b"\r\n\r\nok") {
            let n = stream.read(&mut buffer).await.unwrap();
            assert!(n > 0, "closed before its answer");
            seen.extend_from_slice(&buffer[..n]);
        }
    })
    .await;
    assert!(answered.is_ok(), "no answer to a GET on a free connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_silent_and_idle_connections_are_closed() {
    let up = Upstream::default();
    let toml = config_with(
        upstream(up.clone()).await,
        r#"client_header_timeout = "300ms""#,
        "",
    );
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;

    // Slowloris: a head that never ends.
    let mut slow = TcpStream::connect(proxy.addr).await.unwrap();
    slow.write_all(b"POST /payments HTTP/1.1\r\nHost: proxy\r\nx-account-id: a\r\n")
        .await
        .unwrap();
    assert_closed(&mut slow, "a head unfinished after client_header_timeout").await;

    // A connection that never sends a byte.
    let mut silent = TcpStream::connect(proxy.addr).await.unwrap();
    assert_closed(&mut silent, "a connection silent from its start").await;

    // Part of the HTTP/2 preface, then nothing.
    let mut preface = TcpStream::connect(proxy.addr).await.unwrap();
    preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    assert_closed(&mut preface, "a half-sent HTTP/2 preface").await;

    // A keep-alive connection left idle after its answer.
    let mut idle = TcpStream::connect(proxy.addr).await.unwrap();
    health_on(&mut idle).await;
    assert_closed(&mut idle, "a keep-alive connection idle after its answer").await;
    assert_eq!(up.total(), 0, "nothing reached the upstream's POST handler");
    proxy.shutdown().await;
}

/// A protected POST whose body announces 40 bytes and sends 11.
const TRICKLED: &str = "POST /payments HTTP/1.1\r\nHost: proxy\r\nx-account-id: a\r\n\
    idempotency-key: k1\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n{\"amount\":";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_answered_408_and_its_key_stays_free() {
    let up = Upstream::default();
    let toml = config_with(
        upstream(up.clone()).await,
        r#"client_body_timeout = "300ms""#,
        "",
    );
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;

    let mut trickle = TcpStream::connect(proxy.addr).await.unwrap();
    trickle.write_all(TRICKLED.as_bytes()).await.unwrap();
    let answer = assert_closed(&mut trickle, "a body stalled past client_body_timeout").await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body-timeout"), "{answer}");

    // Nothing was claimed: the whole request under the same key runs, once.
    let url = proxy.url("/payments");
    let (status, _, _) = pay_once(&url, "a", Some("k1"), r#"{"amount":5}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(up.runs("k1"), 1);

    // Unprotected requests are held to it too.
    let mut unmatched = TcpStream::connect(proxy.addr).await.unwrap();
    unmatched
        .write_all(TRICKLED.replace("/payments", "/free").as_bytes())
        .await
        .unwrap();
    let answer = assert_closed(&mut unmatched, "an unprotected body stalled").await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_connections_a_new_connection_waits_for_one_to_close() {
    let up = Upstream::default();
    let toml = config_with(
        upstream(up.clone()).await,
        r#"
        max_connections = 2
        client_header_timeout = "60s"
        "#,
        "",
    );
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let mut first = TcpStream::connect(proxy.addr).await.unwrap();
    health_on(&mut first).await;
    let mut second = TcpStream::connect(proxy.addr).await.unwrap();
    health_on(&mut second).await;

    // The third waits in the backlog: its request gets no answer while both stay open.
    let mut third = TcpStream::connect(proxy.addr).await.unwrap();
    third
        .write_all(b"GET /health HTTP/1.1\r\nHost: proxy\r\n\r\n")
        .await
        .unwrap();
    let mut buffer = [0u8; 256];
    let early = tokio::time::timeout(Duration::from_millis(500), third.read(&mut buffer)).await;
    assert!(
        early.is_err(),
        "a third connection was served past max_connections = 2"
    );
    // One closes: the third is accepted, and its request answered.
    drop(first);
    let answered = tokio::time::timeout(Duration::from_secs(10), third.read(&mut buffer))
        .await
        .expect("served once a connection closed")
        .unwrap();
    assert!(
        String::from_utf8_lossy(&buffer[..answered]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buffer[..answered])
    );
    drop(second);
    proxy.shutdown().await;
}

/// This process's metrics recorder, installed once.
fn recorder() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            idem_proxy::observe::prometheus_builder()
                .and_then(|builder| builder.install_recorder())
                .expect("the only recorder of this test process")
        })
        .clone()
}

async fn metrics_text(admin: std::net::SocketAddr) -> String {
    client()
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_concurrent_requests_a_request_is_told_to_retry_and_nothing_is_claimed() {
    let up = Upstream::default();
    // Long enough that the second request certainly arrives while the first runs, well
    // within the upstream timeout.
    *up.delay.lock().unwrap() = Duration::from_millis(1500);
    let toml = config_with(
        upstream(up.clone()).await,
        "max_concurrent_requests = 1",
        "",
    )
    .replace("upstream_timeout = \"2s\"", "upstream_timeout = \"30s\"");
    let proxy = observed_proxy(&toml, Arc::new(MemoryStore::new()), Some(recorder())).await;
    let url = proxy.url("/payments");

    let arrived = up.arrived.notified();
    let first = tokio::spawn({
        let url = url.clone();
        async move { pay_once(&url, "a", Some("k1"), r#"{"amount":1}"#).await }
    });
    arrived.await;
    let (status, headers, body) = pay_once(&url, "a", Some("k2"), r#"{"amount":2}"#).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(headers["retry-after"], "1");
    assert!(body.contains("overloaded"), "{body}");
    assert_eq!(first.await.unwrap().0, StatusCode::CREATED);

    // Nothing was claimed for it: once the first is answered, it runs, once. The permit
    // goes with the first answer's end, which the client may see a moment before.
    let mut retried = None;
    for _ in 0..100 {
        let answer = pay_once(&url, "a", Some("k2"), r#"{"amount":2}"#).await;
        if answer.0 != StatusCode::SERVICE_UNAVAILABLE {
            retried = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let retried = retried.expect("served once the first request ended");
    assert_eq!(retried.0, StatusCode::CREATED, "{retried:?}");
    assert_eq!((up.runs("k1"), up.runs("k2")), (1, 1));
    let metrics = metrics_text(proxy.admin).await;
    assert!(
        metrics.contains("idem_proxy_client_limits_total{limit=\"requests\"}"),
        "{metrics}"
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_request_on_no_route_is_counted() {
    let up = Upstream::default();
    let toml = config(upstream(up.clone()).await, "");
    let proxy = observed_proxy(&toml, Arc::new(MemoryStore::new()), Some(recorder())).await;
    let (status, _, _) = pay_once(&proxy.url("/free"), "a", Some("k1"), "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    let metrics = metrics_text(proxy.admin).await;
    assert!(
        metrics.lines().any(
            |line| line.starts_with("idem_proxy_unprotected_keys_total ") && !line.ends_with(" 0")
        ),
        "{metrics}"
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_are_histograms_and_the_layers_answers_name_their_route() {
    let up = Upstream::default();
    let toml = config(upstream(up.clone()).await, "");
    let proxy = observed_proxy(&toml, Arc::new(MemoryStore::new()), Some(recorder())).await;
    let (status, _, _) = pay_once(&proxy.url("/payments"), "a", Some("metrics-k"), "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    let metrics = metrics_text(proxy.admin).await;
    for expected in [
        // Buckets add up across replicas, where a summary's quantiles cannot.
        "idem_proxy_upstream_seconds_bucket{le=\"0.001\"}",
        "idem_proxy_upstream_seconds_bucket{le=\"600\"}",
        "idem_work_duration_seconds_bucket{le=\"0.25\"}",
        "idem_http_requests_total{answer=\"executed\",route=\"POST /payments\"}",
    ] {
        assert!(metrics.contains(expected), "no {expected} in\n{metrics}");
    }
    assert!(!metrics.contains("quantile="), "no summaries: {metrics}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_route_has_its_own_upstream_timeout() {
    let up = Upstream::default();
    *up.delay.lock().unwrap() = Duration::from_millis(700);
    let addr = upstream(up.clone()).await;
    let toml = format!(
        r#"
        upstream = "http://{addr}"
        upstream_timeout = "300ms"
        connect_timeout = "250ms"

        [defaults]
        scope = {{ header = "x-account-id" }}

        [[routes]]
        methods = ["POST"]
        path = "/payments"
        upstream_timeout = "5s"

        [[routes]]
        methods = ["POST"]
        path = "/v1/payments"

        [[routes]]
        methods = ["POST"]
        path = "/free"
        key = "exempt"
        upstream_timeout = "5s"
        "#
    );
    let config = idem_proxy::Config::parse("test.toml", &toml).unwrap();
    // A lease follows the route's longer timeout unless the file sets one.
    assert_eq!(config.routes[0].lease, Duration::from_secs(60));
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let slow = pay_once(&proxy.url("/payments"), "a", Some("k1"), "{}").await;
    assert_eq!(slow.0, StatusCode::CREATED, "its own 5 s: {slow:?}");
    let short = pay_once(&proxy.url("/v1/payments"), "a", Some("k2"), "{}").await;
    assert_eq!(short.0, StatusCode::GATEWAY_TIMEOUT, "the file's 300 ms");
    let exempt = pay_once(&proxy.url("/free"), "a", None, "{}").await;
    assert_eq!(exempt.0, StatusCode::CREATED, "an exempt route's own 5 s");
    proxy.shutdown().await;
}

/// A store that never answers.
struct Stalled;

#[async_trait]
impl Store for Stalled {
    async fn claim(&self, _: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        std::future::pending().await
    }
    async fn complete(&self, _: &Lease, _: &[u8]) -> Result<WriteOutcome, StoreError> {
        std::future::pending().await
    }
    async fn fail(&self, _: &Lease, _: &[u8]) -> Result<WriteOutcome, StoreError> {
        std::future::pending().await
    }
    async fn release(&self, _: &Lease) -> Result<WriteOutcome, StoreError> {
        std::future::pending().await
    }
    async fn renew(&self, _: &Lease, _: Duration) -> Result<RenewOutcome, StoreError> {
        std::future::pending().await
    }
    async fn checkpoint(
        &self,
        _: &Lease,
        _: &StepName,
        _: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        std::future::pending().await
    }
    async fn get(&self, _: &Key) -> Result<Option<Record>, StoreError> {
        std::future::pending().await
    }
    async fn purge_expired(&self, _: usize) -> Result<usize, StoreError> {
        std::future::pending().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_is_the_replicas_unless_the_store_is_asked_for() {
    let up = Upstream::default();
    let addr = upstream(up.clone()).await;
    let ready = |admin: std::net::SocketAddr| async move {
        let response = client()
            .get(format!("http://{admin}/readyz"))
            .send()
            .await
            .expect("/readyz answers, never times out");
        (response.status().as_u16(), response.text().await.unwrap())
    };

    // A store that never answers leaves the replica ready: unprotected traffic goes on.
    let proxy = proxy(&config(addr, ""), Arc::new(Stalled)).await;
    assert_eq!(ready(proxy.admin).await, (200, "ready\n".to_owned()));
    let read = client().get(proxy.url("/health")).send().await.unwrap();
    assert_eq!(read.status().as_u16(), 200);
    proxy.shutdown().await;

    // Asked for, the store's silence is an answer within the probe's second.
    let proxy = proxy_checking_store(addr).await;
    let (status, text) = ready(proxy.admin).await;
    assert_eq!(status, 503);
    assert!(text.contains("800 ms"), "{text}");
    proxy.shutdown().await;
}

async fn proxy_checking_store(addr: std::net::SocketAddr) -> Running {
    proxy(
        &config_with(addr, "ready_checks_store = true", ""),
        Arc::new(Stalled),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_its_answer_is_cut() {
    let up = Upstream::default();
    let toml = config_with(
        upstream(up.clone()).await,
        r#"client_send_timeout = "300ms""#,
        "",
    );
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let mut reader = TcpStream::connect(proxy.addr).await.unwrap();
    reader
        .write_all(b"GET /big HTTP/1.1\r\nHost: proxy\r\n\r\n")
        .await
        .unwrap();
    // It reads nothing for ten times the timeout: the proxy's writes block, then time
    // out.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = assert_closed(&mut reader, "a client that stopped reading").await;
    assert!(
        got.len() < BIG,
        "the whole answer went out ({} bytes): nothing waited on the client",
        got.len()
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_closes_connections_still_sending_a_head() {
    let up = Upstream::default();
    // Both longer than `Running::shutdown` waits: only closing the slow connection at
    // once lets the shutdown end in time.
    let toml = config_with(
        upstream(up.clone()).await,
        r#"
        client_header_timeout = "60s"
        shutdown_grace = "60s"
        "#,
        "",
    )
    .replace("shutdown_grace = \"10s\"", "");
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let mut slow = TcpStream::connect(proxy.addr).await.unwrap();
    slow.write_all(b"POST /payments HTTP/1.1\r\nHost: proxy\r\n")
        .await
        .unwrap();
    // And one that has sent nothing yet.
    let mut silent = TcpStream::connect(proxy.addr).await.unwrap();
    // The proxy has read what was sent (a GET on another connection is answered after).
    let mut other = TcpStream::connect(proxy.addr).await.unwrap();
    health_on(&mut other).await;
    proxy.shutdown().await;
    assert_closed(&mut slow, "a half-sent head at shutdown").await;
    assert_closed(&mut silent, "a silent connection at shutdown").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_whose_client_went_away_still_counts() {
    let up = Upstream::default();
    *up.delay.lock().unwrap() = Duration::from_secs(3);
    let toml = config_with(
        upstream(up.clone()).await,
        "max_concurrent_requests = 1",
        "",
    )
    .replace("upstream_timeout = \"2s\"", "upstream_timeout = \"30s\"");
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let url = proxy.url("/payments");
    // The first client gives up once its request reached the upstream.
    let arrived = up.arrived.notified();
    let impatient = tokio::spawn({
        let url = url.clone();
        async move {
            client()
                .post(&url)
                .header("x-account-id", "a")
                .header("idempotency-key", "k1")
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
        }
    });
    arrived.await;
    impatient.abort();
    let _ = impatient.await;
    // The proxy saw the client go (its request's own slot is free), while the handler
    // runs on for seconds.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Its handler runs on, detached, and holds the only slot.
    let (status, _, body) = pay_once(&url, "a", Some("k2"), "{}").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    // Once it stored its answer, the slot is free, and the first key replays.
    let mut replayed = None;
    for _ in 0..200 {
        let answer = pay_once(&url, "a", Some("k1"), "{}").await;
        if answer.0 == StatusCode::CREATED {
            replayed = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let replayed = replayed.expect("the detached handler finished");
    assert_eq!(replayed.1["idempotent-replayed"], "true");
    assert_eq!(up.runs("k1"), 1);
    proxy.shutdown().await;
}
