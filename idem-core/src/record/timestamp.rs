//! Points on a store's clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point on a store's clock, in milliseconds since the Unix epoch.
///
/// Times are always read from the store's clock (the database server's where it has one),
/// never compared against another machine's clock.
///
/// ```
/// use idem_core::Timestamp;
/// use std::time::Duration;
///
/// let t = Timestamp::from_unix_millis(1_000);
/// assert_eq!(t.saturating_add(Duration::from_secs(1)).as_unix_millis(), 2_000);
/// assert_eq!(t.saturating_duration_since(Timestamp::from_unix_millis(400)), Duration::from_millis(600));
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Timestamp(u64);

impl Timestamp {
    /// Builds a timestamp from milliseconds since the Unix epoch.
    pub const fn from_unix_millis(millis: u64) -> Self {
        Self(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_unix_millis(self) -> u64 {
        self.0
    }

    /// This process's wall clock.
    pub fn now() -> Self {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Self(u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX))
    }

    /// `self + duration`, saturating at the end of time rather than overflowing.
    pub fn saturating_add(self, duration: Duration) -> Self {
        let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(millis))
    }

    /// How long after `earlier` this is; zero when it is not after it.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}
