//! What the proxy's tests share: a counting upstream on 127.0.0.1, a proxy in process in
//! front of it, and clients.

#![allow(dead_code)] // each test binary uses what it needs

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use idem_core::{MemoryStore, Store};
use idem_proxy::{Config, Proxy};
use tokio::sync::oneshot;

/// The length of `GET /big`'s answer.
pub(crate) const BIG: usize = 32 << 20;

/// An upstream that counts its executions by key, and answers as told.
#[derive(Clone, Default)]
pub(crate) struct Upstream {
    pub(crate) runs: Arc<Mutex<HashMap<String, usize>>>,
    /// How long each POST takes.
    pub(crate) delay: Arc<Mutex<Duration>>,
    /// The status each POST answers.
    pub(crate) status: Arc<Mutex<Option<StatusCode>>>,
    /// The last request's headers.
    pub(crate) seen: Arc<Mutex<Option<HeaderMap>>>,
    /// Told when a POST arrives.
    pub(crate) arrived: Arc<tokio::sync::Notify>,
}

impl Upstream {
    pub(crate) fn runs(&self, key: &str) -> usize {
        self.runs.lock().unwrap().get(key).copied().unwrap_or(0)
    }
    pub(crate) fn total(&self) -> usize {
        self.runs.lock().unwrap().values().sum()
    }
}

pub(crate) async fn pay(
    State(up): State<Upstream>,
    headers: HeaderMap,
    body: String,
) -> (StatusCode, [(&'static str, String); 1], String) {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    up.arrived.notify_one();
    let delay = *up.delay.lock().unwrap();
    tokio::time::sleep(delay).await;
    let n = {
        let mut runs = up.runs.lock().unwrap();
        let n = runs.entry(key).or_default();
        *n += 1;
        runs.values().sum::<usize>()
    };
    *up.seen.lock().unwrap() = Some(headers);
    let status = up.status.lock().unwrap().unwrap_or(StatusCode::CREATED);
    (
        status,
        [("x-charge-id", format!("ch_{n}"))],
        format!("{{\"charge\":\"ch_{n}\",\"request\":{body:?}}}"),
    )
}

pub(crate) async fn upstream(up: Upstream) -> SocketAddr {
    let app = Router::new()
        .route("/payments", post(pay))
        .route("/v1/payments", post(pay))
        .route("/free", post(pay))
        .route("/any", post(pay).get(|| async { "read" }))
        .route("/health", get(|| async { "ok" }))
        // An answer larger than any socket buffer on loopback.
        .route("/big", get(|| async { vec![b'x'; BIG] }))
        // Starlette's and Werkzeug's way: the one spelling redirects to the other.
        .route(
            "/slashy",
            post(|| async { axum::response::Redirect::temporary("/slashy/") }),
        )
        .route("/slashy/", post(pay))
        .with_state(up);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A running proxy: its addresses, and the switch that shuts it down.
pub(crate) struct Running {
    pub(crate) addr: SocketAddr,
    pub(crate) admin: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<Result<(), idem_proxy::ProxyError>>,
}

impl Running {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
    pub(crate) async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(20), self.done)
            .await
            .expect("the proxy stops within its grace")
            .unwrap()
            .unwrap();
    }
}

pub(crate) async fn proxy(toml: &str, store: Arc<dyn Store>) -> Running {
    observed_proxy(toml, store, None).await
}

/// [`proxy`], serving `/metrics` from `metrics`.
pub(crate) async fn observed_proxy(
    toml: &str,
    store: Arc<dyn Store>,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
) -> Running {
    let mut config = Config::parse("test.toml", toml).expect("a valid configuration");
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.admin_listen = "127.0.0.1:0".parse().unwrap();
    let mut proxy = Proxy::bind(config, "test.toml", store).await.unwrap();
    if let Some(handle) = metrics {
        proxy = proxy.metrics(handle);
    }
    let (addr, admin) = (proxy.local_addr(), proxy.admin_addr());
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(proxy.run(async move {
        let _ = stopped.await;
    }));
    Running {
        addr,
        admin,
        stop: Some(stop),
        done,
    }
}

/// An upstream, and a proxy in front of it on a memory store with the test configuration
/// and `extra` route settings.
pub(crate) async fn started(extra: &str) -> (Upstream, Running) {
    let up = Upstream::default();
    let running = proxy(
        &config(upstream(up.clone()).await, extra),
        Arc::new(MemoryStore::new()),
    )
    .await;
    (up, running)
}

pub(crate) fn config(upstream: SocketAddr, extra: &str) -> String {
    config_with(upstream, "", extra)
}

/// [`config`] with `top` among the file's top-level settings.
pub(crate) fn config_with(upstream: SocketAddr, top: &str, extra: &str) -> String {
    format!(
        r#"
        upstream = "http://{upstream}"
        upstream_timeout = "2s"
        connect_timeout = "500ms"
        shutdown_grace = "10s"
        {top}

        [defaults]
        scope = {{ header = "x-account-id" }}

        [[routes]]
        methods = ["POST"]
        path = "/payments"
        ignore_fields = ["sent_at"]
        {extra}
        "#
    )
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

pub(crate) async fn pay_once(
    url: &str,
    account: &str,
    key: Option<&str>,
    body: &str,
) -> (StatusCode, HeaderMap, String) {
    let mut request = client()
        .post(url)
        .header("x-account-id", account)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.expect("the proxy answers");
    let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap())
}

/// Sends `request` as raw bytes to `addr` and reads the answer until the server closes.
pub(crate) async fn raw(addr: SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the proxy answers and closes")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}
