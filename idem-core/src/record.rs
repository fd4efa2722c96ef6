//! The stored record and the values that describe it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{Fingerprint, Key, StoreError};

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
///
/// Stores build leases with [`Lease::new`] (or [`machine::lease_of`](crate::machine::lease_of));
/// the fields are public to read.
///
/// ```
/// use idem_core::{AttemptId, Key, Lease, Timestamp};
///
/// let lease = Lease::new(
///     Key::new("shop/checkout", "order-7")?,
///     1,
///     AttemptId::random(),
///     Timestamp::from_unix_millis(60_000),
///     Timestamp::from_unix_millis(0),
/// );
/// assert_eq!(lease.token, 1);
/// # Ok::<(), idem_core::KeyError>(())
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

/// One stored idempotency record, as [`Store::get`](crate::Store::get) returns it.
///
/// The state machine ([`crate::machine`]) builds records; a store that reads one back
/// from its storage builds it with [`Record::parts`], which checks every field. The
/// fields are public to read.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
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
    /// From this time on the record is expired: it counts as absent once no live lease
    /// holds it.
    pub expires_at: Timestamp,
    /// The stored result: set when Completed or Failed.
    pub response: Option<Vec<u8>>,
    /// Checkpoints written by owners of this record.
    pub steps: Steps,
}

impl Record {
    /// Whether retention has ended at `now` (`now >= expires_at`). An expired record still
    /// counts as present while a live lease holds it; see [`Record::is_absent`].
    pub fn is_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }

    /// Whether an owner's lease is live at `now`: in progress and `now < lease_until`.
    pub fn lease_is_live(&self, now: Timestamp) -> bool {
        self.state == State::InProgress && now < self.lease_until
    }

    /// Whether the record counts as absent at `now`: expired **and** held by no live
    /// lease. A live owner's record is in flight, whatever its retention.
    ///
    /// ```
    /// use idem_core::{machine, AttemptId, ClaimRequest, Fingerprint, Key, Timestamp};
    /// use std::time::Duration;
    ///
    /// let now = Timestamp::from_unix_millis(1_000);
    /// // A one-minute lease on a record kept for zero seconds.
    /// let request = ClaimRequest::new(Key::new("s", "k")?, Fingerprint::of_bytes("r"), Duration::from_secs(60), Duration::ZERO);
    /// let record = machine::claim(None, &request, now).write.unwrap();
    /// assert!(record.is_expired(now));
    /// assert!(!record.is_absent(now), "the live lease holds it");
    /// assert!(record.is_absent(record.lease_until));
    /// # Ok::<(), idem_core::KeyError>(())
    /// ```
    pub fn is_absent(&self, now: Timestamp) -> bool {
        self.is_expired(now) && !self.lease_is_live(now)
    }

    /// Starts rebuilding a record of `key` from the fields a store read back.
    pub fn parts(key: Key) -> RecordParts {
        RecordParts {
            key,
            fingerprint: None,
            state: None,
            token: None,
            attempt: None,
            lease_until: None,
            created_at: None,
            expires_at: None,
            response: None,
            steps: Steps::new(),
            error: None,
        }
    }
}

/// Rebuilds a [`Record`] from the raw fields a store read back, checking each one: the one
/// validated decoder every backend shares. Start it with [`Record::parts`].
///
/// Numbers are accepted as any integer type and refused when negative; a missing or
/// malformed field makes [`RecordParts::build`] answer [`StoreError::Corrupt`] naming it.
///
/// ```
/// use idem_core::{AttemptId, Fingerprint, Key, Record, State, StoreError};
///
/// let record = Record::parts(Key::new("shop/checkout", "order-7")?)
///     .fingerprint(Fingerprint::of_bytes("req").as_bytes())
///     .state("completed")
///     .token(3_i64)
///     .attempt(AttemptId::random().as_bytes())
///     .lease_until_millis(2_000_i64)
///     .created_at_millis(1_000_i64)
///     .expires_at_millis(90_000_i64)
///     .response(Some(b"ok".to_vec()))
///     .step("debit", b"1".to_vec())
///     .build()?;
/// assert_eq!((record.state, record.token), (State::Completed, 3));
///
/// let corrupt = Record::parts(Key::new("s", "k")?).fingerprint(b"short").build();
/// assert!(matches!(corrupt, Err(StoreError::Corrupt { what: "a fingerprint that is not 32 bytes", .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[must_use = "call build() to get the record"]
pub struct RecordParts {
    key: Key,
    fingerprint: Option<Fingerprint>,
    state: Option<State>,
    token: Option<u64>,
    attempt: Option<AttemptId>,
    lease_until: Option<Timestamp>,
    created_at: Option<Timestamp>,
    expires_at: Option<Timestamp>,
    response: Option<Vec<u8>>,
    steps: Steps,
    error: Option<&'static str>,
}

