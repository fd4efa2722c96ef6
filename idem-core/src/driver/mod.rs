//! The driver: claim, run the work once, store its result, replay it to every retry.

mod context;
mod errors;
mod stored_failure;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

pub use context::Context;
pub use errors::{ConfigError, Error, WorkError};
use stored_failure::StoredFailure;

use crate::{ClaimOutcome, ClaimRequest, Fingerprint, Key, Lease, Store, StoreError, WriteOutcome};

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
    lease: Duration,
    retention: Duration,
    max_response_bytes: usize,
}

/// Settings for [`Idempotency`]; see [`Idempotency::builder`].
#[derive(Debug, Clone)]
#[must_use = "call build() to get the Idempotency"]
pub struct IdempotencyBuilder<S> {
    store: S,
    lease: Duration,
    retention: Duration,
    max_response_bytes: usize,
}

impl<S: Store + 'static> IdempotencyBuilder<S> {
    /// How long one attempt owns a key before another may take over (default 60 s).
    /// Longer than the work usually takes; too long delays recovery after a crash.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long results are kept and replayed, from the first claim (default 24 h).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The largest serialised result stored (default 1 MiB). The store's own limit, when
    /// lower, applies too.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
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
    /// [`ConfigError`] for a zero lease, a retention shorter than the lease or a zero cap.
    pub fn build(self) -> Result<Idempotency<S>, ConfigError> {
        if self.lease.is_zero() {
            return Err(ConfigError::ZeroLease);
        }
        if self.retention < self.lease {
            return Err(ConfigError::RetentionShorterThanLease {
                retention: self.retention,
                lease: self.lease,
            });
        }
        if self.max_response_bytes == 0 {
            return Err(ConfigError::ZeroResponseCap);
        }
        Ok(Idempotency {
            store: Arc::new(self.store),
            lease: self.lease,
            retention: self.retention,
            max_response_bytes: self.max_response_bytes,
        })
    }
}

impl<S: Store + 'static> Idempotency<S> {
    /// A driver with the default lease (60 s), retention (24 h) and cap (1 MiB).
    pub fn new(store: S) -> Self {
        Self {
            store: Arc::new(store),
            lease: DEFAULT_LEASE,
            retention: DEFAULT_RETENTION,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }

    /// Starts a builder with the defaults.
    pub fn builder(store: S) -> IdempotencyBuilder<S> {
        IdempotencyBuilder {
            store,
            lease: DEFAULT_LEASE,
            retention: DEFAULT_RETENTION,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
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
    /// - Another attempt holds a live lease: [`Error::InFlight`] with `retry_after`.
    /// - A different fingerprint under the same key: [`Error::Mismatch`].
    /// - An expired lease of another attempt: takes over ([`Context::resumed`] is true).
    /// - The claim fails in the store: [`Error::Store`]; `work` does not run (fail closed).
    /// - `work` returns [`WorkError::Permanent`]: the error is stored and replayed.
    /// - [`WorkError::Retryable`]: the lease is released, nothing is stored.
    /// - [`WorkError::Unknown`]: the lease is kept until it expires.
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
        let request = ClaimRequest::new(key.clone(), fingerprint, self.lease, self.retention);
        // The same request (same attempt id) on every try: a claim that landed but whose
        // answer was lost returns the same lease instead of in-flight.
        let outcome = retry_store(|| self.store.claim(&request)).await?;
        let (lease, resumed, steps) = match outcome {
            ClaimOutcome::Claimed {
                lease,
                resumed,
                steps,
            } => (lease, resumed, steps),
            ClaimOutcome::Replay { response } => {
                let value = serde_json::from_slice(&response).map_err(Error::Decode)?;
                return Ok(Executed {
                    value,
                    replayed: true,
                });
            }
            ClaimOutcome::ReplayFailure { response } => {
                let failure: StoredFailure<E> =
                    serde_json::from_slice(&response).map_err(Error::Decode)?;
                return Err(failure.into_error(true));
            }
            ClaimOutcome::InFlight { retry_after } => return Err(Error::InFlight { retry_after }),
            ClaimOutcome::Mismatch => return Err(Error::Mismatch),
        };
        if resumed {
            tracing::info!(token = lease.token, "took over an expired lease");
        }

        let context = Context::new(lease.clone(), resumed, steps);
        match work(context).await {
            Ok(value) => self.store_value(&lease, value).await,
            Err(WorkError::Permanent(error)) => {
                let stored = StoredFailure::Work { error };
                Err(self.store_failure(&lease, stored).await)
            }
            Err(WorkError::Retryable(error)) => {
                // Best effort: if the release fails, the lease simply runs out.
                if let Err(err) = self.store.release(&lease).await {
                    tracing::warn!(error = %err, "could not release the lease; it will expire");
                }
                Err(Error::Retryable(error))
            }
            Err(WorkError::Unknown(error)) => Err(Error::OutcomeUnknown(error)),
        }
    }

    fn response_cap(&self) -> usize {
        self.store
            .max_response_bytes()
            .map_or(self.max_response_bytes, |limit| {
                limit.min(self.max_response_bytes)
            })
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
        match retry_store(|| self.store.complete(lease, &bytes)).await? {
            WriteOutcome::Applied => Ok(Executed {
                value,
                replayed: false,
            }),
            WriteOutcome::Fenced => Err(Error::LeaseLost),
        }
    }

    /// Stores a permanent failure and answers the error to return for it.
    async fn store_failure<E: Serialize>(
        &self,
        lease: &Lease,
        failure: StoredFailure<E>,
    ) -> Error<E> {
        let (bytes, stored) = failure.encode(self.response_cap());
        match retry_store(|| self.store.fail(lease, &bytes)).await {
            Ok(WriteOutcome::Applied) => stored.into_error(false),
            Ok(WriteOutcome::Fenced) => Error::LeaseLost,
            Err(err) => Error::Store(err),
        }
    }
}

async fn retry_store<O, Fut>(mut call: impl FnMut() -> Fut) -> Result<O, StoreError>
where
    Fut: Future<Output = Result<O, StoreError>>,
{
    let mut tries = 1;
    loop {
        match call().await {
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
