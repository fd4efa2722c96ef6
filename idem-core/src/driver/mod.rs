//! The driver: claim, run the work once, store its result, replay it to every retry.

mod budget;
mod compensate;
mod context;
mod durable;
mod errors;
mod heartbeat;
mod key_policy;
pub mod observe;
mod outcome;
mod policy;
mod provider;
mod saga;
mod wire;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::Instrument;

pub use budget::{DEFAULT_MAX_SCOPES, KeyBudget, TokenBucket};
pub use context::{Completion, Context};
pub use errors::{
    ConfigError, Error, Interrupted, InterruptedKind, ValuePart, WorkError, WorkResult,
    WorkResultExt, done,
};
pub use key_policy::{KeyPolicy, KeyPolicyError};
pub use outcome::Outcome;
pub use policy::{Heartbeat, InFlightPolicy};
pub use provider::{Provider, SettingsWarning};
pub use saga::{Compensation, FailedUndo};

use errors::{Reason, Unstorable};
use wire::{Json, Marker, Raw, StoredFailure, Wire};

use crate::{
    Codec, Fingerprint, Key, Store, StoreError, codec::PlainCodec, codec::StoredAt,
    codec::StoredPart, raw::MAX_DURATION, raw::clamp_duration, record::Lease, record::Steps,
    store::ClaimOutcome, store::ClaimRequest, store::Operation,
};

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

/// How often the driver retries a store call that failed with a retryable error. Every
/// store operation is safe to repeat (same attempt id, same lease), so a retry resolves an
/// ambiguous failure instead of leaving the key held.
const STORE_ATTEMPTS: u32 = 3;
const STORE_BACKOFF: Duration = Duration::from_millis(25);

/// Runs work at most once per key and replays its result to every retry.
///
/// Cheap to clone (clones share the store), whatever the store; the default type,
/// `Idempotency<Arc<dyn Store>>` ([`Idempotency::into_dyn`]), suits application state
/// (an axum `State`, say) that should not name the store's type.
///
/// ```
/// use idem_core::{Fingerprint, Idempotency, Key, MemoryStore, Outcome, WorkError};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let idem = Idempotency::new(MemoryStore::new());
/// let key = Key::new("acct_42/payments.create", "order-1187")?;
/// let request = serde_json::json!({"amount": 500, "currency": "EUR"});
///
/// let charge = || async { Ok::<_, WorkError<String>>("ch_1".to_string()) };
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
    settings: Settings,
}

impl<S: ?Sized> Clone for Idempotency<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            shared: Arc::clone(&self.shared),
            settings: self.settings.clone(),
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

#[derive(Debug, Clone)]
struct Settings {
    lease: Duration,
    retention: Duration,
    max_response_bytes: usize,
    heartbeat: Heartbeat,
    in_flight: InFlightPolicy,
    store_timeout: Duration,
    codec: Arc<dyn Codec>,
    key_policy: KeyPolicy,
    budget: Option<Arc<dyn KeyBudget>>,
    scope_label: Option<ScopeLabel>,
    providers: Vec<Provider>,
    warnings: Vec<SettingsWarning>,
}

/// The application's map from a scope to a metrics label.
#[derive(Clone)]
struct ScopeLabel(Arc<dyn Fn(&str) -> String + Send + Sync>);

impl fmt::Debug for ScopeLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScopeLabel(..)")
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            lease: DEFAULT_LEASE,
            retention: DEFAULT_RETENTION,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            heartbeat: Heartbeat::Auto,
            in_flight: InFlightPolicy::Reject,
            store_timeout: DEFAULT_STORE_TIMEOUT,
            codec: Arc::new(PlainCodec),
            key_policy: KeyPolicy::any(),
            budget: None,
            scope_label: None,
            providers: Vec::new(),
            warnings: Vec::new(),
        }
    }
}

/// The sizes a record may take: the driver's cap on a result, and the store's own limit
/// on a whole record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) response_cap: usize,
    pub(crate) record: Option<usize>,
}

impl Limits {
    /// The most one more value may take beside `used` bytes of checkpoints, keeping
    /// `reserve` bytes free.
    pub(crate) fn room(self, used: usize, reserve: usize) -> usize {
        let left = self
            .record
            .map_or(usize::MAX, |limit| limit.saturating_sub(used + reserve));
        self.response_cap.min(left)
    }
}

