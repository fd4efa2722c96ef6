//! The store is unavailable: 503 with `Retry-After`, and the handler does not run. On the
//! memory store (a store that is down), SQLite (a write lock held by another connection),
//! PostgreSQL and Redis (the connection cut by a proxy on loopback).

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::{Effects, Proxy, Server, app, client, layer, post};
use idem_core::{
    Idempotency, Key, Record, Store, StoreError, key::StepName, record::Lease, store::ClaimOutcome,
    store::ClaimRequest, store::Operation, store::RenewOutcome, store::WriteOutcome,
};
use idem_testkit::Namespace;

async fn assert_unavailable(store: Arc<dyn Store>) {
    let idem = Idempotency::new(store);
    let effects = Effects::default();
    let server = Server::start(app(layer(idem.into_dyn()), effects.clone())).await;
    let answer = post(
        &client(),
        &server.url("/payments"),
        Some("k-503"),
        "{}",
        &[],
    )
    .await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.problem(), "store-unavailable");
    let retry_after: u64 = answer.header("retry-after").unwrap().parse().unwrap();
    assert!(retry_after >= 1);
    assert_eq!(
        effects.runs(),
        0,
        "the handler does not run without a claim"
    );
}

/// A store whose backend is down.
struct Down;

#[async_trait]
impl Store for Down {
    async fn claim(&self, _: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        Err(StoreError::Unavailable {
            operation: Operation::Claim,
            source: "connection refused".into(),
        })
    }
    async fn complete(&self, _: &Lease, _: &[u8]) -> Result<WriteOutcome, StoreError> {
        unreachable!("no claim, no write")
    }
    async fn fail(&self, _: &Lease, _: &[u8]) -> Result<WriteOutcome, StoreError> {
        unreachable!("no claim, no write")
    }
    async fn release(&self, _: &Lease) -> Result<WriteOutcome, StoreError> {
        unreachable!("no claim, no write")
    }
    async fn renew(&self, _: &Lease, _: Duration) -> Result<RenewOutcome, StoreError> {
        unreachable!("no claim, no write")
    }
    async fn checkpoint(
        &self,
        _: &Lease,
        _: &StepName,
        _: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        unreachable!("no claim, no write")
    }
    async fn get(&self, _: &Key) -> Result<Option<Record>, StoreError> {
        Ok(None)
    }
    async fn purge_expired(&self, _: usize) -> Result<usize, StoreError> {
        Ok(0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory() {
    assert_unavailable(Arc::new(Down)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_with_its_write_lock_held_elsewhere() {
    let path = std::env::temp_dir().join(format!("idem-http-503-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let store = idem_sqlite::SqliteStore::builder(&path)
        .busy_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    // Another process holds the write lock for the whole test.
    let holder = idem_sqlite::rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    assert_unavailable(Arc::new(store)).await;
    holder.execute_batch("ROLLBACK").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_whose_connection_is_cut() {
    let Some(url) = idem_testkit::service_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let proxy = Proxy::start(common::address_of(&url)).await;
    let store =
        common::postgres_store(&common::url_through(&url, proxy.addr), &Namespace::fresh()).await;
    proxy.cut();
    assert_unavailable(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_whose_connection_is_cut() {
    let Some(url) = idem_testkit::service_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let proxy = Proxy::start(common::address_of(&url)).await;
    let store = idem_redis::RedisStore::standalone(&common::url_through(&url, proxy.addr))
        .await
        .unwrap()
        .with_prefix(Namespace::fresh().as_str())
        .unwrap();
    proxy.cut();
    assert_unavailable(Arc::new(store)).await;
}
