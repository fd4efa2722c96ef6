//! The driver: claim, run the work once, store its result, replay it to every retry.
//!
//! - this file: [`Idempotency`], `execute`, `execute_bytes`.
//! - The builder, its defaults and their validation: `builder.rs`.
//! - One execution (key, budget, claim, work, heartbeat): `run.rs`; the claim and the
//!   wait for another attempt: `claim.rs`.
//! - Storing the result, the failure or a marker, and answering it as stored:
//!   `finish.rs`; writes that outlive the caller: `durable.rs`.
//! - Sagas: their types and checkpoints in `saga/mod.rs`, the compensation engine in
//!   `saga/engine.rs`.
//! - Store calls bounded and retried: `retry.rs`.
//! - What the work sees ([`Context`]): `context/`; errors: `error.rs`; the stored
//!   forms of values: `wire.rs`; metrics: [`observe`].

mod budget;
mod builder;
mod claim;
mod context;
mod durable;
mod error;
mod finish;
mod heartbeat;
mod key_policy;
pub mod observe;
mod outcome;
mod policy;
mod provider;
mod retry;
mod run;
mod saga;
mod wire;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

pub use budget::{DEFAULT_MAX_SCOPES, KeyBudget, TokenBucket};
pub use builder::IdempotencyBuilder;
pub use context::Context;
pub use error::{
    ConfigError, Error, Interrupted, InterruptedKind, Unstorable, WorkError, WorkResult,
    WorkResultExt, done,
};
pub use key_policy::{KeyPolicy, KeyPolicyError};
pub use outcome::Outcome;
pub use policy::{Heartbeat, InFlightPolicy};
pub use provider::{Provider, SettingsWarning};
pub use saga::{Compensation, FailedUndo};

pub(crate) use builder::Limits;
pub(crate) use error::{interruption_error, step_name};
pub(crate) use retry::retry_store;

use builder::Settings;
use wire::{Json, Raw, Wire};

use crate::{Fingerprint, Key, Store};

/// The default lease: how long one attempt owns a key before others may take over.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// The default retention: how long a result is replayed (24 hours).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// The default bound on one store call (10 s); see [`IdempotencyBuilder::store_timeout`].
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(10);
/// The default cap on a stored result (1 MiB).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// Room kept in a record with a size limit so that a failure marker always fits beside
/// the checkpoints.
pub(crate) const MARKER_RESERVE: usize = 512;
/// What idem's own checkpoints leave of that room: enough for the marker alone.
pub(crate) const OWN_RESERVE: usize = 128;

/// Runs work at most once per key and replays its result to every retry.
///
/// Cheap to clone (clones share the store), whatever the store; the default type,
/// `Idempotency` (that is `Idempotency<dyn Store>`, from [`Idempotency::into_dyn`]), suits
/// application state (an axum `State`, say) that should not name the store's type.
///
/// ```
/// use idem_core::{Fingerprint, Idempotency, Key, MemoryStore, Outcome, done};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let idem = Idempotency::new(MemoryStore::new());
/// let key = Key::new("acct_42/payments.create", "order-1187")?;
/// let request = serde_json::json!({"amount": 500, "currency": "EUR"});
///
/// let charge = || async { done("ch_1".to_string()) };
/// let first = idem.execute(&key, Fingerprint::of_json(&request)?, |_ctx| charge()).await?;
/// let retry = idem.execute(&key, Fingerprint::of_json(&request)?, |_ctx| charge()).await?;
/// assert_eq!(first, Outcome::Completed { value: "ch_1".to_string(), replayed: false });
/// assert_eq!(retry, Outcome::Completed { value: "ch_1".to_string(), replayed: true });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct Idempotency<S: ?Sized = dyn Store> {
    store: Arc<S>,
    /// The same store, as the trait object contexts hold.
    shared: Arc<dyn Store>,
    /// Shared by clones: a clone (one per request in a server) copies three pointers.
    settings: Arc<Settings>,
}

impl<S: ?Sized> Clone for Idempotency<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            shared: Arc::clone(&self.shared),
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<S: ?Sized> fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<S: Store + 'static> Idempotency<S> {
    /// A driver with the default lease (60 s), retention (24 h) and cap (1 MiB).
    pub fn new(store: S) -> Self {
        Self::with_settings(store, Settings::default())
    }

    fn with_settings(store: S, settings: Settings) -> Self {
        let store = Arc::new(store);
        Self {
            shared: store.clone(),
            store,
            settings: Arc::new(settings),
        }
    }

    /// Starts a builder with the defaults.
    pub fn builder(store: S) -> IdempotencyBuilder<S> {
        IdempotencyBuilder {
            store,
            settings: Settings::default(),
        }
    }

    /// The same driver over `Arc<dyn Store>`: one type whatever the store, for
    /// application state.
    ///
    /// ```
    /// use idem_core::{Idempotency, MemoryStore};
    ///
    /// #[derive(Clone)]
    /// struct AppState {
    ///     idem: Idempotency, // = Idempotency<dyn Store>
    /// }
    /// let state = AppState { idem: Idempotency::new(MemoryStore::new()).into_dyn() };
    /// # let _ = state.clone();
    /// ```
    pub fn into_dyn(self) -> Idempotency {
        Idempotency {
            store: Arc::clone(&self.shared),
            shared: self.shared,
            settings: self.settings,
        }
    }
}

