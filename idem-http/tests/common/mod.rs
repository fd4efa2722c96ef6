//! A real server on 127.0.0.1 around a test handler, a real HTTP client, stores for every
//! backend, and a cut-able TCP proxy for "the store went away".

#![allow(dead_code)] // each test binary uses what it needs

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{self, get};
use axum::{Extension, Router};
use bytes::Bytes;
use idem_core::{Context, Idempotency, Store, WorkError};
use idem_http::{Disposition, IdempotencyLayer};
use idem_testkit::Namespace;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the test handler did, counted where the tests can read it.
#[derive(Clone, Default)]
pub(crate) struct Effects {
    /// Times the handler ran.
    pub(crate) runs: Arc<AtomicUsize>,
    /// Times the "charge" step ran.
    pub(crate) charges: Arc<AtomicUsize>,
}

impl Effects {
    pub(crate) fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    pub(crate) fn charges(&self) -> usize {
        self.charges.load(Ordering::SeqCst)
    }

    /// Waits (bounded: 2 s) until the handler has started `runs` times.
    pub(crate) async fn wait_for_runs(&self, runs: usize) {
        for _ in 0..200 {
            if self.runs() >= runs {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the handler did not start {runs} times within 2 s");
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The handler behind `POST /payments`, steered by request headers:
/// `x-sleep-ms`, `x-status`, `x-disposition` (store, release, hold), `x-response-bytes`,
/// `x-step` (charge through `ctx.step`), `x-hang` (never answer, after the step).
async fn pay(
    State(effects): State<Effects>,
    context: Option<Extension<Context>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let n = effects.runs.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(ms) = header(&headers, "x-sleep-ms").and_then(|v| v.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if header(&headers, "x-step").is_some() {
        let Extension(ctx) = context.expect("a protected request carries the context");
        let charges = Arc::clone(&effects.charges);
        let charged: Result<usize, WorkError<()>> = ctx
            .step("charge", || async move {
                Ok(charges.fetch_add(1, Ordering::SeqCst) + 1)
            })
            .await;
        assert!(charged.is_ok(), "the charge step failed");
    }
    if header(&headers, "x-hang").is_some() {
        std::future::pending::<()>().await;
    }
    let status = header(&headers, "x-status")
        .and_then(|v| v.parse().ok())
        .and_then(|v| StatusCode::from_u16(v).ok())
        .unwrap_or(StatusCode::CREATED);
    let body = match header(&headers, "x-response-bytes").and_then(|v| v.parse().ok()) {
        Some(len) => Bytes::from(
            (0..len)
                .map(|i: usize| (i % 251) as u8)
                .collect::<Vec<u8>>(),
        ),
        None => Bytes::from(format!(
            "{{\"payment\":{n},\"request_bytes\":{}}}",
            body.len()
        )),
    };
    let mut response = (status, body).into_response();
    let out = response.headers_mut();
    out.insert("content-type", HeaderValue::from_static("application/json"));
    out.insert(
        "location",
        HeaderValue::from_str(&format!("/payments/{n}")).unwrap(),
    );
    out.insert(
        "set-cookie",
        HeaderValue::from_static("session=secret; HttpOnly"),
    );
    out.insert("x-internal", HeaderValue::from_static("not-for-replay"));
    let disposition = match header(&headers, "x-disposition") {
        Some("store") => Some(Disposition::Store),
        Some("release") => Some(Disposition::Release),
        Some("hold") => Some(Disposition::Hold),
        _ => None,
    };
    if let Some(disposition) = disposition {
        response.extensions_mut().insert(disposition);
    }
    response
}

/// The scope: the `x-account` header, the method and the path.
pub(crate) fn scope(parts: &http::request::Parts) -> Result<String, idem_http::Problem> {
    let account = parts
        .headers
        .get("x-account")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("anonymous");
    Ok(format!(
        "{account}/{} {}",
        parts.method,
        idem_http::scope::path(parts)
    ))
}

/// A layer over `idem` with the test scope.
pub(crate) fn layer(idem: Idempotency) -> IdempotencyLayer {
    IdempotencyLayer::new(idem, |parts| Ok(scope(parts)?))
}

/// The test app: `POST /payments` (protected by `layer`) and `GET /health`.
pub(crate) fn app(layer: IdempotencyLayer, effects: Effects) -> Router {
    Router::new()
        .route("/payments", routing::post(pay).put(pay).delete(pay))
        .route("/health", get(|| async { "ok" }))
        .layer(layer)
        .with_state(effects)
}

/// A server on 127.0.0.1, on a port of its own.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    pub(crate) async fn start(app: Router) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind on loopback");
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("serve");
        });
        Self { addr, task }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A plain HTTP client: no proxy from the environment, loopback only.
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("an HTTP client")
}

/// A response, read whole.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: reqwest::header::HeaderMap,
    pub(crate) body: Bytes,
}

impl Answer {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub(crate) fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    /// The problem type's last part (`missing-key` ...), for problem+json answers.
    pub(crate) fn problem(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        let kind = self.json()["type"].as_str().unwrap_or_default().to_owned();
        kind.rsplit(':').next().unwrap_or_default().to_owned()
    }
}

/// A POST to `url` with `key` (when given), `body` and extra headers.
pub(crate) async fn post_with(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &str,
    headers: &[(&str, &str)],
) -> reqwest::Result<Answer> {
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.bytes().await?;
    Ok(Answer {
        status,
        headers,
        body,
    })
}

pub(crate) async fn post(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &str,
    headers: &[(&str, &str)],
) -> Answer {
    post_with(client, url, key, body, headers)
        .await
        .expect("the server answers")
}

// ---- stores -----------------------------------------------------------------------------

/// Makes stores for one backend: the same namespace gives the same records.
pub(crate) type Factory = Arc<dyn Fn(Namespace) -> futures_box::StoreFuture + Send + Sync>;

pub(crate) mod futures_box {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;

