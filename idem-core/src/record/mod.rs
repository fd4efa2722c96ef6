//! The stored record and the values that describe it.
//!
//! - this file: [`Record`], [`State`], [`Steps`], [`ValuePart`].
//! - `timestamp.rs`: [`Timestamp`].
//! - `lease.rs`: [`Lease`], [`AttemptId`].
//! - `parts.rs`: [`RecordParts`], the decoder stores share.

mod lease;
mod parts;
mod timestamp;

use std::collections::BTreeMap;
use std::fmt;

pub use lease::{AttemptId, Lease};
pub use parts::RecordParts;
pub use timestamp::Timestamp;

use crate::{Fingerprint, Key};

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

/// Which of a record's values something is about: a value the store or the driver could
/// not keep, a codec's error, where a ciphertext is bound.
///
/// ```
/// use idem_core::record::ValuePart;
///
/// assert_eq!(ValuePart::Step("charge".into()).to_string(), "the value of step `charge`");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ValuePart {
    /// The work's result.
    Result,
    /// The work's permanent error (a stored failure).
    Failure,
    /// The value of a step, by name.
    Step(String),
}

impl fmt::Display for ValuePart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValuePart::Result => f.write_str("the result"),
            ValuePart::Failure => f.write_str("the permanent error"),
            ValuePart::Step(step) => write!(f, "the value of step `{step}`"),
        }
    }
}

/// Named checkpoints written by the owner of a record, kept across takeovers.
pub type Steps = BTreeMap<String, Vec<u8>>;

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
    /// use idem_core::{machine, record::AttemptId, store::ClaimRequest, Fingerprint, Key, Timestamp};
    /// use std::time::Duration;
    ///
    /// let now = Timestamp::from_unix_millis(1_000);
    /// // A one-minute lease on a record kept for zero seconds.
    /// let request = ClaimRequest::new(Key::new("s", "k")?, Fingerprint::of_bytes("r"), Duration::from_secs(60), Duration::ZERO);
    /// let record = machine::claim(None, &request, now)?.write.unwrap();
    /// assert!(record.is_expired(now));
    /// assert!(!record.is_absent(now), "the live lease holds it");
    /// assert!(record.is_absent(record.lease_until));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_absent(&self, now: Timestamp) -> bool {
        self.is_expired(now) && !self.lease_is_live(now)
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
