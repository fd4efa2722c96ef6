//! The right to do the work: a lease, and the attempt id that claimed it.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{Key, Timestamp};

/// Identifies one claim attempt (128 random bits), stored on the record.
///
/// A claim whose answer was lost on the network can be sent again with the same attempt
/// id: it gets the same lease back instead of an in-flight answer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttemptId([u8; 16]);

impl AttemptId {
    /// A fresh random attempt id from the operating system's generator.
    ///
    /// Falls back to a time-and-counter id in the (unheard of) case the generator fails,
    /// since an attempt id only has to be unique, not secret.
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        if getrandom::fill(&mut bytes).is_err() {
            use std::sync::atomic::{AtomicU64, Ordering};
            static COUNTER: AtomicU64 = AtomicU64::new(0);
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            bytes[..8].copy_from_slice(&nanos.to_be_bytes());
            bytes[8..].copy_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_be_bytes());
        }
        Self(bytes)
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
/// Stores build leases with [`Lease::new`] (or [`machine::lease_of`](crate::machine::lease_of));
/// the fields are public to read.
///
/// ```
/// use idem_core::{record::AttemptId, Key, record::Lease, Timestamp};
///
/// let lease = Lease::new(
///     Key::new("shop/checkout", "order-7")?,
///     1,
///     AttemptId::random(),
///     Timestamp::from_unix_millis(60_000),
///     Timestamp::from_unix_millis(0),
/// );
/// assert_eq!(lease.token, 1);
/// # Ok::<(), idem_core::key::KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub struct Lease {
    /// The key the lease is for.
    pub key: Key,
    /// The fencing token: 1 at the first claim of a record, one more at every takeover or
    /// re-claim of it. Tokens strictly increase within one record's lifetime; a record
    /// that expired and was deleted starts again (see [`Lease::created_at`]).
    pub token: u64,
    /// The attempt that holds the lease.
    pub attempt: AttemptId,
    /// When the lease ends, on the store's clock.
    pub lease_until: Timestamp,
    /// When the record the lease belongs to was created, on the store's clock: it tells
    /// one lifetime of a key from the next, after a record expired and was deleted.
    pub created_at: Timestamp,
}

impl Lease {
    /// A lease of `attempt` on `key` with `token`, ending at `lease_until`, on the record
    /// created at `created_at`.
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
        }
    }

    /// The same lease ending at `lease_until` (what a renewal answers).
    #[must_use]
    pub fn with_lease_until(mut self, lease_until: Timestamp) -> Self {
        self.lease_until = lease_until;
        self
    }
}
