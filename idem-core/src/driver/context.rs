//! What the protected work receives: its lease, its steps, and the means to act on them.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use super::errors::{Interrupted, WorkError};
use super::observe;
use crate::{Key, Lease, Operation, StepName, Steps, Store, WriteOutcome};

/// Handed to the work by [`Idempotency::execute`](crate::Idempotency::execute).
///
/// Cheap to clone; clones share the same lease and steps.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    lease: Mutex<Lease>,
    resumed: bool,
    steps: Mutex<Steps>,
    lost: AtomicBool,
    lost_notify: Notify,
}

impl Context {
    pub(crate) fn new(store: Arc<dyn Store>, lease: Lease, resumed: bool, steps: Steps) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                lease: Mutex::new(lease),
                resumed,
                steps: Mutex::new(steps),
                lost: AtomicBool::new(false),
                lost_notify: Notify::new(),
            }),
        }
    }

    /// The key being executed.
    pub fn key(&self) -> Key {
        self.lease().key
    }

    /// The fencing token: strictly greater for every later owner of this key. Pass it to
    /// downstream systems that reject writes carrying a lower token than they have seen.
    pub fn token(&self) -> u64 {
        self.lease().token
    }

    /// True when this run took over from an earlier attempt whose lease ended: part of the
    /// work may already have happened (see [`Context::step`]).
    pub fn resumed(&self) -> bool {
        self.inner.resumed
    }

    /// The lease this run holds, as last renewed.
    pub fn lease(&self) -> Lease {
        self.inner
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The names of the steps checkpointed so far, by earlier owners or by this run.
    pub fn completed_steps(&self) -> Vec<String> {
        self.steps().keys().cloned().collect()
    }

    /// A stable idempotency key for calling another system on behalf of this execution:
    /// the same for every retry and takeover of this scope and key, different for each
    /// `label`, and not revealing the key itself.
    ///
    /// ```
    /// # use idem_core::{Idempotency, Key, Fingerprint, MemoryStore, WorkError};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let idem = Idempotency::new(MemoryStore::new());
    /// # let key = Key::new("acct_42/payments.create", "order-1187")?;
    /// let derived = idem
    ///     .execute(&key, Fingerprint::of_bytes("req"), |ctx| async move {
    ///         // Send this as the Idempotency-Key header of the ledger's debit call.
    ///         Ok::<_, WorkError<()>>(ctx.derive("debit"))
    ///     })
    ///     .await?;
    /// assert!(derived.value.starts_with("idem-"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn derive(&self, label: &str) -> String {
        let key = self.key();
        let digest = Sha256::new()
            .chain_update(b"idem.derive.v1")
            .chain_update((key.scope().len() as u64).to_be_bytes())
            .chain_update(key.scope())
            .chain_update((key.key().len() as u64).to_be_bytes())
            .chain_update(key.key())
            .chain_update(label)
            .finalize();
        let mut out = String::with_capacity(5 + 32);
        out.push_str("idem-");
        for byte in &digest[..16] {
            out.push_str(&format!("{byte:02x}"));
        }
        out
    }

    /// Runs the step `name` at most once across retries and takeovers.
    ///
    /// - A checkpoint for `name` exists (written by this run or an earlier owner): returns
    ///   its stored value; `run` does not run.
    /// - Otherwise runs `run`, checkpoints its value (fenced by the lease) and returns it.
    /// - `run` fails: its error is returned and nothing is checkpointed.
    /// - The checkpoint is fenced (another attempt took over): the lease is lost, and
    ///   [`WorkError::Interrupted`] says so; the other owner will run this step again, so
    ///   make the step's own effect idempotent downstream (see [`Context::derive`]).
    ///
    /// Use `?` on the result inside the work.
    ///
    /// # Errors
    /// `run`'s error, or [`WorkError::Interrupted`] for an invalid step name, a lost lease,
    /// a failed checkpoint write or a stored value of another type.
    pub async fn step<T, E, F, Fut>(&self, name: &str, run: F) -> Result<T, WorkError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let step = StepName::new(name).map_err(Interrupted::InvalidStepName)?;
        if let Some(stored) = self.steps().get(name) {
            return serde_json::from_slice(stored)
                .map_err(|source| WorkError::Interrupted(Interrupted::Codec(source)));
        }
        if self.is_lease_lost() {
            return Err(Interrupted::LeaseLost.into());
        }
        let value = run().await?;
        let bytes = serde_json::to_vec(&value).map_err(Interrupted::Codec)?;
        let lease = self.lease();
        match self.inner.store.checkpoint(&lease, &step, &bytes).await {
            Ok(WriteOutcome::Applied) => {
                self.inner
                    .steps
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(name.to_owned(), bytes);
                Ok(value)
            }
            Ok(WriteOutcome::Fenced) => {
                observe::count(observe::FENCED_WRITES);
                self.mark_lost();
                Err(Interrupted::LeaseLost.into())
            }
            Err(err) => {
                observe::store_error(Operation::Checkpoint);
                Err(Interrupted::Store(err).into())
            }
        }
    }

    /// True once the driver learned that another attempt took this key over.
    pub fn is_lease_lost(&self) -> bool {
        self.inner.lost.load(Ordering::SeqCst)
    }

    /// Completes when the lease is lost: `select!` on it to stop work that no longer
    /// counts. Never completes while the lease is held.
    pub async fn lease_lost(&self) {
        loop {
            let notified = self.inner.lost_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_lease_lost() {
                return;
            }
            notified.await;
        }
    }

    pub(crate) fn mark_lost(&self) {
        if !self.inner.lost.swap(true, Ordering::SeqCst) {
            observe::count(observe::LEASE_LOSSES);
        }
        self.inner.lost_notify.notify_waiters();
    }

    pub(crate) fn set_lease(&self, lease: Lease) {
        *self
            .inner
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = lease;
    }

    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    fn steps(&self) -> std::sync::MutexGuard<'_, Steps> {
        self.inner
            .steps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("key", &self.key())
            .field("token", &self.token())
            .field("resumed", &self.resumed())
            .field("lease_lost", &self.is_lease_lost())
            .finish()
    }
}