impl RecordParts {
    fn check<T>(&mut self, value: Option<T>, what: &'static str) -> Option<T> {
        if value.is_none() && self.error.is_none() {
            self.error = Some(what);
        }
        value
    }

    /// The fingerprint's 32 bytes.
    pub fn fingerprint(mut self, bytes: &[u8]) -> Self {
        let value = <[u8; 32]>::try_from(bytes)
            .ok()
            .map(Fingerprint::from_bytes);
        self.fingerprint = self.check(value, "a fingerprint that is not 32 bytes");
        self
    }

    /// The state's name, as [`State::as_str`] writes it.
    pub fn state(mut self, name: impl AsRef<[u8]>) -> Self {
        let value = std::str::from_utf8(name.as_ref())
            .ok()
            .and_then(State::parse);
        self.state = self.check(value, "an unknown state");
        self
    }

    /// The fencing token; at least 1 and at most [`MAX_TOKEN`](crate::MAX_TOKEN).
    pub fn token(mut self, token: impl TryInto<u64>) -> Self {
        let value = token
            .try_into()
            .ok()
            .filter(|token| (1..=crate::MAX_TOKEN).contains(token));
        self.token = self.check(value, "a token outside 1 to 2^53 - 1");
        self
    }

    /// The attempt id's 16 bytes.
    pub fn attempt(mut self, bytes: &[u8]) -> Self {
        let value = <[u8; 16]>::try_from(bytes).ok().map(AttemptId::from_bytes);
        self.attempt = self.check(value, "an attempt id that is not 16 bytes");
        self
    }

    fn millis(&mut self, millis: impl TryInto<u64>, what: &'static str) -> Option<Timestamp> {
        let value = millis.try_into().ok().map(Timestamp::from_unix_millis);
        self.check(value, what)
    }

    /// The lease end, in milliseconds since the Unix epoch.
    pub fn lease_until_millis(mut self, millis: impl TryInto<u64>) -> Self {
        self.lease_until = self.millis(millis, "a lease end before 1970");
        self
    }

    /// The creation time, in milliseconds since the Unix epoch.
    pub fn created_at_millis(mut self, millis: impl TryInto<u64>) -> Self {
        self.created_at = self.millis(millis, "a creation time before 1970");
        self
    }

    /// The expiry, in milliseconds since the Unix epoch.
    pub fn expires_at_millis(mut self, millis: impl TryInto<u64>) -> Self {
        self.expires_at = self.millis(millis, "an expiry before 1970");
        self
    }

    /// The stored response, if any.
    pub fn response(mut self, response: Option<Vec<u8>>) -> Self {
        self.response = response;
        self
    }

    /// One checkpoint; its name must be UTF-8.
    pub fn step(mut self, name: impl Into<Vec<u8>>, value: Vec<u8>) -> Self {
        match String::from_utf8(name.into()) {
            Ok(name) => {
                self.steps.insert(name, value);
            }
            Err(_) => {
                self.check(None::<()>, "a step name that is not UTF-8");
            }
        }
        self
    }

    /// The record, or [`StoreError::Corrupt`] naming the first field that was missing or
    /// malformed.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`].
    pub fn build(mut self) -> Result<Record, StoreError> {
        let key = Some(self.key.short_hash());
        let corrupt = |what| StoreError::Corrupt {
            what,
            key,
            source: None,
        };
        if let Some(what) = self.error {
            return Err(corrupt(what));
        }
        let missing = |what: &'static str| move || corrupt(what);
        let record = Record {
            fingerprint: self
                .fingerprint
                .ok_or_else(missing("a missing fingerprint"))?,
            state: self.state.ok_or_else(missing("a missing state"))?,
            token: self.token.ok_or_else(missing("a missing token"))?,
            attempt: self.attempt.ok_or_else(missing("a missing attempt id"))?,
            lease_until: self
                .lease_until
                .ok_or_else(missing("a missing lease end"))?,
            created_at: self
                .created_at
                .ok_or_else(missing("a missing creation time"))?,
            expires_at: self.expires_at.ok_or_else(missing("a missing expiry"))?,
            response: self.response.take(),
            steps: std::mem::take(&mut self.steps),
            key: self.key,
        };
        Ok(record)
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
