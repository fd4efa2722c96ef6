//! The driver: claim, run the work once, store its result, replay it to every retry.

mod context;
mod errors;
pub mod observe;
mod policy;
mod stored_failure;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::Instrument;

pub use context::Context;
pub use errors::{ConfigError, Error, Interrupted, WorkError};
pub use policy::{Heartbeat, InFlightPolicy};
use stored_failure::StoredFailure;

use crate::{
    ClaimOutcome, ClaimRequest, Fingerprint, Key, Lease, Operation, RenewOutcome, Steps, Store,
    StoreError, WriteOutcome,
};

/// The default lease: how long one attempt owns a key before others may take over.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// The default retention: how long a result is replayed (24 hours).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// The default cap on a serialised result (1 MiB).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// How often the driver retries a store call that failed with a retryable error. Every
/// store operation is safe to repeat (same attempt id, same lease), so a retry resolves an
/// ambiguous failure instead of leaving the key held.
const STORE_ATTEMPTS: u32 = 3;
const STORE_BACKOFF: Duration = Duration::from_millis(25);

/// The value `execute` returns, and whether it came from an earlier run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Executed<T> {
    /// The work's result (this run's, or the stored one).
    pub value: T,
    /// True when the work did not run now and `value` is the stored result of an earlier
    /// run.
    pub replayed: bool,
}

/// Runs work at most once per key and replays its result to every retry.
///
/// ```
/// use idem_core::{Executed, Fingerprint, Idempotency, Key, MemoryStore, WorkError};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let idem = Idempotency::new(MemoryStore::new());
/// let key = Key::new("acct_42/payments.create", "order-1187")?;
/// let request = serde_json::json!({"amount": 500, "currency": "EUR"});
///
/// let charge = || async { Ok::<_, WorkError<String>>("ch_1".to_string()) };
/// let first = idem.execute(&key, Fingerprint::of_json(&request)?, |_ctx| charge()).await?;
/// let retry = idem.execute(&key, Fingerprint::of_json(&request)?, |_ctx| charge()).await?;
/// assert_eq!(first, Executed { value: "ch_1".to_string(), replayed: false });
/// assert_eq!(retry, Executed { value: "ch_1".to_string(), replayed: true });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Idempotency<S> {
    store: Arc<S>,
    settings: Settings,
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

/// Settings for [`Idempotency`]; see [`Idempotency::builder`].
#[derive(Debug, Clone)]
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

    /// The largest serialised result stored (default 1 MiB). The store's own limit, when
    /// lower, applies too.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_response_bytes = bytes;
        self
    }

    /// Whether and how often the lease is renewed while the work runs (default
    /// [`Heartbeat::Auto`]: every third of the lease, for leases of 3 s or more).
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
    /// [`ConfigError`] for a zero lease, a retention shorter than the lease, a zero cap or
    /// a heartbeat interval that is zero or not shorter than the lease.
    pub fn build(self) -> Result<Idempotency<S>, ConfigError> {
        let Settings {
            lease,
            retention,
            max_response_bytes,
            heartbeat,
            ..
        } = self.settings;
        if lease.is_zero() {
            return Err(ConfigError::ZeroLease);
        }
        if retention < lease {
            return Err(ConfigError::RetentionShorterThanLease { retention, lease });
        }
        if max_response_bytes == 0 {
            return Err(ConfigError::ZeroResponseCap);
        }
        if let Heartbeat::Every(every) = heartbeat {
            if every.is_zero() || every >= lease {
                return Err(ConfigError::HeartbeatNotShorterThanLease { every, lease });
            }
        }
        Ok(Idempotency {
            store: Arc::new(self.store),
            settings: self.settings,
        })
    }
}

