//! What the tests share: a memory store with a fault per operation, the driver over it,
//! and the sagas the compensation tests run.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::record::ValuePart;
use idem_core::{
    Fingerprint, Heartbeat, Idempotency, Key, ManualClock, MemoryStore, Record, Store, StoreError,
    WorkError, key::StepName, record::Lease, store::ClaimOutcome, store::ClaimRequest,
    store::Operation, store::RenewOutcome, store::WriteOutcome,
};

/// What a [`Faulty`] store does to one kind of call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Passes the call through.
    None,
    /// Fails the next `n` calls before they apply.
    Refuse(usize),
    /// Applies the next call, then answers as if the connection broke.
    LoseAnswer,
    /// Never answers.
    Hang,
    /// Answers after this long (then applies).
    Slow(Duration),
    /// A `complete` or `fail` with more than this many bytes is `TooLarge`.
    FailLimit(usize),
    /// As `FailLimit`, after this long.
    SlowLimit(Duration, usize),
    /// Waits once, then panics.
    Panic,
}

/// The memory store with a fault per operation.
pub(crate) struct Faulty {
    pub(crate) inner: MemoryStore,
    faults: Mutex<Vec<(Operation, Fault)>>,
    /// What `max_record_bytes` declares.
    pub(crate) limit: Option<usize>,
}

impl Faulty {
    pub(crate) fn new(inner: MemoryStore) -> Self {
        Self {
            inner,
            faults: Mutex::new(Vec::new()),
            limit: None,
        }
    }

    pub(crate) fn set(&self, operation: Operation, fault: Fault) {
        let mut faults = self.faults.lock().unwrap();
        faults.retain(|(op, _)| *op != operation);
        faults.push((operation, fault));
    }

    fn fault(&self, operation: Operation) -> Fault {
        let mut faults = self.faults.lock().unwrap();
        let Some((_, fault)) = faults.iter_mut().find(|(op, _)| *op == operation) else {
            return Fault::None;
        };
        let now = *fault;
        *fault = match now {
            Fault::Refuse(n) if n > 1 => Fault::Refuse(n - 1),
            Fault::Refuse(_) | Fault::LoseAnswer => Fault::None,
            other => other,
        };
        now
    }

    async fn call<O>(
        &self,
        operation: Operation,
        size: usize,
        apply: impl std::future::Future<Output = Result<O, StoreError>>,
    ) -> Result<O, StoreError> {
        let broken = || StoreError::Unavailable {
            operation,
            source: "connection reset".into(),
        };
        let part = if operation == Operation::Fail {
            ValuePart::Failure
        } else {
            ValuePart::Result
        };
        match self.fault(operation) {
            Fault::None => apply.await,
            Fault::Refuse(_) => Err(broken()),
            Fault::LoseAnswer => {
                apply.await?;
                Err(broken())
            }
            Fault::Hang => std::future::pending().await,
            Fault::Slow(pause) => {
                tokio::time::sleep(pause).await;
                apply.await
            }
            Fault::FailLimit(limit) if size > limit => {
                Err(StoreError::TooLarge { part, size, limit })
            }
            Fault::FailLimit(_) => apply.await,
            Fault::Panic => {
                tokio::task::yield_now().await;
                panic!("the store panicked mid-call");
            }
            Fault::SlowLimit(pause, limit) => {
                tokio::time::sleep(pause).await;
                if size > limit {
                    return Err(StoreError::TooLarge { part, size, limit });
                }
                apply.await
            }
        }
    }
}

#[async_trait]
impl Store for Faulty {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.call(Operation::Claim, 0, self.inner.claim(request))
            .await
    }
    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        let apply = self.inner.complete(lease, response);
        self.call(Operation::Complete, response.len(), apply).await
    }
    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        let apply = self.inner.fail(lease, response);
        self.call(Operation::Fail, response.len(), apply).await
    }
    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        self.call(Operation::Release, 0, self.inner.release(lease))
            .await
    }
    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        self.call(Operation::Renew, 0, self.inner.renew(lease, extend))
            .await
    }
    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        let apply = self.inner.checkpoint(lease, step, value);
        self.call(Operation::Checkpoint, value.len(), apply).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }
    fn max_record_bytes(&self) -> Option<usize> {
        self.limit
    }
}

pub(crate) const LEASE: Duration = Duration::from_secs(30);
pub(crate) const TIMEOUT: Duration = Duration::from_secs(1);

pub(crate) fn key(name: &str) -> Key {
    Key::new("every-path", name).unwrap()
}

pub(crate) fn fp() -> Fingerprint {
    Fingerprint::of_bytes("request")
}

/// A driver over a shared faulty store on `clock`.
pub(crate) fn driver(store: &Arc<Faulty>) -> Idempotency<Arc<Faulty>> {
    Idempotency::builder(Arc::clone(store))
        .lease(LEASE)
        .heartbeat(Heartbeat::Off)
        .store_timeout(TIMEOUT)
        .build()
        .unwrap()
}

pub(crate) fn store_on(clock: &ManualClock) -> Arc<Faulty> {
    Arc::new(Faulty::new(MemoryStore::with_clock(clock.clone())))
}

/// A ledger of effects kept outside the store.
#[derive(Default, Clone)]
pub(crate) struct Ledger(Arc<Mutex<Vec<String>>>);

impl Ledger {
    pub(crate) fn add(&self, effect: &str) {
        self.0.lock().unwrap().push(effect.to_string());
    }
    pub(crate) fn count(&self, effect: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| *e == effect)
            .count()
    }
}

/// The work of [`saga_of`].
pub(crate) type SagaRun =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), WorkError<String>>> + Send>>;

/// A saga over a shared ledger: `steps`, each with an undo that logs `undo:NAME` after
/// `pause`, then a permanent failure.
pub(crate) fn saga_of(
    ledger: &Ledger,
    steps: &'static [&'static str],
    pause: Duration,
) -> impl FnOnce(idem_core::Context) -> SagaRun + Clone {
    let ledger = ledger.clone();
    move |ctx: idem_core::Context| {
        Box::pin(async move {
            for name in steps {
                let l = ledger.clone();
                ctx.step_with_undo(
                    name,
                    || async { Ok::<_, WorkError<String>>(()) },
                    move |()| async move {
                        tokio::time::sleep(pause).await;
                        l.add(&format!("undo:{name}"));
                        Ok(())
                    },
                )
                .await?;
            }
            Err(WorkError::Permanent("declined".to_string()))
        })
    }
}

/// A charge whose refund (logged `refund`) then hangs for ever when `hang` (the process
/// dies after the refund went out), and a permanent failure after it.
pub(crate) fn charge_then_decline(
    ledger: Ledger,
    hang: bool,
) -> impl FnOnce(idem_core::Context) -> SagaRun {
    charge_then_fail(ledger, hang, "declined".to_string())
}

/// [`charge_then_decline`], failing with `error`.
pub(crate) fn charge_then_fail(
    ledger: Ledger,
    hang: bool,
    error: String,
) -> impl FnOnce(idem_core::Context) -> SagaRun {
    move |ctx: idem_core::Context| {
        Box::pin(async move {
            ctx.step_with_undo(
                "charge",
                || async { Ok::<_, WorkError<String>>(()) },
                move |()| async move {
                    ledger.add("refund");
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    Ok(())
                },
            )
            .await?;
            Err(WorkError::Permanent(error))
        })
    }
}

/// A clock that follows the runtime's (paused) time, moved by a background task.
pub(crate) fn ticking(clock: &ManualClock) -> tokio::task::JoinHandle<()> {
    let clock = clock.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            clock.advance(Duration::from_millis(100));
        }
    })
}
