//! The proxy's life: a shutdown that lets the request in flight finish, health and
//! readiness on the admin listener.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use idem_core::{MemoryStore, Store};

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_lets_the_request_in_flight_finish_and_store_its_answer() {
    let up = Upstream::default();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let addr = upstream(up.clone()).await;
    let first = proxy(&config(addr, ""), Arc::clone(&store)).await;
    *up.delay.lock().unwrap() = Duration::from_millis(800);
    let url = first.url("/payments");
    let arrived = up.arrived.notified();
    let in_flight = tokio::spawn(async move { pay_once(&url, "acct_1", Some("k10"), "{}").await });
    tokio::time::timeout(Duration::from_secs(10), arrived)
        .await
        .expect("the request reaches the upstream");
    let admin = first.admin;
    // Readiness turns 503 as the shutdown begins, while the request runs on.
    let stop = tokio::spawn(first.shutdown());
    let mut not_ready = false;
    for _ in 0..40 {
        let ready = client()
            .get(format!("http://{admin}/readyz"))
            .send()
            .await
            .expect("the admin listener serves until the requests in flight are done");
        if ready.status().as_u16() == 503 {
            not_ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(not_ready, "/readyz turned 503 once the shutdown began");
    let answered = in_flight.await.unwrap();
    assert_eq!(answered.0, StatusCode::CREATED, "{answered:?}");
    stop.await.unwrap();

    // Another replica on the same store replays it.
    *up.delay.lock().unwrap() = Duration::ZERO;
    let second = proxy(&config(addr, ""), store).await;
    let replay = pay_once(&second.url("/payments"), "acct_1", Some("k10"), "{}").await;
    assert_eq!(replay.2, answered.2);
    assert_eq!(replay.1["idempotent-replayed"], "true");
    assert_eq!(up.runs("k10"), 1);
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_readiness_answer_on_the_admin_listener() {
    let up = Upstream::default();
    let proxy = proxy(
        &config(upstream(up).await, ""),
        Arc::new(MemoryStore::new()),
    )
    .await;
    let health = client()
        .get(format!("http://{}/healthz", proxy.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let ready = client()
        .get(format!("http://{}/readyz", proxy.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    // No recorder was given in this process: /metrics says so.
    let metrics = client()
        .get(format!("http://{}/metrics", proxy.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status().as_u16(), 404);
    proxy.shutdown().await;
}
