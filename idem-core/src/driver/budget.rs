//! How many new keys a scope may create: the guard against key flooding.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// A per-scope budget of new keys (see
/// [`IdempotencyBuilder::key_budget`](crate::IdempotencyBuilder::key_budget)).
///
/// Every key a client invents costs a record for the whole retention. A client that
/// floods a scope with fresh keys fills the store; a budget caps how fast one scope may do
/// that, and answers the excess with [`Error::KeyBudgetExhausted`](crate::Error::KeyBudgetExhausted)
/// (HTTP 429 with `Retry-After` in `idem-http`) before anything is stored.
///
/// How the driver uses it, per `execute`:
/// - `take(scope)` before the claim. If it answers `Ok`, the claim goes ahead; when the
///   claim did not create a record (a replay, a mismatch, in flight, a takeover), the
///   driver calls `give_back(scope)`: only new keys are charged.
/// - If `take` answers `Err(retry_after)`, the driver reads the key's record: a key that
///   already has one (a retry, a replay) goes ahead uncharged; a new key is refused.
///
/// Implementations must be cheap and never block: they run on every `execute`.
pub trait KeyBudget: fmt::Debug + Send + Sync + 'static {
    /// Takes one new key from `scope`'s budget, or answers how long until one is free.
    ///
    /// # Errors
    /// The time after which a new key may be taken again.
    fn take(&self, scope: &str) -> Result<(), Duration>;

    /// Returns one key taken by [`KeyBudget::take`] that turned out not to be new.
    fn give_back(&self, scope: &str);
}

