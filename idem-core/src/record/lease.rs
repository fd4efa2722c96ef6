//! The right to do the work: a lease, and the attempt id that claimed it.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{Key, Timestamp};

/// Identifies one claim attempt (128 bits, unique per claim), stored on the record.
///
/// A claim whose answer was lost on the network can be sent again with the same attempt
/// id: it gets the same lease back instead of an in-flight answer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttemptId([u8; 16]);

impl AttemptId {
    /// A fresh attempt id, unique among every process's.
    ///
    /// Each thread starts from 128 random bits of the operating system's generator, drawn
    /// once, and counts up from there: an attempt id only has to be unique, not secret, and
    /// a system call per claim (replays included) was a measurable part of a replay's cost.
    /// Two threads or processes collide only if their random starting points fall within
    /// 2^64 claims of each other in both halves. A child forked from a process that claimed
    /// before the fork would repeat its parent's ids: fork before using idem, or exec.
    ///
    /// Falls back to a time-and-counter start in the (unheard of) case the generator fails.
    pub fn random() -> Self {
        use std::cell::Cell;
        thread_local! {
            static NEXT: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
        }
        NEXT.with(|next| {
            let (high, low) = next.get().unwrap_or_else(Self::start);
            next.set(Some((high, low.wrapping_add(1))));
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&high.to_be_bytes());
            bytes[8..].copy_from_slice(&low.to_be_bytes());
            Self(bytes)
        })
    }

    /// A thread's random starting point.
    fn start() -> (u64, u64) {
        let mut bytes = [0u8; 16];
        if getrandom::fill(&mut bytes).is_err() {
            use std::sync::atomic::{AtomicU64, Ordering};
            static COUNTER: AtomicU64 = AtomicU64::new(0);
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            bytes[..8].copy_from_slice(&nanos.to_be_bytes());
            let count = COUNTER.fetch_add(1, Ordering::Relaxed);
            bytes[8..].copy_from_slice(&(count << 40).to_be_bytes());
        }
        let start = u128::from_be_bytes(bytes);
        ((start >> 64) as u64, start as u64)
    }

    /// Rebuilds an attempt id read back from storage.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The 16 bytes, for storage.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Debug for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AttemptId(")?;
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))?;
        write!(f, ")")
    }
}

/// The right to do the work for one key, until `lease_until`, proven by `token`.
///
/// Every write after a claim carries the lease; the store applies it only while the
/// record still carries this token and attempt and is in progress (fencing).
///
/// Stores build leases with [`Lease::new`] and [`Lease::with_retention`] (or
/// [`machine::lease_of`](crate::machine::lease_of)); the fields are public to read.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{record::AttemptId, Key, record::Lease, Timestamp};
///
/// let lease = Lease::new(
///     Key::new("shop/checkout", "order-7")?,
///     1,
///     AttemptId::random(),
///     Timestamp::from_unix_millis(60_000),
///     Timestamp::from_unix_millis(0),
/// )
/// .with_retention(Duration::from_secs(86_400));
/// assert_eq!(lease.token, 1);
/// assert_eq!(lease.retention, Duration::from_secs(86_400));
/// # Ok::<(), idem_core::key::KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub struct Lease {
    /// The key the lease is for.
    pub key: Key,
    /// The fencing token: 1 at the first claim of a record, one more at every takeover or
    /// re-claim of it. Tokens strictly increase within one record's lifetime; a record
    /// that expired and was deleted starts again at 1, as does one re-claimed after it
    /// expired at [`MAX_TOKEN`](crate::raw::MAX_TOKEN) (see [`Lease::created_at`]).
    pub token: u64,
    /// The attempt that holds the lease.
    pub attempt: AttemptId,
    /// When the lease ends, on the store's clock.
    pub lease_until: Timestamp,
    /// When the record the lease belongs to was created, on the store's clock: it tells
    /// one lifetime of a key from the next, after a record expired and was deleted.
    pub created_at: Timestamp,
    /// The retention of the claim that granted the lease
    /// ([`ClaimRequest::retention`](crate::store::ClaimRequest::retention)). The lease's
    /// renewals and checkpoints keep the record at least this long past the lease's end,
    /// so that an owner that stops (a crash, a pause, a lost heartbeat) leaves its steps
    /// for the retry that takes over, however long the work ran.
    pub retention: Duration,
}

impl Lease {
    /// A lease of `attempt` on `key` with `token`, ending at `lease_until`, on the record
    /// created at `created_at`, with a retention of zero: a store answering a claim sets
    /// the request's with [`Lease::with_retention`].
    pub fn new(
        key: Key,
        token: u64,
        attempt: AttemptId,
        lease_until: Timestamp,
        created_at: Timestamp,
    ) -> Self {
        Self {
            key,
            token,
            attempt,
            lease_until,
            created_at,
            retention: Duration::ZERO,
        }
    }

    /// The same lease with `retention`: the claim request's, which a store answering a
    /// claim must carry over (see [`Lease::retention`]).
    #[must_use]
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The same lease ending at `lease_until` (what a renewal answers).
    #[must_use]
    pub fn with_lease_until(mut self, lease_until: Timestamp) -> Self {
        self.lease_until = lease_until;
        self
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::AttemptId;

    #[test]
    fn attempt_ids_are_unique_within_and_across_threads() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| (0..10_000).map(|_| AttemptId::random()).collect::<Vec<_>>())
            })
            .collect();
        let mut seen = HashSet::new();
        for thread in threads {
            for id in thread.join().expect("no panic") {
                assert!(seen.insert(id), "{id:?} was given twice");
            }
        }
        assert_eq!(seen.len(), 40_000);
    }
}
