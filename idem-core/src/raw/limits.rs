//! The largest duration idem works with, defined once for every backend.

use std::time::Duration;

/// The largest fencing token a record may hold: 2^53 - 1, the largest integer every
/// backend represents exactly (Redis's Lua counts in doubles). No key reaches it by
/// takeovers (one a millisecond would take 285 000 years). The state machine hands out
/// none past it: at it, a takeover or an operator's release is refused
/// ([`TokenAtLimit`](crate::machine::TokenAtLimit)). A stored token beyond it was not
/// written by this version of idem, and the record is refused as corrupt rather than
/// fenced wrongly.
pub const MAX_TOKEN: u64 = (1 << 53) - 1;

/// The longest lease, retention or renewal idem accepts: 100 years of 365 days.
///
/// Every backend represents it exactly: added to any time before the year 2200 it stays
/// well inside PostgreSQL's `timestamptz`, Redis's `PEXPIREAT`, the 53-bit integers of
/// Redis's Lua, SQLite's and DynamoDB's numbers. The driver's builder refuses anything
/// longer ([`ConfigError::DurationTooLong`](crate::ConfigError::DurationTooLong)); a store
/// handed a longer duration directly (a [`ClaimRequest`](crate::store::ClaimRequest) built by
/// hand, a renewal) treats it as this one, so no backend ever sees an out-of-range value.
///
/// ```
/// use idem_core::{Idempotency, MemoryStore, raw::MAX_DURATION};
///
/// // "As long as idem can": a century.
/// let idem = Idempotency::builder(MemoryStore::new()).retention(MAX_DURATION).build()?;
/// # let _ = idem;
/// assert!(Idempotency::builder(MemoryStore::new()).retention(std::time::Duration::MAX).build().is_err());
/// # Ok::<(), idem_core::ConfigError>(())
/// ```
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `duration`, or [`MAX_DURATION`] when it is longer: what every store applies to the
/// durations it is handed.
///
/// ```
/// use idem_core::{raw::clamp_duration, raw::MAX_DURATION};
/// use std::time::Duration;
///
/// assert_eq!(clamp_duration(Duration::MAX), MAX_DURATION);
/// assert_eq!(clamp_duration(Duration::from_secs(1)), Duration::from_secs(1));
/// ```
pub fn clamp_duration(duration: Duration) -> Duration {
    duration.min(MAX_DURATION)
}

/// Whole milliseconds of `duration` after [`clamp_duration`]: always exact in an `i64`, a
/// `u64` and a Lua number.
///
/// ```
/// use idem_core::raw::duration_millis;
/// use std::time::Duration;
///
/// assert_eq!(duration_millis(Duration::from_micros(1_999)), 1);
/// assert_eq!(duration_millis(Duration::MAX), 3_153_600_000_000);
/// ```
pub fn duration_millis(duration: Duration) -> u64 {
    // At most 3.2e12: the cast cannot truncate.
    clamp_duration(duration).as_millis() as u64
}