/// Settings for [`Idempotency`]; see [`Idempotency::builder`].
#[derive(Debug)]
#[must_use = "call build() to get the Idempotency"]
pub struct IdempotencyBuilder<S> {
    store: S,
    settings: Settings,
}

impl<S: Store + 'static> IdempotencyBuilder<S> {
    /// How long one attempt owns a key before another may take over (default 60 s).
    /// Longer than the work usually takes; too long delays recovery after a crash.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease;
        self
    }

    /// How long a record is kept (default 24 h): from its first claim, and for a stored
    /// result at least this long after it was stored, so a result stored late (work kept
    /// alive by heartbeats, a takeover) is still replayed.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.settings.retention = retention;
        self
    }

    /// The largest encoded result stored (default 1 MiB). The store's own limit, when
    /// lower, applies too.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_response_bytes = bytes;
        self
    }

    /// Whether and how often the lease is renewed while the work runs (default
    /// [`Heartbeat::Auto`]: every third of the lease).
    pub fn heartbeat(mut self, heartbeat: Heartbeat) -> Self {
        self.settings.heartbeat = heartbeat;
        self
    }

    /// What a duplicate does while another attempt holds the key (default
    /// [`InFlightPolicy::Reject`]).
    pub fn in_flight(mut self, policy: InFlightPolicy) -> Self {
        self.settings.in_flight = policy;
        self
    }

    /// The longest one store call may take before the driver counts it as failed (and
    /// retryable: the call may have landed, and every store call is safe to repeat).
    /// Default 10 s. Without a bound, a connection that stops answering (a network
    /// partition that drops packets) would hold the request until the operating system
    /// gives up on the connection, which can take hours.
    ///
    /// What it bounds, with `T` this timeout:
    /// - The claim: 3 tries, at most `3T + 75 ms` with the backoff between them (twice
    ///   that when a [`KeyBudget`] is out of keys and the store is asked whether the key
    ///   exists). [`InFlightPolicy::Wait`] adds its own timeout and one more claim.
    /// - Each write after the work (a step's checkpoint, the result, the failure, an
    ///   undo's marks): tried again while the lease has time left (up to 64 tries), so at
    ///   most the lease's time left `+ T + 500 ms`, and never fewer than 3 tries
    ///   (`3T + 75 ms`). A result or failure the store refuses as too large is written
    ///   once more, as the marker saying so.
    /// - The release after [`WorkError::Retryable`]: 3 tries, `3T + 75 ms`.
    /// - A heartbeat: one try, bounded by the heartbeat interval.
    ///
    /// The work's own time, and its undos', come on top: idem never cuts the work short.
    ///
    /// ```
    /// use idem_core::{Idempotency, MemoryStore};
    /// use std::time::Duration;
    ///
    /// let idem = Idempotency::builder(MemoryStore::new())
    ///     .store_timeout(Duration::from_secs(2))
    ///     .build()?;
    /// # let _ = idem;
    /// # Ok::<(), idem_core::ConfigError>(())
    /// ```
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.settings.store_timeout = timeout;
        self
    }

    /// The codec every stored value goes through: results, stored failures and step
    /// checkpoints (default [`PlainCodec`]: the bytes as they are). Use
    /// [`Aes256GcmCodec`](crate::Aes256GcmCodec) to encrypt them at rest; see its docs for
    /// what it protects and what it does not.
    ///
    /// ```
    /// use idem_core::{Aes256GcmCodec, Idempotency, MemoryStore};
    ///
    /// let idem = Idempotency::builder(MemoryStore::new())
    ///     .codec(Aes256GcmCodec::new(1, [42; 32]))
    ///     .build()?;
    /// # let _ = idem;
    /// # Ok::<(), idem_core::ConfigError>(())
    /// ```
    pub fn codec(mut self, codec: impl Codec) -> Self {
        self.settings.codec = Arc::new(codec);
        self
    }

    /// Which client keys are accepted (default [`KeyPolicy::any`]); a refused key is
    /// [`Error::KeyRefused`] before anything is stored.
    ///
    /// ```
    /// use idem_core::{Idempotency, KeyPolicy, MemoryStore};
    ///
    /// let idem = Idempotency::builder(MemoryStore::new()).key_policy(KeyPolicy::uuid()).build()?;
    /// # let _ = idem;
    /// # Ok::<(), idem_core::ConfigError>(())
    /// ```
    pub fn key_policy(mut self, policy: KeyPolicy) -> Self {
        self.settings.key_policy = policy;
        self
    }

    /// Caps how fast each scope may create new keys (default: no cap); the excess is
    /// [`Error::KeyBudgetExhausted`]. See [`KeyBudget`] and [`TokenBucket`].
    ///
    /// ```
    /// use idem_core::{Idempotency, MemoryStore, driver::TokenBucket};
    /// use std::time::Duration;
    ///
    /// // Each scope: 100 new keys at once, refilled at 100 a minute.
    /// let idem = Idempotency::builder(MemoryStore::new())
    ///     .key_budget(TokenBucket::new(100, Duration::from_secs(60)))
    ///     .build()?;
    /// # let _ = idem;
    /// # Ok::<(), idem_core::ConfigError>(())
    /// ```
    pub fn key_budget(mut self, budget: impl KeyBudget) -> Self {
        self.settings.budget = Some(Arc::new(budget));
        self
    }

    /// Labels `idem_new_keys_total` and `idem_key_budget_rejections_total` with
    /// `scope = label(scope)` (default: no label). Map scopes to few values (the operation,
    /// a customer tier), never to the scope itself: see [`observe`].
    ///
    /// ```
    /// use idem_core::{Idempotency, MemoryStore};
    ///
    /// // "acct_42/payments.create" -> "payments.create"
    /// let idem = Idempotency::builder(MemoryStore::new())
    ///     .scope_label(|scope| scope.rsplit('/').next().unwrap_or("other").to_owned())
    ///     .build()?;
    /// # let _ = idem;
    /// # Ok::<(), idem_core::ConfigError>(())
    /// ```
    pub fn scope_label(mut self, label: impl Fn(&str) -> String + Send + Sync + 'static) -> Self {
        self.settings.scope_label = Some(ScopeLabel(Arc::new(label)));
        self
    }

    /// Declares a payment provider the work calls with [`Context::provider_key`]:
    /// [`build`](Self::build) warns (a `tracing` warning, and
    /// [`Idempotency::warnings`]) when the retention is shorter than the provider's.
    ///
    /// ```
    /// use idem_core::{Idempotency, MemoryStore, driver::Provider, driver::SettingsWarning};
    ///
    /// let idem = Idempotency::builder(MemoryStore::new()).provider(Provider::ADYEN).build()?;
    /// assert!(matches!(
    ///     idem.warnings(),
    ///     [SettingsWarning::RetentionShorterThanProvider { provider: "adyen", .. }]
    /// ));
    /// # Ok::<(), idem_core::ConfigError>(())
    /// ```
    pub fn provider(mut self, provider: Provider) -> Self {
        self.settings.providers.push(provider);
        self
    }

    /// Checks the settings and builds the driver.
    ///
    /// ```
    /// use idem_core::{ConfigError, Idempotency, MemoryStore};
    /// use std::time::Duration;
    ///
    /// let idem = Idempotency::builder(MemoryStore::new())
    ///     .lease(Duration::from_secs(30))
    ///     .retention(Duration::from_secs(7 * 24 * 3600))
    ///     .build()?;
    /// # let _ = idem;
    /// let err = Idempotency::builder(MemoryStore::new()).lease(Duration::ZERO).build().unwrap_err();
    /// assert_eq!(err, ConfigError::ZeroLease);
    /// # Ok::<(), ConfigError>(())
    /// ```
    ///
    /// # Errors
    /// [`ConfigError`] for a zero lease, a retention shorter than the lease, a duration
    /// over [`MAX_DURATION`], a zero cap, a heartbeat interval that is zero or not shorter
    /// than the lease, or the automatic heartbeat with a lease under 3 ms.
    pub fn build(self) -> Result<Idempotency<S>, ConfigError> {
        let Settings {
            lease,
            retention,
            max_response_bytes,
            heartbeat,
            ..
        } = self.settings;
        let too_long = |setting, value: Duration| {
            (value > MAX_DURATION).then_some(ConfigError::DurationTooLong {
                setting,
                value,
                max: MAX_DURATION,
            })
        };
        if let Some(err) = too_long("lease", lease).or(too_long("retention", retention)) {
            return Err(err);
        }
        if lease.is_zero() {
            return Err(ConfigError::ZeroLease);
        }
        if retention < lease {
            return Err(ConfigError::RetentionShorterThanLease { retention, lease });
        }
        if max_response_bytes == 0 {
            return Err(ConfigError::ZeroResponseCap);
        }
        if self.settings.store_timeout.is_zero() {
            return Err(ConfigError::ZeroStoreTimeout);
        }
        match heartbeat {
            Heartbeat::Every(every) if every.is_zero() || every >= lease => {
                return Err(ConfigError::HeartbeatNotShorterThanLease { every, lease });
            }
            Heartbeat::Auto if lease < policy::AUTO_HEARTBEAT_MIN_LEASE => {
                return Err(ConfigError::LeaseTooShortForHeartbeat { lease });
            }
            _ => {}
        }
        let mut settings = self.settings;
        settings.warnings = provider::warnings(retention, &settings.providers);
        for warning in &settings.warnings {
            tracing::warn!("idem settings: {warning}");
        }
        Ok(Idempotency::with_settings(self.store, settings))
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
            settings,
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
    ///   [`Outcome::Retryable`].
    /// - [`WorkError::Unknown`]: the lease is kept until it expires, [`Outcome::Unknown`].
    /// - A result or error that does not serialise, does not read back as its type, or
    ///   does not fit: stored as a permanent failure ([`Error::Unserializable`],
    ///   [`Error::ResultTooLarge`]) and answered so to every retry; the work never runs
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
    /// marks, the whole compensation) runs in a task of its own and lands, so the work is
    /// not run again; only the Tokio runtime shutting down stops it (let a server drain
    /// its requests before the runtime ends). How long `execute` can take apart from the
    /// work is under [`IdempotencyBuilder::store_timeout`].
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
            key = %key.short_hash(),
            outcome = tracing::field::Empty,
        );
        let result = self
            .run::<W, F, Fut>(key, fingerprint, work)
            .instrument(span.clone())
            .await;
        span.record("outcome", outcome_name(&result));
        result
    }

    async fn run<W, F, Fut>(
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
        self.settings
            .key_policy
            .check(key.key())
            .map_err(Error::KeyRefused)?;
        let charged = self.charge_budget(key).await?;
        let claim = self.claim(key, fingerprint).await;
        let new_key = matches!(claim, Ok(Claim::Won { resumed: false, .. }));
        if new_key {
            observe::count_scoped(observe::NEW_KEYS, self.scope_label(key));
        } else if let Some(budget) = charged {
            budget.give_back(key.scope());
        }
        let (lease, deadline, resumed, steps) = match claim? {
            Claim::Won {
                lease,
                deadline,
                resumed,
                steps,
            } => (lease, deadline, resumed, steps),
            Claim::Replay(response) => {
                observe::count(observe::REPLAYS);
                let plain = self.decode(key, &fingerprint, StoredPart::Result, &response)?;
                let value = W::decode_value(&plain).map_err(Error::Decode)?;
                return Ok(Outcome::Completed {
                    value,
                    replayed: true,
                });
            }
            Claim::ReplayFailure(response) => {
                observe::count(observe::REPLAYS);
                let plain = self.decode(key, &fingerprint, StoredPart::Failure, &response)?;
                let stored = W::decode_failure(&plain).map_err(Error::Decode)?;
                return answer_failure(stored, true, None);
            }
        };

        let store = Arc::clone(&self.shared);
        let limits = self.limits();
        let codec = Arc::clone(&self.settings.codec);
        let context = Context::new(
            store,
            lease,
            deadline,
            fingerprint,
            resumed,
            steps,
            limits,
            codec,
            self.settings.store_timeout,
            W::SERDE,
        );
        let started = Instant::now();
        let every = self.settings.heartbeat.interval(self.settings.lease);
        let result =
            heartbeat::run(work(context.clone()), &context, every, self.settings.lease).await;
        observe::work_duration(started.elapsed());
        // An earlier owner started compensating: the failure is decided; finish undoing,
        // unless this run cannot write any more.
        if context.is_compensating() && !cannot_write(&result) {
            // The run went through the work as far as it goes (to the first step without
            // a checkpoint, or its end): every undo it did not register, it never will.
            let whole = matches!(
                result,
                Ok(_)
                    | Err(WorkError::Permanent(_))
                    | Err(WorkError::Interrupted(Interrupted(Reason::Compensating)))
            );
            drop(result);
            return self.compensate::<W>(&context, None, whole, every).await;
        }
        match result {
            Err(WorkError::Permanent(error)) if context.has_undos() => {
                let failure = StoredFailure::Work(error);
                self.compensate::<W>(&context, Some(failure), true, every)
                    .await
            }
            Ok(value) => self.complete::<W>(&context, value).await,
            Err(WorkError::Permanent(error)) => {
                self.fail::<W>(&context, StoredFailure::Work(error), None)
                    .await
            }
            Err(WorkError::Retryable(error)) => {
                // Best effort, bounded like every store call (no lease deadline: a
                // release that fails just lets the lease run out).
                let release = durable::write(
                    Arc::clone(&self.shared),
                    context.lease(),
                    durable::Write::Release,
                    self.settings.store_timeout,
                    None,
                );
                if let Err(err) = release.await {
                    tracing::warn!(error = %err, "could not release the lease; it will expire");
                }
                Ok(Outcome::Retryable(error))
            }
            Err(WorkError::Unknown(error)) => Ok(Outcome::Unknown(error)),
            Err(WorkError::Interrupted(Interrupted(reason))) => match reason {
                Reason::LeaseLost => Err(Error::LeaseLost),
                Reason::Store(err) => Err(Error::Store(err)),
                Reason::Codec { what, source } => Err(Error::Codec {
                    key: key.short_hash(),
                    what,
                    source,
                }),
                Reason::Unstorable(unstorable) => {
                    // A permanent failure of the execution like any other: steps done
                    // before it are undone.
                    let marker = StoredFailure::Marker(Marker::from_unstorable(unstorable));
                    if context.has_undos() {
                        self.compensate::<W>(&context, Some(marker), true, every)
                            .await
                    } else {
                        self.fail::<W>(&context, marker, None).await
                    }
                }
                other => Err(Error::Interrupted(Interrupted(other))),
            },
        }
    }

    /// Takes a new key from the scope's budget. Out of budget, a key that already has a
    /// record goes ahead uncharged; a new one is refused.
    async fn charge_budget(&self, key: &Key) -> Result<Option<&Arc<dyn KeyBudget>>, Error> {
        let Some(budget) = &self.settings.budget else {
            return Ok(None);
        };
        match budget.take(key.scope()) {
            Ok(()) => Ok(Some(budget)),
            Err(retry_after) => {
                let timeout = self.settings.store_timeout;
                if retry_store(Operation::Get, timeout, None, || self.store.get(key))
                    .await?
                    .is_some()
                {
                    return Ok(None);
                }
                observe::count_scoped(observe::KEY_BUDGET_REJECTIONS, self.scope_label(key));
                Err(Error::KeyBudgetExhausted { retry_after })
            }
        }
    }

    fn scope_label(&self, key: &Key) -> Option<String> {
        let label = self.settings.scope_label.as_ref()?;
        Some((label.0)(key.scope()))
    }

    fn limits(&self) -> Limits {
        Limits {
            response_cap: self.settings.max_response_bytes,
            record: self.store.max_record_bytes(),
        }
    }

    /// The plain bytes of a stored value, or the codec's error naming it.
    fn decode<'a>(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        part: StoredPart<'_>,
        stored: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [u8]>, Error> {
        let at = StoredAt {
            key,
            fingerprint,
            part,
        };
        self.settings
            .codec
            .decode(&at, stored)
            .map_err(|source| codec_error(key, part, source))
    }

    /// The stored form of a value's plain bytes.
    fn encode(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        part: StoredPart<'_>,
        plain: Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        let at = StoredAt {
            key,
            fingerprint,
            part,
        };
        self.settings
            .codec
            .encode(&at, plain)
            .map_err(|source| codec_error(key, part, source))
    }

    /// Stores the work's value and answers it as stored.
    async fn complete<W: Wire>(
        &self,
        context: &Context,
        value: W::Value,
    ) -> Result<Outcome<W::Value, W::Failure>, Error> {
        let key = context.key();
        let fingerprint = context.fingerprint();
        // The answer is what a replay will decode: a value that does not survive the trip
        // fails now, once, and is stored as such.
        let (bytes, stored) = match context.take_completion() {
            // Completed inside the work's own transaction: those bytes are the result.
            Some(bytes) => {
                let decoded = W::decode_value(&self.decode(
                    &key,
                    &fingerprint,
                    StoredPart::Result,
                    &bytes,
                )?);
                (bytes, decoded)
            }
            None => match W::encode_value(&value) {
                Ok(plain) => {
                    let decoded = W::decode_value(&plain);
                    (
                        self.encode(&key, &fingerprint, StoredPart::Result, plain)?,
                        decoded,
                    )
                }
                Err(source) => {
                    return self
                        .unserializable::<W>(context, ValuePart::Result, source)
                        .await;
                }
            },
        };
        drop(value);
        let stored = match stored {
            Ok(stored) => stored,
            Err(source) => {
                return self
                    .unserializable::<W>(context, ValuePart::Result, source)
                    .await;
            }
        };
        let limit = context.room_for_response();
        if bytes.len() > limit {
            let marker = Marker::ResultTooLarge {
                size: bytes.len(),
                limit,
            };
            return self
                .fail::<W>(context, StoredFailure::Marker(marker), None)
                .await;
        }
        match durable::finish(context, durable::Write::Complete(bytes), W::marker).await? {
            durable::Finished::Applied => Ok(Outcome::Completed {
                value: stored,
                replayed: false,
            }),
            durable::Finished::Fenced => Err(fenced_at_the_end(context)),
            durable::Finished::Marked(marker) => Err(marker.into_error(false, None)),
        }
    }

    async fn unserializable<W: Wire>(
        &self,
        context: &Context,
        what: ValuePart,
        source: crate::BoxError,
    ) -> Result<Outcome<W::Value, W::Failure>, Error> {
        let marker = Marker::from_unstorable(Unstorable::Unserializable { what });
        self.fail::<W>(context, StoredFailure::Marker(marker), Some(source))
            .await
    }

    /// Stores a permanent failure and answers it as stored. A work error that cannot be
    /// stored is replaced by a marker saying why, so the first answer and every replay
    /// agree.
    async fn fail<W: Wire>(
        &self,
        context: &Context,
        failure: StoredFailure<W::Failure>,
        source: Option<crate::BoxError>,
    ) -> Result<Outcome<W::Value, W::Failure>, Error> {
        let key = context.key();
        let fingerprint = context.fingerprint();
        let limit = context.room_for_response();
        let encoded = W::encode_failure(&failure).and_then(|plain| {
            let decoded = W::decode_failure(&plain)?;
            Ok((plain, decoded))
        });
        let encoded = match encoded {
            Ok((plain, decoded)) => Ok((
                self.encode(&key, &fingerprint, StoredPart::Failure, plain)?,
                decoded,
            )),
            Err(err) => Err(err),
        };
        let (bytes, stored, source) = match encoded {
            Ok((bytes, stored)) if bytes.len() <= limit => (bytes, stored, source),
            Ok((bytes, _)) => {
                let marker = Marker::ResultTooLarge {
                    size: bytes.len(),
                    limit,
                };
                self.encode_marker::<W>(&key, &fingerprint, marker, source)?
            }
            Err(err) => {
                let marker = Marker::Unserializable {
                    step: None,
                    failure: true,
                };
                self.encode_marker::<W>(&key, &fingerprint, marker, Some(err))?
            }
        };
        match durable::finish(context, durable::Write::Fail(bytes), W::marker).await? {
            durable::Finished::Applied => answer_failure(stored, false, source),
            durable::Finished::Fenced => Err(fenced_at_the_end(context)),
            // The store holds less than the driver knew: the marker saying so is stored,
            // as for a result, so the key is not held (and the work run again).
            durable::Finished::Marked(marker) => Err(marker.into_error(false, None)),
        }
    }

    fn encode_marker<W: Wire>(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        marker: Marker,
        source: Option<crate::BoxError>,
    ) -> Result<EncodedFailure<W::Failure>, Error> {
        // Markers hold only numbers and names: they always serialise.
        let failure = StoredFailure::Marker(marker);
        let plain = W::encode_failure(&failure).unwrap_or_default();
        let bytes = self.encode(key, fingerprint, StoredPart::Failure, plain)?;
        Ok((bytes, failure, source))
    }

    /// Runs the undos in reverse order, each at most once across takeovers, then stores
    /// the failure with what was undone, all in a task of its own (see `compensate.rs`).
    /// `failure` is the work's failure on the run that failed; a takeover reads it from
    /// the saga checkpoint. `whole` says this run of the work went as far as it can, so an
    /// undo it did not register never will be.
    async fn compensate<W: Wire>(
        &self,
        context: &Context,
        failure: Option<StoredFailure<W::Failure>>,
        whole: bool,
        every: Option<Duration>,
    ) -> Result<Outcome<W::Value, W::Failure>, Error> {
        // A work error that does not serialise, or does not read back, compensates all the
        // same: the marker saying so stands in for it.
        let failure = failure.map(|failure| {
            W::encode_failure(&failure)
                .and_then(|plain| W::decode_failure(&plain).map(|_| plain))
                .unwrap_or_else(|_| {
                    let marker = Marker::Unserializable {
                        step: None,
                        failure: true,
                    };
                    W::marker(&marker, None)
                })
        });
        let saga = compensate::Saga {
            context: context.clone(),
            undos: context.take_undos(),
            failure,
            whole,
            every,
            lease: self.settings.lease,
            encoding: compensate::Encoding {
                with_compensation: W::with_compensation,
                marker: W::marker,
            },
        };
        let plain = compensate::run(saga).await?;
        let stored = W::decode_failure(&plain).map_err(Error::Decode)?;
        if let StoredFailure::CompensatedMarker(_, compensation) = &stored {
            tracing::warn!(
                undone = ?compensation.undone,
                pending = ?compensation.pending,
                interrupted = ?compensation.interrupted,
                "compensated a work error that could not be stored"
            );
        }
        answer_failure(stored, false, None)
    }

    /// Claims the key, waiting for another attempt under [`InFlightPolicy::Wait`].
    async fn claim(&self, key: &Key, fingerprint: Fingerprint) -> Result<Claim, Error> {
        let Settings {
            lease,
            retention,
            in_flight,
            ..
        } = self.settings;
        // The same request (same attempt id) on every try: a claim that landed but whose
        // answer was lost returns the same lease instead of in-flight.
        let request = ClaimRequest::new(key.clone(), fingerprint, lease, retention);
        let waiting = match in_flight {
            // A wait too long for the clock to count is a wait without end.
            InFlightPolicy::Wait { timeout } => Some(Instant::now().checked_add(timeout)),
            InFlightPolicy::Reject => None,
        };
        let mut backoff = policy::WAIT_FIRST_BACKOFF;
        let mut waited = false;
        loop {
            let timeout = self.settings.store_timeout;
            let sent = Instant::now();
            let mut tries = 0u32;
            let outcome = retry_store(Operation::Claim, timeout, None, || {
                tries += 1;
                self.store.claim(&request)
            })
            .await?;
            return Ok(match outcome {
                ClaimOutcome::Claimed {
                    lease: granted,
                    resumed,
                    steps,
                    ..
                } => {
                    // A retried claim whose first try landed gets its own lease back as
                    // `resumed: false`, whether that try created the record or took it
                    // over. A takeover shows in a lease that did not start with the
                    // record, or in a token past the first; the second also counts a
                    // fresh record that replaced an absent one (token + 1) as resumed,
                    // the safe side: the work then finds no steps done.
                    let resumed = resumed
                        || tries > 1
                            && (granted.token > 1
                                || granted.lease_until
                                    != granted.created_at.saturating_add(clamp_duration(lease)));
                    observe::count(observe::CLAIMS);
                    if resumed {
                        observe::count(observe::TAKEOVERS);
                        tracing::info!(token = granted.token, "took over an expired lease");
                    }
                    Claim::Won {
                        lease: granted,
                        deadline: sent + clamp_duration(lease),
                        resumed,
                        steps,
                    }
                }
                ClaimOutcome::Replay { response, .. } => Claim::Replay(response),
                ClaimOutcome::ReplayFailure { response, .. } => Claim::ReplayFailure(response),
                ClaimOutcome::InFlight { retry_after, .. } => {
                    let now = Instant::now();
                    let left = match waiting {
                        Some(Some(deadline)) if now < deadline => Some(deadline - now),
                        Some(None) => Some(Duration::MAX),
                        _ => None,
                    };
                    match left {
                        Some(left) => {
                            if !waited {
                                waited = true;
                                observe::count(observe::WAITS);
                            }
                            let pause = policy::jittered(backoff).min(left);
                            tokio::time::sleep(pause).await;
                            backoff = (backoff * 2).min(policy::WAIT_MAX_BACKOFF);
                            continue;
                        }
                        None => {
                            observe::count(observe::IN_FLIGHT_REJECTIONS);
                            return Err(Error::InFlight { retry_after });
                        }
                    }
                }
                ClaimOutcome::Mismatch => {
                    observe::count(observe::MISMATCHES);
                    return Err(Error::Mismatch);
                }
            });
        }
    }
}

