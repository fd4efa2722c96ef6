//! A message double that records how it was settled.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use idem_consumer::{DeadLetterReason, Message, SettleError, Settlement};
use idem_core::{Context, WorkError, WorkResult};

/// Work that counts its runs and answers the payload's length.
#[allow(dead_code)] // each test binary uses what it needs
pub(crate) fn counted(
    runs: &Arc<AtomicUsize>,
) -> impl Fn(Context, Bytes) -> std::future::Ready<WorkResult<usize, String>> + use<> {
    let runs = Arc::clone(runs);
    move |_ctx, payload| {
        runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(payload.len()))
    }
}

/// Work that counts its runs and fails for good on an empty order.
#[allow(dead_code)]
pub(crate) fn refusing_empty(
    runs: &Arc<AtomicUsize>,
) -> impl Fn(Context, Bytes) -> std::future::Ready<WorkResult<usize, String>> + use<> {
    let runs = Arc::clone(runs);
    move |_ctx, payload| {
        runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready(if payload.is_empty() {
            Err(WorkError::Permanent("an empty order".to_owned()))
        } else {
            Ok(payload.len())
        })
    }
}

/// How a [`TestMessage`] was settled.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(dead_code)] // each test binary uses what it needs
pub(crate) enum Settle {
    Ack,
    Nak(Duration),
    DeadLetter(DeadLetterReason),
}

/// One delivery: an id, a source, a payload, a delivery count, and a log of settlements.
pub(crate) struct TestMessage {
    pub(crate) id: Option<String>,
    pub(crate) source: String,
    pub(crate) payload: Bytes,
    pub(crate) delivered: Option<u64>,
    /// When set, every settlement fails with this broker error.
    pub(crate) refuse: bool,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) group: Option<String>,
    pub(crate) settled: Mutex<Vec<Settle>>,
}