    use idem_core::Store;

    pub(crate) type StoreFuture = Pin<Box<dyn Future<Output = Arc<dyn Store>> + Send>>;
}

pub(crate) fn memory_factory() -> Factory {
    // Every store of one test shares the records: the same memory store.
    let stores: Arc<Mutex<std::collections::HashMap<Namespace, idem_core::MemoryStore>>> =
        Arc::default();
    Arc::new(move |namespace| {
        let store = stores.lock().unwrap().entry(namespace).or_default().clone();
        Box::pin(async move { Arc::new(store) as Arc<dyn Store> })
    })
}

pub(crate) fn sqlite_factory() -> Factory {
    let dir = std::env::temp_dir().join(format!("idem-http-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for test databases");
    Arc::new(move |namespace| {
        let path = dir.join(format!("{namespace}.db"));
        Box::pin(async move {
            Arc::new(idem_sqlite::SqliteStore::open(path).expect("a database file"))
                as Arc<dyn Store>
        })
    })
}

/// Namespaces whose table this process already emptied.
fn first_use(namespace: &Namespace) -> bool {
    static SEEN: Mutex<Option<HashSet<Namespace>>> = Mutex::new(None);
    SEEN.lock()
        .unwrap()
        .get_or_insert_with(HashSet::new)
        .insert(namespace.clone())
}

pub(crate) fn postgres_factory(url: String) -> Factory {
    Arc::new(move |namespace| {
        let url = url.clone();
        Box::pin(async move { Arc::new(postgres_store(&url, &namespace).await) as Arc<dyn Store> })
    })
}

pub(crate) async fn postgres_store(
    url: &str,
    namespace: &Namespace,
) -> idem_postgres::PostgresStore {
    use idem_postgres::sqlx;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .expect("connect to the test PostgreSQL");
    let store = idem_postgres::PostgresStore::builder(pool)
        .table(namespace.as_str())
        .expect("a valid table name")
        .build();
    if first_use(namespace) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS \"{namespace}\""
        )))
        .execute(store.pool())
        .await
        .expect("drop a stale table");
    }
    store.migrate().await.expect("migrate");
    store
}

pub(crate) fn redis_factory(url: String) -> Factory {
    Arc::new(move |namespace| {
        let url = url.clone();
        Box::pin(async move {
            Arc::new(
                idem_redis::RedisStore::standalone(&url)
                    .await
                    .expect("connect to the test Redis")
                    .with_prefix(namespace.as_str())
                    .expect("a valid prefix"),
            ) as Arc<dyn Store>
        })
    })
}

// ---- a proxy to cut ------------------------------------------------------------------------

/// A TCP proxy on 127.0.0.1 in front of `target` (a loopback address), until `cut`.
pub(crate) struct Proxy {
    pub(crate) addr: SocketAddr,
    task: JoinHandle<()>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    pub(crate) async fn start(target: SocketAddr) -> Self {
        assert!(target.ip().is_loopback(), "tests reach loopback only");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let open = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let Ok(mut server) = TcpStream::connect(target).await else {
                    continue;
                };
                let pipe = tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
                open.lock().unwrap().push(pipe);
            }
        });
        Self {
            addr,
            task,
            connections,
        }
    }

    /// Refuses new connections and drops the open ones: the server is gone.
    pub(crate) fn cut(&self) {
        self.task.abort();
        for pipe in self.connections.lock().unwrap().drain(..) {
            pipe.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
    }
}

/// The loopback address in a service URL such as `redis://127.0.0.1:56379`.
pub(crate) fn address_of(url: &str) -> SocketAddr {
    let rest = url.split("://").nth(1).unwrap_or(url);
    let rest = rest.rsplit('@').next().unwrap_or(rest);
    let host_port = rest.split(['/', '?']).next().unwrap_or(rest);
    host_port.parse().expect("a loopback address with a port")
}

/// `url` with its host and port replaced by `addr`.
pub(crate) fn url_through(url: &str, addr: SocketAddr) -> String {
    let original = address_of(url).to_string();
    url.replacen(&original, &addr.to_string(), 1)
}

/// A closure for work that cannot fail, for handlers that use the driver directly.
pub(crate) fn ok<T>(value: T) -> Result<T, WorkError<()>> {
    Ok(value)
}