/// What `execute` answers for a stored failure; `source` is the serialiser's error on the
/// run that stored a marker.
fn answer_failure<T, E>(
    stored: StoredFailure<E>,
    replayed: bool,
    source: Option<crate::BoxError>,
) -> Result<Outcome<T, E>, Error> {
    match stored {
        StoredFailure::Work(error) => Ok(Outcome::Failed { error, replayed }),
        StoredFailure::Compensated(error, compensation) => Ok(Outcome::Compensated {
            error,
            compensation,
            replayed,
        }),
        StoredFailure::Marker(marker) | StoredFailure::CompensatedMarker(marker, _) => {
            Err(marker.into_error(replayed, source))
        }
    }
}

/// A failure's stored bytes, the failure they decode to, and the serialiser's error if any.
type EncodedFailure<F> = (Vec<u8>, StoredFailure<F>, Option<crate::BoxError>);

/// What the claim left the driver to do.
enum Claim {
    Won {
        lease: Lease,
        /// When the lease ends on this process's clock.
        deadline: Instant,
        resumed: bool,
        steps: Steps,
    },
    Replay(Vec<u8>),
    ReplayFailure(Vec<u8>),
}

fn codec_error(key: &Key, part: StoredPart<'_>, source: crate::codec::CodecError) -> Error {
    Error::Codec {
        key: key.short_hash(),
        what: part.into(),
        source,
    }
}

