//! The storm over HTTP: the checkout service behind axum on 127.0.0.1, protected by
//! `idem-http`'s layer or not, and clients that send real requests with real timeouts and
//! disconnect when they run out.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use idem_client::{IdempotencyKey, IdempotencyMiddleware, RetryPolicy};
use idem_core::{Context, Idempotency};
use idem_http::{Disposition, IdempotencyLayer};
use idem_sqlite::SqliteStore;
use idem_sqlite::rusqlite::{Connection, TransactionBehavior, params};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::checkout::{self, Answer, Audit, Checkout, Counters};

/// How long a crashed worker holds an order before a retry may take over.
const LEASE: Duration = Duration::from_millis(250);
/// How long a client waits for an answer before it gives up and disconnects.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(50);

#[derive(Deserialize)]
struct Charge {
    cents: u64,
}

#[derive(Serialize)]
struct Receipt {
    order: String,
    cents: u64,
    payment: i64,
}

/// The server's side: the ledger, and what it saw.
struct Ledger {
    conn: Mutex<Connection>,
    /// Executions that took over an order a crashed worker held.
    takeovers: AtomicU64,
    /// Debits the ledger's unique debit key refused: a second execution of one order's
    /// work. Zero means idem alone kept every order to one debit.
    refused: AtomicU64,
}

/// A payment provider's round trip.
async fn provider_latency() {
    tokio::time::sleep(Duration::from_millis(3)).await;
}