impl<S: Store + 'static> From<Idempotency<S>> for Idempotency {
    /// [`Idempotency::into_dyn`].
    fn from(idem: Idempotency<S>) -> Self {
        idem.into_dyn()
    }
}

impl<S: Store + ?Sized + 'static> Idempotency<S> {
    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The lease each claim asks for.
    pub fn lease(&self) -> Duration {
        self.settings.lease
    }

    /// How long results are kept.
    pub fn retention(&self) -> Duration {
        self.settings.retention
    }

    /// A [`Context`] for work that runs outside any claim: shadow mode's handlers, dry
    /// runs. Nothing is read from or written to the store:
    ///
    /// - [`Context::step`] runs its closure every time and checkpoints nothing.
    /// - [`Context::token`] is 0 and [`Context::resumed`] is false.
    /// - [`Context::derive`] answers keys of this context alone (a random attempt id goes
    ///   into each), never a claimed record's and never another detached context's: two
    ///   requests never share a downstream key, and downstream calls are not
    ///   deduplicated across runs.
    ///
    /// ```
    /// use idem_core::{Fingerprint, Idempotency, Key, MemoryStore, WorkError};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let key = Key::new("payments", "p-1")?;
    /// let ctx = idem.detached_context(&key, Fingerprint::of_bytes("req"));
    /// let charged: u32 = ctx.step("charge", || async { Ok::<_, WorkError<()>>(7) }).await.unwrap();
    /// assert_eq!((charged, ctx.token()), (7, 0));
    /// let other = idem.detached_context(&key, Fingerprint::of_bytes("req"));
    /// assert_ne!(ctx.derive("charge"), other.derive("charge"));
    /// assert_eq!(idem.store().len(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn detached_context(&self, key: &Key, fingerprint: Fingerprint) -> Context {
        let now = crate::Timestamp::now();
        let lease =
            crate::record::Lease::new(key.clone(), 0, crate::record::AttemptId::random(), now, now);
        Context::detached(
            Arc::clone(&self.shared),
            lease,
            fingerprint,
            self.limits(),
            Arc::clone(&self.settings.codec),
        )
    }

    /// What [`IdempotencyBuilder::build`] found worth a look in the settings (also
    /// logged then).
    pub fn warnings(&self) -> &[SettingsWarning] {
        &self.settings.warnings
    }

    /// Runs `work` once for `key` and answers its outcome, or replays the stored one.
    ///
    /// - No record (or an absent one): claims the key, runs `work`, stores its result and
    ///   answers [`Outcome::Completed`] with `replayed: false`. The value answered is the
    ///   stored one, decoded: exactly what every retry will get.
    /// - Completed before with the same fingerprint: the stored result,
    ///   `replayed: true`; `work` does not run.
    /// - Failed permanently before: [`Outcome::Failed`] with the stored error,
    ///   `replayed: true`.
    /// - Another attempt holds a live lease: [`Error::InFlight`] with `retry_after`, or,
    ///   under [`InFlightPolicy::Wait`], a wait with backoff and jitter that ends in that
    ///   attempt's result (a replay), a takeover once its lease expires, or `InFlight` at
    ///   the timeout.
    /// - A different fingerprint under the same key: [`Error::Mismatch`].
    /// - An expired lease of another attempt: takes over ([`Context::resumed`] is true).
    /// - The claim fails in the store: [`Error::Store`]; `work` does not run (fail closed).
    /// - `work` returns [`WorkError::Permanent`]: the error is stored, [`Outcome::Failed`].
    /// - [`WorkError::Retryable`]: the lease is released, nothing is stored,
    ///   [`Outcome::Retryable`]. With no step checkpointed and no key derived the key is
    ///   forgotten, so the next call runs under any fingerprint; otherwise the next call
    ///   with the same fingerprint takes over, resumes and derives the same keys.
    /// - [`WorkError::Unknown`]: the lease is kept until it expires, [`Outcome::Unknown`].
    /// - A result or error that does not serialise, does not read back as its type, or
    ///   does not fit: stored as a permanent failure ([`Error::Unstorable`]) and
    ///   answered so to every retry; the work never runs
    ///   twice for it.
    /// - While `work` runs, the lease is renewed on the [`Heartbeat`] schedule, beside the
    ///   work (a slow renewal never stalls it). A fenced renewal marks the lease lost
    ///   ([`Context::lease_lost`] completes).
    /// - Another attempt took over meanwhile: [`Error::LeaseLost`]; nothing is stored.
    /// - The work completed the record itself inside its own transaction
    ///   ([`Context::prepare_completion`]): that stored result is the answer.
    ///
    /// If the returned future is dropped while `work` runs (a client disconnected), nothing
    /// is stored and the lease is kept: duplicates see in-flight until it expires, then a
    /// retry takes over (resuming through the checkpointed steps). The same holds if
    /// `work` panics. Once `work` has returned, dropping the future stops nothing: each
    /// write after the work (the result, the failure, a step's checkpoint, an undo and its
    /// marks) goes on in a task of its own and lands, and the whole compensation runs in
    /// one, so the work is not run again; only the Tokio runtime shutting down stops it
    /// (let a server drain its requests before the runtime ends). Poll the future to its
    /// end or drop it: like the heartbeat while `work` runs, a write after it advances only
    /// while the future is polled (or after it is dropped), so a future held unpolled
    /// longer than the lease's time left lets a retry take over. How long `execute` can
    /// take apart from the work is under [`IdempotencyBuilder::store_timeout`].
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn execute<T, E, F, Fut>(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        work: F,
    ) -> Result<Outcome<T, E>, Error>
    where
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        self.traced::<Json<T, E>, _, _>(key, fingerprint, work)
            .await
    }

    /// [`Idempotency::execute`] for work whose result is bytes already: they are stored
    /// and replayed exactly as they are, without serde. A permanent error's bytes are
    /// stored behind one tag byte.
    ///
    /// For protocols with their own encoding of a response (`idem-http` stores status,
    /// headers and body this way).
    ///
    /// ```
    /// use idem_core::{Fingerprint, Idempotency, Key, MemoryStore, WorkError};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let key = Key::new("webhooks/stripe", "evt_1")?;
    /// let work = |_ctx| async { Ok::<_, WorkError<Vec<u8>>>(b"\x00\xffraw".to_vec()) };
    /// let first = idem.execute_bytes(&key, Fingerprint::of_bytes("evt"), work).await?;
    /// let again = idem.execute_bytes(&key, Fingerprint::of_bytes("evt"), work).await?;
    /// assert_eq!(first.into_result(), Ok(b"\x00\xffraw".to_vec()));
    /// assert!(again.replayed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// See [`Error`].
    pub async fn execute_bytes<F, Fut>(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        work: F,
    ) -> Result<Outcome<Vec<u8>, Vec<u8>>, Error>
    where
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<Vec<u8>, WorkError<Vec<u8>>>>,
    {
        self.traced::<Raw, _, _>(key, fingerprint, work).await
    }

    async fn traced<W, F, Fut>(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        work: F,
    ) -> Result<Outcome<W::Value, W::Failure>, Error>
    where
        W: Wire,
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<W::Value, WorkError<W::Failure>>>,
    {
        let span = tracing::info_span!(
            "idem.execute",
            key = %HashedWhenShown(key),
            outcome = tracing::field::Empty,
        );
        // Boxed: `execute`'s future then holds its arguments, a pointer and the span,
        // which every caller's future holds and moves (200 bytes, where the claim's state
        // alone is over 1 000), for about 1 % more instructions per replay than the
        // copies it saves (BENCHMARKS.md, the driver's own cost).
        let result = Box::pin(self.run::<W, F, Fut>(key, fingerprint, work))
            .instrument(span.clone())
            .await;
        span.record("outcome", outcome_name(&result));
        result
    }
}

