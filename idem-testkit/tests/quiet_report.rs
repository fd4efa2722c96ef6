//! `Suite::run_all` keeps failures in its report: no panic message or backtrace of a
//! failing case reaches the test output. Alone in its binary, because the panic hook it
//! watches is process-wide.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Key, MemoryStore, Record, Store, StoreError, key::StepName, record::Lease, store::ClaimOutcome,
    store::ClaimRequest, store::RenewOutcome, store::WriteOutcome,
};
use idem_testkit::Suite;

/// The memory store, except that `get` never finds anything: many cases fail.
struct Forgetful(MemoryStore);

#[async_trait]
impl Store for Forgetful {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.0.claim(request).await
    }
    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.0.complete(lease, response).await
    }
    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.0.fail(lease, response).await
    }
    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        self.0.release(lease).await
    }
    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        self.0.renew(lease, extend).await
    }
    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        self.0.checkpoint(lease, step, value).await
    }
    async fn get(&self, _: &Key) -> Result<Option<Record>, StoreError> {
        Ok(None)
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.0.purge_expired(limit).await
    }
}

#[test]
fn failing_cases_print_nothing_outside_the_report() {
    let printed = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&printed);
    // Stands for the default hook, which would print the panic and its backtrace.
    std::panic::set_hook(Box::new(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    }));
    let report = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
        .block_on(Suite::new(|_| async { Forgetful(MemoryStore::new()) }).run_all());
    let during = printed.load(Ordering::SeqCst);
    // A panic outside a suite still reaches the hook the suite wrapped.
    let outside = std::panic::catch_unwind(|| panic!("outside"));
    let after = printed.load(Ordering::SeqCst);
    let _ = std::panic::take_hook();
    assert!(outside.is_err());
    assert!(report.failed().len() >= 5, "{report}");
    assert_eq!(
        during, 0,
        "a failing case reached the panic hook, and so the test output"
    );
    assert_eq!(after, 1, "panics outside a suite are printed as before");
}
