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
