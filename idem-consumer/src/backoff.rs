//! The delay before a retryable failure is delivered again.

use std::time::Duration;

/// Exponential backoff by delivery count: `first`, then twice as long for each
/// redelivery the broker counted, never over `max`.
///
/// ```
/// use idem_consumer::Backoff;
/// use std::time::Duration;
///
/// let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30))?;
/// assert_eq!(backoff.delay(Some(1)), Duration::from_secs(1));
/// assert_eq!(backoff.delay(Some(3)), Duration::from_secs(4));
/// assert_eq!(backoff.delay(Some(60)), Duration::from_secs(30));
/// // A broker that does not count deliveries gets the first delay.
/// assert_eq!(backoff.delay(None), Duration::from_secs(1));
/// # Ok::<(), idem_consumer::BackoffError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
}

/// A [`Backoff`] that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackoffError {
    /// The first delay was zero: a retryable failure would be redelivered at once, in a
    /// loop, as fast as the broker can.
    #[error("the first backoff delay is zero; give at least a millisecond")]
    ZeroDelay,
    /// The first delay was longer than the largest.
    #[error("the first backoff delay ({first:?}) is longer than the largest ({max:?})")]
    FirstOverMax {
        /// The first delay given.
        first: Duration,
        /// The largest delay given.
        max: Duration,
    },
}

impl Backoff {
    /// A backoff from `first` up to `max` (at most [`MAX_DURATION`](idem_core::raw::MAX_DURATION),
    /// a hundred years: a larger `max` is taken as that).
    ///
    /// # Errors
    /// [`BackoffError`] when `first` is zero or longer than `max`.
    pub fn new(first: Duration, max: Duration) -> Result<Self, BackoffError> {
        if first.is_zero() {
            return Err(BackoffError::ZeroDelay);
        }
        if first > max {
            return Err(BackoffError::FirstOverMax { first, max });
        }
        // Brokers take delays in 64-bit nanoseconds (JetStream reads a larger one as no
        // delay at all): "no cap" means the longest duration idem stores.
        let max = max.min(idem_core::raw::MAX_DURATION);
        Ok(Self {
            first: first.min(max),
            max,
        })
    }

    /// The delay before delivery number `delivered + 1`, `delivered` being the count the
    /// broker gave for the one that failed (1 for the first delivery).
    pub fn delay(&self, delivered: Option<u64>) -> Duration {
        let doublings = delivered.unwrap_or(1).saturating_sub(1).min(32) as u32;
        self.first
            .checked_mul(1u32 << doublings.min(31))
            .map_or(self.max, |delay| delay.min(self.max))
    }
}

impl Default for Backoff {
    /// One second, doubling up to five minutes.
    fn default() -> Self {
        Self {
            first: Duration::from_secs(1),
            max: Duration::from_secs(300),
        }
    }
}