/// The provided [`KeyBudget`]: an in-process token bucket per scope.
///
/// - Each scope may create `keys` new keys at once, refilled at `keys` per `period`.
/// - In-process: with several instances, each has its own buckets (a scope gets `keys`
///   per instance). Implement [`KeyBudget`] over a shared counter for a global budget.
/// - At most `max_scopes` scopes are tracked (default 100 000); full buckets are dropped
///   first. When every tracked bucket is in use, a scope not tracked yet is let through
///   (and a warning logged) rather than refused: availability first.
///
/// ```
/// use idem_core::{driver::KeyBudget, driver::TokenBucket};
/// use std::time::Duration;
///
/// let budget = TokenBucket::new(2, Duration::from_secs(60));
/// assert!(budget.take("acct_42/payments.create").is_ok());
/// assert!(budget.take("acct_42/payments.create").is_ok());
/// let retry_after = budget.take("acct_42/payments.create").unwrap_err();
/// assert!(retry_after <= Duration::from_secs(30));
/// assert!(budget.take("acct_7/payments.create").is_ok(), "scopes have their own buckets");
/// ```
pub struct TokenBucket {
    capacity: f64,
    per_second: f64,
    max_scopes: usize,
    buckets: Mutex<HashMap<Box<str>, Bucket>>,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Scopes a [`TokenBucket`] tracks by default.
pub const DEFAULT_MAX_SCOPES: usize = 100_000;

impl TokenBucket {
    /// `keys` new keys per scope at once, refilled at `keys` per `period`. A zero `keys`
    /// or `period` is raised to 1 key per millisecond's worth, never a division by zero;
    /// a `period` over [`MAX_DURATION`](crate::raw::MAX_DURATION) counts as that.
    pub fn new(keys: u32, period: Duration) -> Self {
        let capacity = f64::from(keys.max(1));
        let period = period
            .clamp(Duration::from_millis(1), crate::raw::MAX_DURATION)
            .as_secs_f64();
        Self {
            capacity,
            per_second: capacity / period,
            max_scopes: DEFAULT_MAX_SCOPES,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// The most scopes tracked at once (default [`DEFAULT_MAX_SCOPES`]).
    pub fn max_scopes(mut self, scopes: usize) -> Self {
        self.max_scopes = scopes.max(1);
        self
    }

    fn refilled(&self, bucket: Bucket, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        (bucket.tokens + elapsed * self.per_second).min(self.capacity)
    }
}

impl KeyBudget for TokenBucket {
    fn take(&self, scope: &str) -> Result<(), Duration> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        if !buckets.contains_key(scope) && buckets.len() >= self.max_scopes {
            // A full bucket is the same as none: drop those first.
            buckets.retain(|_, bucket| self.refilled(*bucket, now) < self.capacity);
            if buckets.len() >= self.max_scopes {
                tracing::warn!(
                    tracked = buckets.len(),
                    "key budget: too many scopes in use to track another; letting it through"
                );
                return Ok(());
            }
        }
        let bucket = buckets.entry(scope.into()).or_insert(Bucket {
            tokens: self.capacity,
            at: now,
        });
        let tokens = self.refilled(*bucket, now);
        if tokens >= 1.0 {
            *bucket = Bucket {
                tokens: tokens - 1.0,
                at: now,
            };
            return Ok(());
        }
        *bucket = Bucket { tokens, at: now };
        // A very slow refill (a period of years) must not overflow the wait.
        let wait = Duration::try_from_secs_f64((1.0 - tokens) / self.per_second)
            .unwrap_or(crate::raw::MAX_DURATION);
        Err(wait.min(crate::raw::MAX_DURATION))
    }

    fn give_back(&self, scope: &str) {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(bucket) = buckets.get_mut(scope) {
            bucket.tokens = (bucket.tokens + 1.0).min(self.capacity);
        }
    }
}

impl fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucket")
            .field("capacity", &self.capacity)
            .field("per_second", &self.per_second)
            .field("max_scopes", &self.max_scopes)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_periods_do_not_panic() {
        for period in [
            Duration::MAX,
            crate::raw::MAX_DURATION,
            Duration::from_secs(u64::MAX),
        ] {
            let bucket = TokenBucket::new(1, period);
            assert_eq!(bucket.take("s"), Ok(()));
            let wait = bucket.take("s").unwrap_err();
            assert!(wait > Duration::ZERO && wait <= crate::raw::MAX_DURATION);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn refills_over_the_period_and_takes_back() {
        let budget = TokenBucket::new(3, Duration::from_secs(3));
        for _ in 0..3 {
            budget.take("s").unwrap();
        }
        let wait = budget.take("s").unwrap_err();
        assert!(wait > Duration::from_millis(900) && wait <= Duration::from_secs(1));
        budget.give_back("s");
        budget.take("s").unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        budget.take("s").unwrap();
        assert!(budget.take("s").is_err());
        tokio::time::advance(Duration::from_secs(60)).await;
        for _ in 0..3 {
            budget.take("s").unwrap();
        }
        assert!(budget.take("s").is_err(), "never more than the capacity");
    }

    #[tokio::test(start_paused = true)]
    async fn tracks_a_bounded_number_of_scopes() {
        let budget = TokenBucket::new(1, Duration::from_secs(60)).max_scopes(2);
        budget.take("a").unwrap();
        budget.take("b").unwrap();
        // Both buckets in use: an untracked scope goes through (every time: it is not
        // tracked), a tracked one is limited.
        budget.take("c").unwrap();
        budget.take("c").unwrap();
        assert!(budget.take("a").is_err());
        tokio::time::advance(Duration::from_secs(60)).await;
        // Refilled buckets are dropped to make room, and the new scope is tracked.
        budget.take("c").unwrap();
        assert!(budget.take("c").is_err());
    }

    /// The wait is for the part of a key not yet refilled.
    #[tokio::test(start_paused = true)]
    async fn the_wait_is_for_what_is_missing_of_a_key() {
        let budget = TokenBucket::new(1, Duration::from_secs(1));
        budget.take("s").unwrap();
        tokio::time::advance(Duration::from_millis(250)).await;
        let wait = budget.take("s").unwrap_err();
        assert!(
            wait > Duration::from_millis(700) && wait <= Duration::from_millis(750),
            "{wait:?}"
        );
    }

    #[test]
    fn debug_shows_the_settings() {
        let shown = format!(
            "{:?}",
            TokenBucket::new(5, Duration::from_secs(10)).max_scopes(7)
        );
        for part in [
            "TokenBucket",
            "capacity: 5.0",
            "per_second: 0.5",
            "max_scopes: 7",
        ] {
            assert!(shown.contains(part), "{shown}");
        }
    }
}
