//! The `Store` trait: one method per transition, each one atomic native operation.
//!
//! - this file: [`Store`], [`Expiry`].
//! - `error.rs`: [`StoreError`], [`Operation`], [`BoxError`].
//! - [`ClaimRequest`] and the answers of each transition ([`ClaimOutcome`],
//!   [`WriteOutcome`], [`RenewOutcome`]): `outcomes.rs`.
//! - `completion.rs`: [`Completion`], a result written in the caller's own transaction.
//! - `forward.rs`: `Store` and [`Admin`](crate::Admin) for `Arc`, `Box` and `&`.

mod completion;
mod error;
mod forward;
mod outcomes;

pub use completion::Completion;
pub use error::{BoxError, Operation, StoreError};
pub use outcomes::{ClaimOutcome, ClaimRequest, RenewOutcome, WriteOutcome};

use std::time::Duration;

use async_trait::async_trait;

use crate::{Key, Record, key::StepName, record::Lease};

/// How a store gets rid of records once they are absent (expired, no live lease):
/// [`Store::expiry`] declares it, so that callers and the conformance suite know whether
/// [`Store::purge_expired`] must run.
///
/// ```
/// use idem_core::{store::Expiry, MemoryStore, Store};
///
/// assert_eq!(MemoryStore::new().expiry(), Expiry::Purge);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Expiry {
    /// Records stay until [`Store::purge_expired`] deletes them: run it regularly (see
    /// [`Purger`](crate::Purger)). PostgreSQL, SQLite and the memory store.
    Purge,
    /// The store deletes each record itself the moment it becomes absent (Redis with
    /// `PEXPIREAT`); `purge_expired` finds nothing to do, and a key claimed after its
    /// record vanished starts a new lifetime at token 1.
    Vanishes,
    /// The store deletes absent records itself, some time later (DynamoDB TTL, typically
    /// within days); `purge_expired` may hurry it, at the cost of scanning.
    Eventually,
}

/// Where idempotency records live.
///
/// **The contract.** Every method is one atomic operation on the backend (one statement,
/// one script, one conditional write, one transaction) whose answer equals what the pure
/// state machine in [`crate::machine`] answers for the record as it was just before,
/// at the store's clock. Expected outcomes are values; only backend failures are errors.
/// Run `idem-testkit`'s conformance suite to check an implementation.
///
/// **Fencing.** Every write after a claim carries the [`Lease`] and applies only while the
/// record is present, in progress, and carries the lease's token *and* attempt id;
/// otherwise it answers [`WriteOutcome::Fenced`] and changes nothing.
///
/// **Time.** `now` is the store's clock: the database server's where it has one.
/// A lease is live while `now < lease_until`; a record is expired once `now >= expires_at`,
/// and it counts as absent (everywhere: claim, writes, `get`, purge) only when it is
/// expired **and** no live lease holds it. A live owner's record is never claimed
/// afresh, whatever its retention. Durations longer than
/// [`MAX_DURATION`](crate::raw::MAX_DURATION) count as that ([`clamp_duration`](crate::raw::clamp_duration)).
///
/// **Names.** A store that keeps records in a flat key space under a namespace (a key
/// prefix) must map (namespace, scope, key) to its storage key injectively and never
/// reach past its own namespace; [`crate::raw::storage_name`] does exactly that.
///
/// # Writing a store of your own
///
/// 1. Read the memory store (`idem-core/src/memory.rs`, [`MemoryStore`](crate::MemoryStore)):
///    the reference implementation. Each method reads the record, asks the matching
///    [`crate::machine`] function what to answer and what to write, and writes it, all
///    under one lock. Yours does the same inside one atomic operation of its backend;
///    `docs/DESIGN.md` §6 in the repository shows how SQLite (`BEGIN IMMEDIATE`),
///    PostgreSQL (one statement), Redis (one Lua script) and DynamoDB (one conditional
///    write) do it.
/// 2. Rebuild records you read with [`Record::parts`] (the validated decoder every
///    backend shares); take the helpers of [`crate::raw`] (bounds, storage names,
///    listing) rather than writing your own.
/// 3. Declare what differs: [`Store::expiry`], [`Store::max_record_bytes`].
/// 4. Run the conformance suite on it (`idem_testkit::conformance_tests!`, and
///    `admin_conformance_tests!` for [`Admin`](crate::Admin)), then the fault-point
///    explorer (`idem_testkit::explore::assert_sample_passes`). Both are published for
///    exactly this, and the suite proves it fails on broken stores.
///
/// Usable as `Arc<dyn Store>`:
///
/// ```
/// use std::sync::Arc;
/// use idem_core::{MemoryStore, Store};
///
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// # let _ = store;
/// ```
#[async_trait]
pub trait Store: Send + Sync {
    /// Claims `request.key` for `request.attempt`.
    ///
    /// - No record, or an absent one (expired, no live lease): writes a fresh in-progress
    ///   record (token = the old record's token + 1, or 1; steps cleared;
    ///   `expires_at = now + retention`; `lease_until = now + lease`) and answers
    ///   [`ClaimOutcome::Claimed`] with `resumed: false`.
    /// - A present record with another fingerprint: [`ClaimOutcome::Mismatch`], whatever
    ///   its state.
    /// - Completed: [`ClaimOutcome::Replay`] with the stored response, byte for byte.
    /// - Failed: [`ClaimOutcome::ReplayFailure`] with the stored response, byte for byte.
    /// - In progress with a live lease held by the same attempt id: the same lease again
    ///   (`Claimed`, `resumed: false`, stored steps), writing nothing.
    /// - In progress with a live lease: [`ClaimOutcome::InFlight`] with the time left,
    ///   even when the record's retention has ended.
    /// - In progress with an ended lease held by the same attempt id (a late copy of a
    ///   claim that attempt already won): `InFlight` with zero time left, writing nothing.
    /// - In progress with an expired lease: takeover: token + 1, the new attempt id,
    ///   `lease_until = now + lease`,
    ///   `expires_at = max(expires_at, lease_until + retention)`
    ///   ([`machine::kept_past`](crate::machine::kept_past)), steps kept, `Claimed` with
    ///   `resumed: true`.
    /// - The lease answered carries the record's `created_at` and the request's
    ///   `retention` ([`Lease::with_retention`]).
    /// - Exactly one of any number of concurrent claims on a fresh key (or of a takeover)
    ///   is `Claimed`.
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError>;

