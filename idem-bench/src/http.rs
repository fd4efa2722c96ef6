//! The HTTP layer against the bare handler: the same tiny POST handler behind axum on
//! 127.0.0.1, once with `idem-http`'s layer over the memory store and once without, driven
//! by the same HTTP client. The handler reads the request body whole on both sides, so the
//! comparison does not charge the layer for a read the bare side skips: behind the layer
//! it reads the copy the layer hands on after fingerprinting it.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::post;
use idem_core::{Idempotency, MemoryStore};
use idem_http::IdempotencyLayer;
use tokio::net::TcpListener;

use crate::target::{BoxError, Done, RESPONSE, Target};

/// The request body every POST carries.
const REQUEST: &[u8] = br#"{"amount":500,"currency":"EUR"}"#;

/// The handler: the work a payment endpoint does is elsewhere; this reads the body whole,
/// as a real one would before acting on it, and answers at once. A body that is not the one
/// sent fails the run, so the layered side cannot pass on a body it lost.
async fn checkout(body: Bytes) -> (StatusCode, [(&'static str, &'static str); 1], &'static [u8]) {
    if body.as_ref() != REQUEST {
        return (
            StatusCode::BAD_REQUEST,
            [("content-type", "text/plain")],
            b"not the request body sent",
        );
    }
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        RESPONSE,
    )
}

/// Serves `app` on 127.0.0.1 for as long as the process runs.
async fn serve(app: Router) -> Result<SocketAddr, BoxError> {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

/// POSTs to a server, with the key in `Idempotency-Key` when the layer is in front.
pub(crate) struct HttpTarget {
    client: reqwest::Client,
    url: String,
    layered: bool,
    /// For the bare handler, which has no memory: which keys the client sent before, so
    /// the workloads' checks of fresh and replayed keys hold.
    seen: Mutex<HashSet<String>>,
    pub(crate) requests: Arc<AtomicU64>,
}

#[async_trait]
impl Target for HttpTarget {
    async fn execute(&self, key: &str) -> Result<Done, BoxError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut request = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .body(REQUEST);
        if self.layered {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let replayed = response.headers().contains_key(idem_http::REPLAYED_HEADER);
        let body = response.bytes().await?;
        match status {
            200 if body.as_ref() == RESPONSE => {}
            409 => return Ok(Done::Busy),
            other => return Err(format!("the server answered {other}").into()),
        }
        if self.layered {
            return Ok(if replayed {
                Done::Replayed
            } else {
                Done::Executed
            });
        }
        let first = self
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.to_owned());
        Ok(if first {
            Done::Executed
        } else {
            Done::Replayed
        })
    }
}

/// The layered and the bare server, and a client for each.
pub(crate) async fn targets() -> Result<(Arc<HttpTarget>, Arc<HttpTarget>), BoxError> {
    let idem = Idempotency::new(MemoryStore::new());
    let layered = Router::new().route(
        "/checkout",
        post(checkout).layer(IdempotencyLayer::new(idem, |parts| {
            Ok(format!("bench/{} {}", parts.method, parts.uri.path()))
        })),
    );
    let bare = Router::new().route("/checkout", post(checkout));
    let target = |addr: SocketAddr, layered| -> Result<Arc<HttpTarget>, BoxError> {
        Ok(Arc::new(HttpTarget {
            client: reqwest::Client::builder().no_proxy().build()?,
            url: format!("http://{addr}/checkout"),
            layered,
            seen: Mutex::default(),
            requests: Arc::default(),
        }))
    };
    Ok((
        target(serve(layered).await?, true)?,
        target(serve(bare).await?, false)?,
    ))
}