impl<S: Store + 'static> Idempotency<S> {
    /// A driver with the default lease (60 s), retention (24 h) and cap (1 MiB).
    pub fn new(store: S) -> Self {
        Self {
            store: Arc::new(store),
            settings: Settings::default(),
        }
    }

    /// Starts a builder with the defaults.
    pub fn builder(store: S) -> IdempotencyBuilder<S> {
        IdempotencyBuilder {
            store,
            settings: Settings::default(),
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Runs `work` once for `key` and returns its result, or replays the stored result.
    ///
    /// - No record (or an expired one): claims the key, runs `work`, stores its result and
    ///   returns it with `replayed: false`.
    /// - Completed before with the same fingerprint: returns the stored result with
    ///   `replayed: true`; `work` does not run.
    /// - Failed permanently before: [`Error::Failed`] with the stored error, `replayed: true`.
    /// - Another attempt holds a live lease: [`Error::InFlight`] with `retry_after`, or,
    ///   under [`InFlightPolicy::Wait`], a wait with backoff and jitter that ends in that
    ///   attempt's result (a replay), a takeover once its lease expires, or `InFlight` at
    ///   the timeout.
    /// - A different fingerprint under the same key: [`Error::Mismatch`].
    /// - An expired lease of another attempt: takes over ([`Context::resumed`] is true).
    /// - The claim fails in the store: [`Error::Store`]; `work` does not run (fail closed).
    /// - `work` returns [`WorkError::Permanent`]: the error is stored and replayed.
    /// - [`WorkError::Retryable`]: the lease is released, nothing is stored.
    /// - [`WorkError::Unknown`]: the lease is kept until it expires.
    /// - While `work` runs, the lease is renewed on the [`Heartbeat`] schedule. A fenced
    ///   renewal marks the lease lost ([`Context::lease_lost`] completes); when `work`
    ///   returns, nothing is stored and the answer is [`Error::LeaseLost`].
    /// - Another attempt took over meanwhile: [`Error::LeaseLost`]; nothing is stored.
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
    ) -> Result<Executed<T>, Error<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Serialize + DeserializeOwned,
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let span = tracing::info_span!(
            "idem.execute",
            key = %key.short_hash(),
            outcome = tracing::field::Empty,
        );
        let result = self
            .execute_inner(key, fingerprint, work)
            .instrument(span.clone())
            .await;
        span.record("outcome", outcome_name(&result));
        result
    }

    async fn execute_inner<T, E, F, Fut>(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        work: F,
    ) -> Result<Executed<T>, Error<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Serialize + DeserializeOwned,
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let (lease, resumed, steps) = match self.claim(key, fingerprint).await? {
            Claim::Won {
                lease,
                resumed,
                steps,
            } => (lease, resumed, steps),
            Claim::Replay(response) => {
                observe::count(observe::REPLAYS);
                let value = serde_json::from_slice(&response).map_err(Error::Decode)?;
                return Ok(Executed {
                    value,
                    replayed: true,
                });
            }
            Claim::ReplayFailure(response) => {
                observe::count(observe::REPLAYS);
                let failure: StoredFailure<E> =
                    serde_json::from_slice(&response).map_err(Error::Decode)?;
                return Err(failure.into_error(true));
            }
        };

        let store: Arc<dyn Store> = self.store.clone();
        let context = Context::new(store, lease, resumed, steps);
        let started = Instant::now();
        let result = self
            .run_with_heartbeat(work(context.clone()), &context)
            .await;
        observe::work_duration(started.elapsed());
        if context.is_lease_lost() {
            // Another attempt owns the key: whatever this run produced must not be stored.
            return Err(Error::LeaseLost);
        }
        let lease = context.lease();
        match result {
            Ok(value) => self.store_value(&lease, value).await,
            Err(WorkError::Permanent(error)) => {
                let stored = StoredFailure::Work { error };
                Err(self.store_failure(&lease, stored).await)
            }
            Err(WorkError::Retryable(error)) => {
                // Best effort: if the release fails, the lease simply runs out.
                if let Err(err) = self.store.release(&lease).await {
                    observe::store_error(Operation::Release);
                    tracing::warn!(error = %err, "could not release the lease; it will expire");
                }
                Err(Error::Retryable(error))
            }
            Err(WorkError::Unknown(error)) => Err(Error::OutcomeUnknown(error)),
            Err(WorkError::Interrupted(Interrupted::LeaseLost)) => Err(Error::LeaseLost),
            Err(WorkError::Interrupted(Interrupted::Store(err))) => Err(Error::Store(err)),
            Err(WorkError::Interrupted(other)) => Err(Error::Interrupted(other)),
        }
    }

    /// Claims the key, waiting for another attempt under [`InFlightPolicy::Wait`].
    async fn claim<E>(&self, key: &Key, fingerprint: Fingerprint) -> Result<Claim, Error<E>> {
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
                ClaimOutcome::Replay { response } => Claim::Replay(response),
                ClaimOutcome::ReplayFailure { response } => Claim::ReplayFailure(response),
                ClaimOutcome::InFlight { retry_after } => {
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

    /// Polls `work` to completion, renewing the lease on the heartbeat's schedule. A fenced
    /// renewal marks the lease lost on `context` (the work can watch
    /// [`Context::lease_lost`]); the work itself is not dropped.
    async fn run_with_heartbeat<Fut: Future>(&self, work: Fut, context: &Context) -> Fut::Output {
        let Some(every) = self.settings.heartbeat.interval(self.settings.lease) else {
            return work.await;
        };
        tokio::pin!(work);
        let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                output = &mut work => return output,
                _ = ticks.tick(), if !context.is_lease_lost() => self.renew(context).await,
            }
        }
    }

    async fn renew(&self, context: &Context) {
        let lease = context.lease();
        match context.store().renew(&lease, self.settings.lease).await {
            Ok(RenewOutcome::Renewed(renewed)) => context.set_lease(renewed),
            Ok(RenewOutcome::Fenced) => {
                observe::count(observe::FENCED_WRITES);
                tracing::warn!("heartbeat fenced: another attempt took the key over");
                context.mark_lost();
            }
            Err(err) => {
                // The next beat tries again; the fence protects the result if the lease
                // runs out meanwhile.
                observe::store_error(Operation::Renew);
                tracing::warn!(error = %err, "heartbeat failed");
            }
        }
    }

    fn response_cap(&self) -> usize {
        let cap = self.settings.max_response_bytes;
        self.store
            .max_response_bytes()
            .map_or(cap, |limit| limit.min(cap))
    }

    async fn store_value<T: Serialize, E: Serialize>(
        &self,
        lease: &Lease,
        value: T,
    ) -> Result<Executed<T>, Error<E>> {
        let bytes = match serde_json::to_vec(&value) {
            Ok(bytes) => bytes,
            Err(source) => {
                let stored = StoredFailure::Unserializable;
                let err = self.store_failure(lease, stored).await;
                return Err(match err {
                    Error::Unserializable { .. } => Error::Unserializable {
                        source: Some(source),
                        replayed: false,
                    },
                    other => other,
                });
            }
        };
        let limit = self.response_cap();
        if bytes.len() > limit {
            let stored = StoredFailure::ResultTooLarge {
                size: bytes.len(),
                limit,
            };
            return Err(self.store_failure(lease, stored).await);
        }
        match retry_store(Operation::Complete, || self.store.complete(lease, &bytes)).await? {
            WriteOutcome::Applied => Ok(Executed {
                value,
                replayed: false,
            }),
            WriteOutcome::Fenced => Err(fenced_at_the_end()),
        }
    }

    /// Stores a permanent failure and answers the error to return for it.
    async fn store_failure<E: Serialize>(
        &self,
        lease: &Lease,
        failure: StoredFailure<E>,
    ) -> Error<E> {
        let (bytes, stored) = failure.encode(self.response_cap());
        match retry_store(Operation::Fail, || self.store.fail(lease, &bytes)).await {
            Ok(WriteOutcome::Applied) => stored.into_error(false),
            Ok(WriteOutcome::Fenced) => fenced_at_the_end(),
            Err(err) => Error::Store(err),
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

fn fenced_at_the_end<E>() -> Error<E> {
    observe::count(observe::FENCED_WRITES);
    observe::count(observe::LEASE_LOSSES);
    Error::LeaseLost
}

async fn retry_store<O, Fut>(
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

fn outcome_name<T, E>(result: &Result<Executed<T>, Error<E>>) -> &'static str {
    match result {
        Ok(Executed {
            replayed: false, ..
        }) => "executed",
        Ok(Executed { replayed: true, .. }) => "replayed",
        Err(err) if err.is_replay() => "replayed_failure",
        Err(Error::Failed { .. }) => "failed",
        Err(Error::Retryable(_)) => "retryable",
        Err(Error::OutcomeUnknown(_)) => "outcome_unknown",
        Err(Error::InFlight { .. }) => "in_flight",
        Err(Error::Mismatch) => "mismatch",
        Err(Error::LeaseLost) => "lease_lost",
        Err(Error::Store(_)) => "store_error",
        Err(_) => "error",
    }
}