    /// Stores `response` as the result of the work and marks the record Completed.
    ///
    /// - Applies only while the fence holds (see the trait docs); otherwise `Fenced`.
    /// - Keeps the fingerprint, token, steps, `created_at` and `lease_until`.
    /// - Sets `expires_at = max(expires_at, now + lease.retention)`
    ///   ([`machine::kept_past`](crate::machine::kept_past)): a result stored late (work
    ///   kept alive past its retention by heartbeats, or a takeover near its end) is still
    ///   replayed for one whole retention.
    /// - Retried by the same owner after the first call landed (record Completed with the
    ///   lease's token and attempt): `Applied`, writing nothing.
    /// - A response the store cannot hold (see [`Store::max_record_bytes`]) is
    ///   [`StoreError::TooLarge`] naming [`ValuePart::Result`](crate::record::ValuePart::Result)
    ///   and writes nothing.
    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError>;

    /// Stores `response` as a permanent failure and marks the record Failed.
    ///
    /// - Exactly as [`Store::complete`], with the state Failed.
    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError>;

    /// Ends the lease now so that the next claim takes over at once.
    ///
    /// - Applies only while the fence holds; otherwise `Fenced`.
    /// - Sets `lease_until = min(lease_until, now)` (a lease that ran out keeps its
    ///   end); keeps the token, attempt and steps.
    /// - A record without steps: also `expires_at = now`. Nothing took effect, so the
    ///   record is absent at once and the next claim is fresh, under any fingerprint.
    /// - A record with steps keeps its `expires_at`: its checkpoints kept it one
    ///   retention past the lease's end, so the steps are there for the takeover.
    /// - Repeated by the same owner, it changes nothing more: `Applied` while the record
    ///   is present, `Fenced` once the first release forgot it.
    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError>;

    /// Extends the lease (a heartbeat).
    ///
    /// - Applies only while the fence holds **and** the lease is live
    ///   (`now < lease_until`); otherwise [`RenewOutcome::Fenced`]. A lease that ended
    ///   (released, or run out before the renewal arrived) is over for its owner even
    ///   when no other attempt took over yet.
    /// - Sets `lease_until = now + extend` and answers the lease with its new end; the
    ///   record stays present as long as that lease lives, even past its retention.
    /// - Sets `expires_at = max(expires_at, lease_until + lease.retention)`
    ///   ([`machine::kept_past`](crate::machine::kept_past)): an owner that stops
    ///   leaves its record one retention past the lease's end.
    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError>;

    /// Records a named checkpoint for multi-step work.
    ///
    /// - Applies only while the fence holds; otherwise `Fenced`.
    /// - Sets `steps[step] = value`, replacing an earlier value of the same step.
    /// - Sets `expires_at = max(expires_at, lease_until + lease.retention)`
    ///   ([`machine::kept_past`](crate::machine::kept_past)), `lease_until` being the
    ///   record's: a step is never lost to the record's expiry while its owner could
    ///   still come back.
    /// - Steps survive takeovers and are cleared when an absent record is claimed afresh.
    /// - A value the store cannot hold is [`StoreError::TooLarge`] naming the step and
    ///   writes nothing.
    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError>;

    /// Reads a record for inspection.
    ///
    /// - `None` when there is no record or it is absent (expired, no live lease).
    /// - Changes nothing.
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError>;

    /// Deletes up to `limit` absent records of this store (its namespace only) and
    /// answers how many it deleted.
    ///
    /// - Deletes only records with `now >= expires_at` and no live lease.
    /// - Never reaches another namespace sharing the backend.
    /// - Safe to run from many processes at once.
    /// - Stores whose [`Store::expiry`] is [`Expiry::Vanishes`] answer 0.
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError>;

    /// How this store gets rid of absent records (default [`Expiry::Purge`]).
    fn expiry(&self) -> Expiry {
        Expiry::Purge
    }

    /// The most bytes one record's response and checkpoints (names and values together)
    /// may hold, when the store has such a limit; the driver keeps below it.
    ///
    /// - `None` (the default): no limit of its own.
    fn max_record_bytes(&self) -> Option<usize> {
        None
    }
}
