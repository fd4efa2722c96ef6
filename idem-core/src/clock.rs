//! Clocks for stores that keep time in the process (memory, SQLite).

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::Timestamp;

/// A source of `now` for stores that have no server clock.
pub trait Clock: Send + Sync + Debug {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The process's wall clock.
#[derive(Clone, Copy, Default, Debug)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that moves only when told to: deterministic lease expiry in tests.
///
/// Clones share the same time.
///
/// ```
/// use idem_core::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let start = clock.now();
/// clock.advance(Duration::from_secs(30));
/// assert_eq!(clock.now().saturating_duration_since(start), Duration::from_secs(30));
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock set to an arbitrary fixed start (2026-01-01T00:00:00Z).
    pub fn new() -> Self {
        Self::starting_at(Timestamp::from_unix_millis(1_767_225_600_000))
    }

    /// A clock set to `start`.
    pub fn starting_at(start: Timestamp) -> Self {
        Self(Arc::new(AtomicU64::new(start.as_unix_millis())))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let millis = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(millis))
            })
            .ok();
    }

    /// Sets the clock to `to` (it may move backwards, to test clock skew).
    pub fn set(&self, to: Timestamp) {
        self.0.store(to.as_unix_millis(), Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_unix_millis(self.0.load(Ordering::SeqCst))
    }
}