#[allow(dead_code)]
impl TestMessage {
    pub(crate) fn new(id: &str, payload: &str) -> Self {
        Self {
            id: Some(id.to_owned()),
            source: "orders".to_owned(),
            payload: Bytes::from(payload.to_owned()),
            delivered: Some(1),
            refuse: false,
            headers: Vec::new(),
            group: None,
            settled: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn from(mut self, source: &str) -> Self {
        self.source = source.to_owned();
        self
    }

    pub(crate) fn delivered(mut self, count: u64) -> Self {
        self.delivered = Some(count);
        self
    }

    pub(crate) fn without_id(mut self) -> Self {
        self.id = None;
        self
    }

    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub(crate) fn in_group(mut self, group: &str) -> Self {
        self.group = Some(group.to_owned());
        self
    }

    pub(crate) fn refusing(mut self) -> Self {
        self.refuse = true;
        self
    }

    /// Every settlement so far.
    pub(crate) fn settlements(&self) -> Vec<Settle> {
        self.settled.lock().unwrap().clone()
    }

    fn record(&self, action: Settlement, settle: Settle) -> Result<(), SettleError> {
        if self.refuse {
            return Err(SettleError::broker(
                action,
                std::io::Error::other("broker away"),
            ));
        }
        self.settled.lock().unwrap().push(settle);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Message for TestMessage {
    fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    fn source(&self) -> &str {
        &self.source
    }

    fn payload(&self) -> &Bytes {
        &self.payload
    }

    fn delivery_count(&self) -> Option<u64> {
        self.delivered
    }

    fn ordering_key(&self) -> Option<&str> {
        self.group.as_deref()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(header, _)| header == name)
            .map(|(_, value)| value.as_str())
    }

    async fn ack(&self) -> Result<(), SettleError> {
        self.record(Settlement::Ack, Settle::Ack)
    }

    async fn nak(&self, delay: Duration) -> Result<(), SettleError> {
        self.record(Settlement::Nak, Settle::Nak(delay))
    }

    async fn dead_letter(&self, reason: DeadLetterReason) -> Result<(), SettleError> {
        self.record(Settlement::DeadLetter, Settle::DeadLetter(reason))
    }
}

/// The memory store, whose first `fail_claims` claims fail with an error a retry is not
/// expected to cure (a read-only replica during a failover, say), and whose claims and
/// completions each take `slow` (a store under load).
pub(crate) struct FailingClaims {
    inner: idem_core::MemoryStore,
    fail_claims: AtomicUsize,
    slow: Duration,
}

#[allow(dead_code)] // each test binary uses what it needs
impl FailingClaims {
    pub(crate) fn new(fail_claims: usize) -> Self {
        Self {
            inner: idem_core::MemoryStore::new(),
            fail_claims: AtomicUsize::new(fail_claims),
            slow: Duration::ZERO,
        }
    }

    pub(crate) fn slow(mut self, slow: Duration) -> Self {
        self.slow = slow;
        self
    }
}

#[async_trait::async_trait]
impl idem_core::Store for FailingClaims {
    async fn claim(
        &self,
        request: &idem_core::store::ClaimRequest,
    ) -> Result<idem_core::store::ClaimOutcome, idem_core::StoreError> {
        tokio::time::sleep(self.slow).await;
        if self
            .fail_claims
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(idem_core::StoreError::Backend {
                operation: idem_core::store::Operation::Claim,
                retryable: false,
                source: "cannot execute INSERT in a read-only transaction".into(),
            });
        }
        self.inner.claim(request).await
    }
    async fn complete(
        &self,
        lease: &idem_core::record::Lease,
        response: &[u8],
    ) -> Result<idem_core::store::WriteOutcome, idem_core::StoreError> {
        tokio::time::sleep(self.slow).await;
        self.inner.complete(lease, response).await
    }
    async fn fail(
        &self,
        lease: &idem_core::record::Lease,
        response: &[u8],
    ) -> Result<idem_core::store::WriteOutcome, idem_core::StoreError> {
        self.inner.fail(lease, response).await
    }
    async fn release(
        &self,
        lease: &idem_core::record::Lease,
    ) -> Result<idem_core::store::WriteOutcome, idem_core::StoreError> {
        self.inner.release(lease).await
    }
    async fn renew(
        &self,
        lease: &idem_core::record::Lease,
        extend: Duration,
    ) -> Result<idem_core::store::RenewOutcome, idem_core::StoreError> {
        self.inner.renew(lease, extend).await
    }
    async fn checkpoint(
        &self,
        lease: &idem_core::record::Lease,
        step: &idem_core::key::StepName,
        value: &[u8],
    ) -> Result<idem_core::store::WriteOutcome, idem_core::StoreError> {
        self.inner.checkpoint(lease, step, value).await
    }
    async fn get(
        &self,
        key: &idem_core::Key,
    ) -> Result<Option<idem_core::Record>, idem_core::StoreError> {
        self.inner.get(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, idem_core::StoreError> {
        self.inner.purge_expired(limit).await
    }
}

/// A consumer that dies after the result is stored and before its ack reaches the broker:
/// the delivery as it is, but its ack never leaves.
#[allow(dead_code)] // each test binary uses what it needs
pub(crate) struct AckLost<'a, M>(pub(crate) &'a M);

#[async_trait::async_trait]
impl<M: Message> Message for AckLost<'_, M> {
    fn id(&self) -> Option<&str> {
        self.0.id()
    }
    fn source(&self) -> &str {
        self.0.source()
    }
    fn payload(&self) -> &Bytes {
        self.0.payload()
    }
    fn delivery_count(&self) -> Option<u64> {
        self.0.delivery_count()
    }
    async fn ack(&self) -> Result<(), SettleError> {
        Ok(())
    }
    async fn nak(&self, delay: Duration) -> Result<(), SettleError> {
        self.0.nak(delay).await
    }
    async fn dead_letter(&self, reason: DeadLetterReason) -> Result<(), SettleError> {
        self.0.dead_letter(reason).await
    }
}