/// True when the work's result says this run can no longer write (its lease is gone, the
/// store or the codec failed): such a run must not compensate.
fn cannot_write<T, E>(result: &Result<T, WorkError<E>>) -> bool {
    matches!(
        result,
        Err(WorkError::Interrupted(Interrupted(
            Reason::LeaseLost | Reason::Store(_) | Reason::Codec { .. }
        )))
    )
}

/// One of idem's own checkpoint names, checked like any step name.
fn step_name(name: &str) -> Result<crate::key::StepName, Interrupted> {
    crate::key::StepName::new(name).map_err(|err| Interrupted(Reason::InvalidStepName(err)))
}

/// The caller's error for an interruption met by the driver itself.
fn interruption_error(key: &Key, interrupted: Interrupted) -> Error {
    match interrupted.0 {
        Reason::LeaseLost => Error::LeaseLost,
        Reason::Store(err) => Error::Store(err),
        Reason::Codec { what, source } => Error::Codec {
            key: key.short_hash(),
            what,
            source,
        },
        other => Error::Interrupted(Interrupted(other)),
    }
}

fn fenced_at_the_end(context: &Context) -> Error {
    observe::count(observe::FENCED_WRITES);
    context.mark_lost();
    Error::LeaseLost
}

/// One store call, failed as unavailable (retryable) when it takes longer than `timeout`.
async fn bounded<O>(
    operation: Operation,
    timeout: Duration,
    call: impl Future<Output = Result<O, StoreError>>,
) -> Result<O, StoreError> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::Unavailable {
                operation,
                source: Box::new(errors::NoAnswer(timeout)),
            })
        })
}