/// `POST /checkout/{order}`: charge, then debit the ledger. `x-crash: 1` makes the worker
/// die after the provider call, before the debit: nothing is debited and nothing answered
/// in time (a 500 after the client's timeout, whose outcome the layer holds as unknown).
async fn checkout_handler(
    State(ledger): State<Arc<Ledger>>,
    UrlPath(order): UrlPath<String>,
    context: Option<Extension<Context>>,
    headers: HeaderMap,
    Json(charge): Json<Charge>,
) -> Response {
    provider_latency().await;
    if headers.contains_key("x-crash") {
        tokio::time::sleep(CLIENT_TIMEOUT + Duration::from_millis(10)).await;
        let mut response = StatusCode::INTERNAL_SERVER_ERROR.into_response();
        response.extensions_mut().insert(Disposition::Hold);
        return response;
    }
    // Under idem, each execution of an order's work has one debit key (the same across a
    // takeover): the ledger's unique constraint would refuse a second debit, and the
    // refusals are counted, so the audit shows whether idem alone held.
    let debit_key = context.map(|Extension(ctx)| {
        if ctx.resumed() {
            ledger.takeovers.fetch_add(1, Ordering::Relaxed);
        }
        ctx.derive("debit")
    });
    let cents = charge.cents;
    let debited = tokio::task::spawn_blocking({
        let (ledger, order) = (Arc::clone(&ledger), order.clone());
        move || -> Result<Option<i64>, idem_sqlite::rusqlite::Error> {
            let mut conn = ledger.conn.lock().unwrap_or_else(PoisonError::into_inner);
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let inserted = tx.execute(
                "INSERT INTO ledger (order_id, cents, debit_key) VALUES (?1, ?2, ?3)
                 ON CONFLICT (debit_key) DO NOTHING",
                params![order, cents as i64, debit_key],
            )?;
            let payment = (inserted == 1).then(|| tx.last_insert_rowid());
            tx.commit()?;
            Ok(payment)
        }
    })
    .await;
    match debited {
        Ok(Ok(Some(payment))) => (
            StatusCode::CREATED,
            Json(Receipt {
                order,
                cents,
                payment,
            }),
        )
            .into_response(),
        Ok(Ok(None)) => {
            ledger.refused.fetch_add(1, Ordering::Relaxed);
            StatusCode::CONFLICT.into_response()
        }
        // Nothing was debited: the client may try again.
        _ => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// The checkout service on 127.0.0.1, and the client side of it.
pub(crate) struct HttpShop {
    ledger: Arc<Ledger>,
    client: ClientWithMiddleware,
    url: String,
    protected: bool,
    counters: Arc<Counters>,
    server: JoinHandle<()>,
}

impl HttpShop {
    /// The service protected by idem's layer over SQLite (records and ledger in one file).
    pub(crate) async fn protected(path: &Path) -> Result<Self, Box<dyn std::error::Error>> {
        let idem = Idempotency::builder(SqliteStore::open(path)?)
            .lease(LEASE)
            .build()?;
        let layer = IdempotencyLayer::new(idem, |parts| {
            Ok(format!("shop/checkout {}", idem_http::scope::path(parts)))
        });
        Self::start(path, Some(layer)).await
    }

    /// The same service without it.
    pub(crate) async fn unprotected(path: &Path) -> Result<Self, Box<dyn std::error::Error>> {
        Self::start(path, None).await
    }

    async fn start(
        path: &Path,
        layer: Option<IdempotencyLayer>,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let conn = crate::checkout::open_ledger(path)?;
        let ledger = Arc::new(Ledger {
            conn: Mutex::new(conn),
            takeovers: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let protected = layer.is_some();
        let route = match layer {
            Some(layer) => post(checkout_handler).layer(layer),
            None => post(checkout_handler),
        };
        let app = Router::new()
            .route("/checkout/{order}", route)
            .with_state(Arc::clone(&ledger));
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let counters = Arc::new(Counters::default());
        let inner = reqwest::Client::builder()
            .no_proxy()
            .timeout(CLIENT_TIMEOUT)
            .build()?;
        // idem-client resends a timed-out or in-flight order with its key, as a real
        // caller would; without idem (no key) a POST is sent once, and the storm resends.
        let client = ClientBuilder::new(inner)
            .with(
                IdempotencyMiddleware::new()
                    .without_automatic_keys()
                    .policy(
                        RetryPolicy::default()
                            .max_attempts(50)
                            .backoff(Duration::from_millis(5), Duration::from_millis(20))
                            .deadline(Duration::from_secs(10)),
                    ),
            )
            .with(Tries {
                counters: Arc::clone(&counters),
            })
            .build();
        Ok(Self {
            ledger,
            client,
            url,
            protected,
            counters,
            server,
        })
    }

    /// Executions that took over an order a crashed worker held.
    fn takeovers(&self) -> u64 {
        self.ledger.takeovers.load(Ordering::Relaxed)
    }

    async fn answer(&self, order: &str, cents: u64, crash: bool) -> Answer {
        let mut request = self
            .client
            .post(format!("{}/checkout/{order}", self.url))
            .header("content-type", "application/json")
            .body(format!("{{\"cents\":{cents}}}"));
        if self.protected {
            // One key per order, kept across every try: what a careful caller does.
            match IdempotencyKey::new(order) {
                Ok(key) => request = request.with_extension(key),
                Err(_) => return Answer::Retry,
            }
        }
        if crash {
            request = request.with_extension(CrashFirst::default());
        }
        let result = request.send().await;
        let answer = answer_of(&result, crash).0;
        if let Ok(response) = result {
            // The body finishes the exchange; a client that stops reading here disconnects.
            let _ = response.bytes().await;
        }
        answer
    }
}

/// What one try (or the last try of a send) came to, and whether it was a replay.
fn answer_of(
    result: &reqwest_middleware::Result<reqwest::Response>,
    crash: bool,
) -> (Answer, bool) {
    let response = match result {
        Ok(response) => response,
        // The client gave up waiting and disconnected.
        Err(reqwest_middleware::Error::Reqwest(err)) if err.is_timeout() => {
            return (
                if crash {
                    Answer::Crashed
                } else {
                    Answer::TimedOut
                },
                false,
            );
        }
        Err(_) => return (Answer::Retry, false),
    };
    let replayed = response.headers().contains_key(idem_http::REPLAYED_HEADER);
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_millis(20), Duration::from_secs);
    let answer = match response.status().as_u16() {
        201 => Answer::Paid,
        409 => Answer::InFlight(retry_after),
        422 => Answer::Conflict,
        _ => Answer::Retry,
    };
    (answer, replayed)
}

/// Marks a send whose first try makes the worker crash (`x-crash: 1`); later tries of the
/// same send go without it, as a real crash happens once.
#[derive(Clone, Default)]
struct CrashFirst(Arc<AtomicBool>);

/// Below idem-client's middleware, so it sees every try: counts each try's answer (every
/// request sent is counted once) and makes the first try of a crashing send crash.
struct Tries {
    counters: Arc<Counters>,
}

#[async_trait::async_trait]
impl Middleware for Tries {
    async fn handle(
        &self,
        mut request: reqwest::Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let crash = extensions
            .get::<CrashFirst>()
            .is_some_and(|first| !first.0.swap(true, Ordering::SeqCst));
        if crash {
            request
                .headers_mut()
                .insert("x-crash", http::HeaderValue::from_static("1"));
        }
        let result = next.run(request, extensions).await;
        let (answer, replayed) = answer_of(&result, crash);
        self.counters.count(&answer, replayed);
        result
    }
}

impl Checkout for HttpShop {
    async fn request(&self, order: &str, cents: u64, crash: bool) -> Answer {
        // Each try was counted as it was answered, below idem-client's retries.
        self.answer(order, cents, crash).await
    }

    fn counters(&self) -> &Counters {
        // Takeovers happen on the server; the summary reads them with the answers.
        self.counters
            .takeovers
            .store(self.takeovers(), Ordering::Relaxed);
        &self.counters
    }

    fn refused_by_the_ledger(&self) -> Option<u64> {
        Some(self.ledger.refused.load(Ordering::Relaxed))
    }

    fn audit(&self) -> Result<Audit, Box<dyn std::error::Error>> {
        let conn = self
            .ledger
            .conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(checkout::audit(&conn)?)
    }
}

impl Drop for HttpShop {
    fn drop(&mut self) {
        self.server.abort();
    }
}
