//! The driver's settings: the builder, its defaults and their validation.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::policy::Jitter;
use super::{
    ConfigError, DEFAULT_LEASE, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_RETENTION,
    DEFAULT_STORE_TIMEOUT, Heartbeat, Idempotency, InFlightPolicy, KeyBudget, KeyPolicy, Provider,
    SettingsWarning, policy, provider,
};
#[allow(unused_imports)]
use super::{Context, Error, TokenBucket, observe};
use crate::codec::PlainCodec;
use crate::raw::MAX_DURATION;
use crate::{Codec, Store};

#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub(super) lease: Duration,
    pub(super) retention: Duration,
    pub(super) max_response_bytes: usize,
    pub(super) heartbeat: Heartbeat,
    pub(super) in_flight: InFlightPolicy,
    pub(super) store_timeout: Duration,
    pub(super) codec: Arc<dyn Codec>,
    pub(super) key_policy: KeyPolicy,
    pub(super) budget: Option<Arc<dyn KeyBudget>>,
    pub(super) scope_label: Option<ScopeLabel>,
    pub(super) providers: Vec<Provider>,
    pub(super) warnings: Vec<SettingsWarning>,
    pub(super) jitter: Jitter,
}

/// The application's map from a scope to a metrics label.
#[derive(Clone)]
pub(super) struct ScopeLabel(pub(super) Arc<dyn Fn(&str) -> String + Send + Sync>);

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
            jitter: Jitter::default(),
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
    pub(super) store: S,
    pub(super) settings: Settings,
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
    /// - The release after [`WorkError::Retryable`](crate::WorkError::Retryable): 3 tries, `3T + 75 ms`.
    /// - A heartbeat: one try, bounded by the heartbeat interval.
    ///
    /// The work's own time, and its undos', come on top: idem never cuts the work short.
    /// The bound starts at a call's first wait: a store that blocks its thread before
    /// returning to the runtime (it should not) is not cut short by it.
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

    /// Draws the backoff jitter of the driver's store retries and of a waiting duplicate's
    /// polls from a generator seeded with `seed`, instead of the operating system's.
    ///
    /// For simulations that must replay a run exactly (idem-testkit's explorer seeds each
    /// process's driver); leave it unset in production, where processes seeded alike
    /// would back off in step.
    ///
    /// ```
    /// use idem_core::{Idempotency, MemoryStore};
    ///
    /// let idem = Idempotency::builder(MemoryStore::new()).jitter_seed(7).build()?;
    /// # let _ = idem;
    /// # Ok::<(), idem_core::ConfigError>(())
    /// ```
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.settings.jitter = Jitter::seeded(seed);
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
    /// A retry after [`WorkError::Retryable`](crate::WorkError::Retryable) with no step
    /// recorded claims a forgotten key, so it is charged as a new key (and refused once
    /// the scope's budget is spent).
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
    /// over [`MAX_DURATION`], a zero cap, a heartbeat interval that is zero or longer
    /// than nine tenths of the lease less a fiftieth (when the owner stops itself), or
    /// the automatic heartbeat with a lease under 3 ms.
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
            // A renewal must land before the owner stops itself, a fiftieth of the lease
            // before its end: a tenth of that is left for the tick and the round trip.
            Heartbeat::Every(every)
                if every.is_zero()
                    || every > (lease - lease / policy::LOCAL_EXPIRY_FRACTION) * 9 / 10 =>
            {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    /// The documented defaults: a lease of a minute, results replayed for a day.
    #[test]
    fn the_defaults_are_a_minute_and_a_day() {
        let idem = Idempotency::new(MemoryStore::new());
        assert_eq!(idem.lease(), Duration::from_secs(60));
        assert_eq!(idem.retention(), Duration::from_secs(86_400));
    }

    /// The automatic heartbeat needs a lease of 3 ms or more: exactly 3 ms is enough.
    #[test]
    fn the_automatic_heartbeat_takes_a_lease_of_exactly_its_minimum() {
        let built = Idempotency::builder(MemoryStore::new())
            .lease(policy::AUTO_HEARTBEAT_MIN_LEASE)
            .heartbeat(Heartbeat::Auto)
            .build();
        assert!(built.is_ok(), "{built:?}");
        let shorter = Idempotency::builder(MemoryStore::new())
            .lease(policy::AUTO_HEARTBEAT_MIN_LEASE - Duration::from_nanos(1))
            .heartbeat(Heartbeat::Auto)
            .build();
        assert!(
            matches!(shorter, Err(ConfigError::LeaseTooShortForHeartbeat { .. })),
            "{shorter:?}"
        );
    }

    /// `Debug` shows the settings, and a scope label as a function it cannot print.
    #[test]
    fn debug_shows_the_settings() {
        let idem = Idempotency::builder(MemoryStore::new())
            .scope_label(|scope| scope.to_owned())
            .build()
            .unwrap();
        let shown = format!("{idem:?}");
        for part in ["Idempotency", "settings", "lease: 60s", "ScopeLabel(..)"] {
            assert!(shown.contains(part), "{shown}");
        }
    }
}
