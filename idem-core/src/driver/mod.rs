//! The driver: claim, run the work once, store its result, replay it to every retry.

mod context;
mod errors;
mod heartbeat;
pub mod observe;
mod outcome;
mod policy;
mod wire;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tracing::Instrument;

pub use context::{Completion, Context};
pub use errors::{
    ConfigError, Error, Interrupted, InterruptedKind, ValuePart, WorkError, WorkResult,
    WorkResultExt, done,
};
pub use outcome::Outcome;
pub use policy::{Heartbeat, InFlightPolicy};

use errors::{Reason, Unstorable};
use wire::{Json, Marker, Raw, StoredFailure, Wire};

use crate::{
    ClaimOutcome, ClaimRequest, Fingerprint, Key, Lease, MAX_DURATION, Operation, Steps, Store,
    StoreError, WriteOutcome,
};

/// The default lease: how long one attempt owns a key before others may take over.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// The default retention: how long a result is replayed (24 hours).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// The default cap on a stored result (1 MiB).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// Room kept in a record with a size limit so that a failure marker always fits beside
/// the checkpoints.
pub(crate) const MARKER_RESERVE: usize = 512;

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
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            lease: DEFAULT_LEASE,
            retention: DEFAULT_RETENTION,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            heartbeat: Heartbeat::Auto,
            in_flight: InFlightPolicy::Reject,
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

    /// How long results are kept and replayed, from the first claim (default 24 h).
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
        match heartbeat {
            Heartbeat::Every(every) if every.is_zero() || every >= lease => {
                return Err(ConfigError::HeartbeatNotShorterThanLease { every, lease });
            }
            Heartbeat::Auto if lease < policy::AUTO_HEARTBEAT_MIN_LEASE => {
                return Err(ConfigError::LeaseTooShortForHeartbeat { lease });
            }
            _ => {}
        }
        Ok(Idempotency::with_settings(self.store, self.settings))
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
    /// retry takes over. The same holds if `work` panics.
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
        let (lease, resumed, steps) = match self.claim(key, fingerprint).await? {
            Claim::Won {
                lease,
                resumed,
                steps,
            } => (lease, resumed, steps),
            Claim::Replay(response) => {
                observe::count(observe::REPLAYS);
                let value = W::decode_value(&response).map_err(Error::Decode)?;
                return Ok(Outcome::Completed {
                    value,
                    replayed: true,
                });
            }
            Claim::ReplayFailure(response) => {
                observe::count(observe::REPLAYS);
                return match W::decode_failure(&response).map_err(Error::Decode)? {
                    StoredFailure::Work(error) => Ok(Outcome::Failed {
                        error,
                        replayed: true,
                    }),
                    StoredFailure::Marker(marker) => Err(marker.into_error(true, None)),
                };
            }
        };

        let store = Arc::clone(&self.shared);
        let limits = self.limits();
        let context = Context::new(store, lease, fingerprint, resumed, steps, limits, W::SERDE);
        let started = Instant::now();
        let every = self.settings.heartbeat.interval(self.settings.lease);
        let result =
            heartbeat::run(work(context.clone()), &context, every, self.settings.lease).await;
        observe::work_duration(started.elapsed());
        match result {
            Ok(value) => self.complete::<W>(&context, value).await,
            Err(WorkError::Permanent(error)) => {
                self.fail::<W>(&context, StoredFailure::Work(error), None)
                    .await
            }
            Err(WorkError::Retryable(error)) => {
                // Best effort: if the release fails, the lease simply runs out.
                let lease = context.lease();
                if let Err(err) = self.store.release(&lease).await {
                    observe::store_error(Operation::Release);
                    tracing::warn!(error = %err, "could not release the lease; it will expire");
                }
                Ok(Outcome::Retryable(error))
            }
            Err(WorkError::Unknown(error)) => Ok(Outcome::Unknown(error)),
            Err(WorkError::Interrupted(Interrupted(reason))) => match reason {
                Reason::LeaseLost => Err(Error::LeaseLost),
                Reason::Store(err) => Err(Error::Store(err)),
                Reason::Unstorable(unstorable) => {
                    let marker = StoredFailure::Marker(Marker::from_unstorable(unstorable));
                    self.fail::<W>(&context, marker, None).await
                }
                other => Err(Error::Interrupted(Interrupted(other))),
            },
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            response_cap: self.settings.max_response_bytes,
            record: self.store.max_record_bytes(),
        }
    }

    /// Stores the work's value and answers it as stored.
    async fn complete<W: Wire>(
        &self,
        context: &Context,
        value: W::Value,
    ) -> Result<Outcome<W::Value, W::Failure>, Error> {
        // Completed inside the work's own transaction: those bytes are the result.
        let bytes = match context.take_completion() {
            Some(bytes) => bytes,
            None => match W::encode_value(&value) {
                Ok(bytes) => bytes,
                Err(source) => {
                    return self
                        .unserializable::<W>(context, ValuePart::Result, source)
                        .await;
                }
            },
        };
        drop(value);
        // The answer is what a replay will decode: a value that does not survive the trip
        // fails now, once, and is stored as such.
        let stored = match W::decode_value(&bytes) {
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
        let lease = context.lease();
        match retry_store(Operation::Complete, || self.store.complete(&lease, &bytes)).await {
            Ok(WriteOutcome::Applied) => Ok(Outcome::Completed {
                value: stored,
                replayed: false,
            }),
            Ok(WriteOutcome::Fenced) => Err(fenced_at_the_end(context)),
            Err(StoreError::ResponseTooLarge { size, limit }) => {
                let marker = Marker::ResultTooLarge { size, limit };
                self.fail::<W>(context, StoredFailure::Marker(marker), None)
                    .await
            }
            Err(err) => Err(Error::Store(err)),
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
        let limit = context.room_for_response();
        let encoded = W::encode_failure(&failure).and_then(|bytes| {
            let decoded = W::decode_failure(&bytes)?;
            Ok((bytes, decoded))
        });
        let (bytes, stored, source) = match encoded {
            Ok((bytes, stored)) if bytes.len() <= limit => (bytes, stored, source),
            Ok((bytes, _)) => {
                let marker = Marker::ResultTooLarge {
                    size: bytes.len(),
                    limit,
                };
                self.encode_marker::<W>(marker, source)
            }
            Err(err) => {
                let marker = Marker::Unserializable {
                    step: None,
                    failure: true,
                };
                self.encode_marker::<W>(marker, Some(err))
            }
        };
        let lease = context.lease();
        match retry_store(Operation::Fail, || self.store.fail(&lease, &bytes)).await {
            Ok(WriteOutcome::Applied) => match stored {
                StoredFailure::Work(error) => Ok(Outcome::Failed {
                    error,
                    replayed: false,
                }),
                StoredFailure::Marker(marker) => Err(marker.into_error(false, source)),
            },
            Ok(WriteOutcome::Fenced) => Err(fenced_at_the_end(context)),
            Err(err) => Err(Error::Store(err)),
        }
    }

    fn encode_marker<W: Wire>(
        &self,
        marker: Marker,
        source: Option<crate::BoxError>,
    ) -> (Vec<u8>, StoredFailure<W::Failure>, Option<crate::BoxError>) {
        // Markers hold only numbers and names: they always encode.
        let failure = StoredFailure::Marker(marker);
        let bytes = W::encode_failure(&failure).unwrap_or_default();
        (bytes, failure, source)
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
        let deadline = match in_flight {
            InFlightPolicy::Wait { timeout } => Some(Instant::now() + timeout),
            InFlightPolicy::Reject => None,
        };
        let mut backoff = policy::WAIT_FIRST_BACKOFF;
        let mut waited = false;
        loop {
            let outcome = retry_store(Operation::Claim, || self.store.claim(&request)).await?;
            return Ok(match outcome {
                ClaimOutcome::Claimed {
                    lease,
                    resumed,
                    steps,
                    ..
                } => {
                    observe::count(observe::CLAIMS);
                    if resumed {
                        observe::count(observe::TAKEOVERS);
                        tracing::info!(token = lease.token, "took over an expired lease");
                    }
                    Claim::Won {
                        lease,
                        resumed,
                        steps,
                    }
                }
                ClaimOutcome::Replay { response, .. } => Claim::Replay(response),
                ClaimOutcome::ReplayFailure { response, .. } => Claim::ReplayFailure(response),
                ClaimOutcome::InFlight { retry_after, .. } => {
                    let now = Instant::now();
                    match deadline {
                        Some(deadline) if now < deadline => {
                            if !waited {
                                waited = true;
                                observe::count(observe::WAITS);
                            }
                            let pause = policy::jittered(backoff).min(deadline - now);
                            tokio::time::sleep(pause).await;
                            backoff = (backoff * 2).min(policy::WAIT_MAX_BACKOFF);
                            continue;
                        }
                        _ => {
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

/// What the claim left the driver to do.
enum Claim {
    Won {
        lease: Lease,
        resumed: bool,
        steps: Steps,
    },
    Replay(Vec<u8>),
    ReplayFailure(Vec<u8>),
}

fn fenced_at_the_end(context: &Context) -> Error {
    observe::count(observe::FENCED_WRITES);
    context.mark_lost();
    Error::LeaseLost
}

/// Runs a store call, trying again after a short backoff while it fails with a retryable
/// error (at most [`STORE_ATTEMPTS`] tries). Every store operation is safe to repeat.
pub(crate) async fn retry_store<O, Fut>(
    operation: Operation,
    mut call: impl FnMut() -> Fut,
) -> Result<O, StoreError>
where
    Fut: Future<Output = Result<O, StoreError>>,
{
    let mut tries = 1;
    loop {
        let result = call().await;
        if result.is_err() {
            observe::store_error(operation);
        }
        match result {
            Err(err) if err.is_retryable() && tries < STORE_ATTEMPTS => {
                tracing::debug!(error = %err, tries, "retrying a store call");
                tokio::time::sleep(STORE_BACKOFF * tries).await;
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
        Ok(Outcome::Failed { replayed: true, .. }) => "replayed_failure",
        Ok(Outcome::Failed { .. }) => "failed",
        Ok(Outcome::Retryable(_)) => "retryable",
        Ok(Outcome::Unknown(_)) => "outcome_unknown",
        Err(err) if err.is_replay() => "replayed_failure",
        Err(Error::InFlight { .. }) => "in_flight",
        Err(Error::Mismatch) => "mismatch",
        Err(Error::LeaseLost) => "lease_lost",
        Err(Error::Store(_)) => "store_error",
        Err(_) => "error",
    }
}
