//! Counting store calls, for the backends without a network to count round trips on.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Key, Record, Store, StoreError, key::StepName, record::Lease, store::ClaimOutcome,
    store::ClaimRequest, store::RenewOutcome, store::WriteOutcome,
};

/// A store that counts every call it forwards.
pub(crate) struct CountingStore<S> {
    inner: S,
    calls: Arc<AtomicU64>,
}

impl<S> CountingStore<S> {
    pub(crate) fn new(inner: S, calls: Arc<AtomicU64>) -> Self {
        Self { inner, calls }
    }

    fn count(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl<S: Store> Store for CountingStore<S> {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.count();
        self.inner.claim(request).await
    }
    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.count();
        self.inner.complete(lease, response).await
    }
    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.count();
        self.inner.fail(lease, response).await
    }
    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        self.count();
        self.inner.release(lease).await
    }
    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        self.count();
        self.inner.renew(lease, extend).await
    }
    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        self.count();
        self.inner.checkpoint(lease, step, value).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.count();
        self.inner.get(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.count();
        self.inner.purge_expired(limit).await
    }
    fn expiry(&self) -> idem_core::store::Expiry {
        self.inner.expiry()
    }
    fn max_record_bytes(&self) -> Option<usize> {
        self.inner.max_record_bytes()
    }
}
