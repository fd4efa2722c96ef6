//! The stored record and the values that describe it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{Fingerprint, Key};

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
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
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

/// Where a record stands.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum State {
    /// An owner holds (or held) a lease and the work has not finished.
    InProgress,
    /// The work finished; the response is replayed to every retry.
    Completed,
    /// The work failed permanently; the failure is replayed to every retry.
    Failed,
}

impl State {
    /// The name stores write: `in_progress`, `completed` or `failed`.
    pub const fn as_str(self) -> &'static str {
        match self {
            State::InProgress => "in_progress",
            State::Completed => "completed",
            State::Failed => "failed",
        }
    }

    /// Parses a name written by [`State::as_str`].
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "in_progress" => Some(State::InProgress),
            "completed" => Some(State::Completed),
            "failed" => Some(State::Failed),
            _ => None,
        }
    }
}

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

/// Named checkpoints written by the owner of a record, kept across takeovers.
pub type Steps = BTreeMap<String, Vec<u8>>;

/// The right to do the work for one key, until `lease_until`, proven by `token`.
///
/// Every write after a claim carries the lease; the store applies it only while the
/// record still carries this token and attempt and is in progress (fencing).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Lease {
    /// The key the lease is for.
    pub key: Key,
    /// The fencing token: 1 at the first claim, one more at every takeover or re-claim.
    pub token: u64,
    /// The attempt that holds the lease.
    pub attempt: AttemptId,
    /// When the lease ends, on the store's clock.
    pub lease_until: Timestamp,
}

/// One stored idempotency record, as [`Store::get`](crate::Store::get) returns it.
#[derive(Clone, PartialEq, Eq)]
pub struct Record {
    /// Scope and key.
    pub key: Key,
    /// The fingerprint of the request that created the record.
    pub fingerprint: Fingerprint,
    /// Where the record stands.
    pub state: State,
    /// The fencing token of the current (or last) owner.
    pub token: u64,
    /// The attempt of the current (or last) owner.
    pub attempt: AttemptId,
    /// When the current owner's lease ends.
    pub lease_until: Timestamp,
    /// When the record was created; retention counts from here.
    pub created_at: Timestamp,
    /// From this time on the record counts as absent.
    pub expires_at: Timestamp,
    /// The stored result: set when Completed or Failed.
    pub response: Option<Vec<u8>>,
    /// Checkpoints written by owners of this record.
    pub steps: Steps,
}

impl Record {
    /// Whether the record counts as absent at `now` (`now >= expires_at`).
    pub fn is_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }

    /// Whether an owner's lease is live at `now`: in progress and `now < lease_until`.
    pub fn lease_is_live(&self, now: Timestamp) -> bool {
        self.state == State::InProgress && now < self.lease_until
    }
}

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Record")
            .field("key", &self.key)
            .field("fingerprint", &self.fingerprint)
            .field("state", &self.state)
            .field("token", &self.token)
            .field("lease_until", &self.lease_until)
            .field("created_at", &self.created_at)
            .field("expires_at", &self.expires_at)
            .field("response_len", &self.response.as_ref().map(Vec::len))
            .field("steps", &self.steps.keys().collect::<Vec<_>>())
            .finish()
    }
}
