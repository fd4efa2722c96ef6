//! Helpers the traffic tests share: a memory store with a lease of its own, clients that
//! leave early, and waiting for the handlers they left.

use std::time::Duration;

use idem_core::{Idempotency, MemoryStore};

use crate::common::client;

/// Waits for the handler a client left to be moved to a task of its own (the server sees
/// the disconnect a little after the client gives up), then for it to end; both bounded.
pub(super) async fn finished_after_leaving(handlers: &idem_http::Handlers) {
    for _ in 0..200 {
        if handlers.running() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::timeout(Duration::from_secs(10), handlers.wait())
        .await
        .expect("the handler ends");
}

/// A client that gives up after `after`, as a timeout layer or an impatient caller does.
pub(super) fn impatient(after: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(after)
        .build()
        .unwrap()
}

/// Starts a streamed answer under `key`, reads its first chunk (bounded: 10 s) and
/// goes away.
pub(super) async fn read_one_chunk_and_leave(url: &str, key: &str) {
    let mut first = client()
        .post(url)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    let chunk = tokio::time::timeout(Duration::from_secs(10), first.chunk())
        .await
        .expect("a first chunk comes")
        .unwrap();
    assert!(chunk.is_some());
}

pub(super) fn idem(lease: Duration) -> Idempotency {
    Idempotency::builder(MemoryStore::new())
        .lease(lease)
        .build()
        .unwrap()
        .into_dyn()
}
