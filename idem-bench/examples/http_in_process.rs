//! The HTTP layer's own cost, without HTTP: the same handler as the `http` benchmark,
//! layered over the memory store and bare, called in process through tower's `oneshot`
//! (axum's router, no sockets, no client). What is left is the layer's work per request.
//!
//! ```sh
//! cargo run --release -p idem-bench --example http_in_process            # 20 000 requests a row
//! cargo run --release -p idem-bench --example http_in_process -- 100000  # more
//! ```
//!
//! Two runs: one task on a current-thread runtime (the time per request), then 16 tasks
//! on two worker threads (wall time per request, both threads busy). Each row is run three
//! times; compare the best, and only runs made back to back.

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use axum::routing::post;
use idem_core::{Idempotency, MemoryStore};
use idem_http::IdempotencyLayer;
use tower::ServiceExt;

const REQUEST: &[u8] = br#"{"amount":500,"currency":"EUR"}"#;
const RESPONSE: &[u8] = br#"{"receipt":"r-1","amount":500,"ok":1}"#;

/// The `http` benchmark's handler: reads the body whole and answers at once.
async fn checkout(body: Bytes) -> (StatusCode, [(&'static str, &'static str); 1], &'static [u8]) {
    if body.as_ref() != REQUEST {
        return (
            StatusCode::BAD_REQUEST,
            [("content-type", "text/plain")],
            b"",
        );
    }
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        RESPONSE,
    )
}

fn request(key: Option<&str>) -> Request<Body> {
    let mut builder = Request::post("/checkout").header("content-type", "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", format!("\"{key}\""));
    }
    builder.body(Body::from(REQUEST)).expect("a valid request")
}

/// The layered and the bare router, each turned into routes once (as `axum::serve` does).
fn apps() -> (Router, Router) {
    let idem = Idempotency::new(MemoryStore::new());
    let layered = Router::new()
        .route(
            "/checkout",
            post(checkout).layer(IdempotencyLayer::new(idem, |parts| {
                Ok(format!("bench/{} {}", parts.method, parts.uri.path()))
            })),
        )
        .with_state(());
    let bare = Router::new()
        .route("/checkout", post(checkout))
        .with_state(());
    (layered, bare)
}

/// The key of request `i` of task `task` in `row`: none, a new one, or one key replayed.
fn key(row: &str, round: usize, task: usize, i: usize) -> Option<String> {
    match row {
        "fresh" => Some(format!("fresh-{round}-{task}-{i}")),
        "replay" => Some(format!("replay-{task}")),
        _ => None,
    }
}

async fn call(app: &Router, key: Option<&str>) {
    let response = app.clone().oneshot(request(key)).await.expect("infallible");
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "the benchmark's handler refused"
    );
    let _ = axum::body::to_bytes(response.into_body(), usize::MAX).await;
}

async fn rows(n: usize, tasks: usize, label: &str) {
    let (layered, bare) = apps();
    // Warm: the replayed keys exist before they are timed.
    for task in 0..tasks {
        call(&layered, key("replay", 0, task, 0).as_deref()).await;
    }
    for round in 0..3 {
        for (row, app) in [("bare", &bare), ("fresh", &layered), ("replay", &layered)] {
            let started = Instant::now();
            let running: Vec<_> = (0..tasks)
                .map(|task| {
                    let app = app.clone();
                    tokio::spawn(async move {
                        for i in 0..n / tasks {
                            call(&app, key(row, round, task, i).as_deref()).await;
                        }
                    })
                })
                .collect();
            for task in running {
                task.await.expect("no panic");
            }
            let per = started.elapsed() / u32::try_from(n).unwrap_or(u32::MAX);
            println!("{label} {row:6} {:6.2} µs/request", micros(per));
        }
    }
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(20_000);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(rows(n, 1, "1 task,  1 thread: "));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(rows(n, 16, "16 tasks, 2 threads:"));
}