/// A key's short hash for a span, computed only if the span is shown: with no tracing
/// subscriber set, `tracing` evaluates a span's fields for `log` even when nothing logs
/// them, and the hash (a SHA-256) is then a few percent of a replay's own cost. (`Key`'s
/// own `Display` is as lazy, but writes `#` before the hash, which the field never had.)
struct HashedWhenShown<'a>(&'a Key);

impl fmt::Display for HashedWhenShown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.short_hash(), f)
    }
}

fn outcome_name<T, E>(result: &Result<Outcome<T, E>, Error>) -> &'static str {
    match result {
        Ok(Outcome::Completed {
            replayed: false, ..
        }) => "executed",
        Ok(Outcome::Completed { replayed: true, .. }) => "replayed",
        Ok(Outcome::Failed { replayed: true, .. })
        | Ok(Outcome::Compensated { replayed: true, .. }) => "replayed_failure",
        Ok(Outcome::Failed { .. }) => "failed",
        Ok(Outcome::Compensated { .. }) => "compensated",
        Ok(Outcome::Retryable(_)) => "retryable",
        Ok(Outcome::Unknown(_)) => "outcome_unknown",
        Err(err) if err.is_replay() => "replayed_failure",
        Err(Error::InFlight { .. }) => "in_flight",
        Err(Error::Mismatch) => "mismatch",
        Err(Error::KeyRefused(_)) => "key_refused",
        Err(Error::KeyBudgetExhausted { .. }) => "key_budget_exhausted",
        Err(Error::CompensationPending { .. }) => "compensation_pending",
        Err(Error::LeaseLost) => "lease_lost",
        Err(Error::Store(_)) => "store_error",
        Err(_) => "error",
    }
}