/// The most tries of one write within a lease, whatever the lease's length.
const MAX_WRITE_ATTEMPTS: u32 = 64;
const MAX_WRITE_BACKOFF: Duration = Duration::from_millis(500);

/// Runs a store call, trying again with backoff while it fails with a retryable error:
/// at least [`STORE_ATTEMPTS`] tries, and for a write that follows the work (made before
/// `deadline`, the end of its lease on this process's clock: a checkpoint, the result,
/// the failure) as long as the lease has time left, at most [`MAX_WRITE_ATTEMPTS`].
/// Giving such a write up early would leave the key held until the lease ends and then
/// run the work again. Every store operation is safe to repeat (the same attempt id, the
/// same lease). Each try is bounded by `timeout`, so the whole call ends within
/// `max(deadline, 3 tries) + timeout` and the backoff between tries.
pub(crate) async fn retry_store<O, Fut>(
    operation: Operation,
    timeout: Duration,
    deadline: Option<Instant>,
    mut call: impl FnMut() -> Fut,
) -> Result<O, StoreError>
where
    Fut: Future<Output = Result<O, StoreError>>,
{
    let mut tries = 1;
    let mut backoff = STORE_BACKOFF;
    loop {
        let result = bounded(operation, timeout, call()).await;
        if result.is_err() {
            observe::store_error(operation);
        }
        let lease_left = deadline.is_some_and(|deadline| Instant::now() < deadline);
        match result {
            Err(err)
                if err.is_retryable()
                    && (tries < STORE_ATTEMPTS || lease_left && tries < MAX_WRITE_ATTEMPTS) =>
            {
                tracing::debug!(error = %err, tries, "retrying a store call");
                tokio::time::sleep(policy::jittered(backoff)).await;
                backoff = (backoff * 2).min(MAX_WRITE_BACKOFF);
                tries += 1;
            }
            result => return result,
        }
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
