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
/// at the store's clock. Expected outcomes are values; only backend failures, and values
/// too large to store ([`StoreError::TooLarge`]), are errors. Run `idem-testkit`'s
/// conformance suite to check an implementation: each bullet of each method ends with
/// the cases that check it. Checked by `matches_the_state_machine`,
/// `concurrent_claims_have_one_winner`, `stale_completes_race_takeovers`.
///
/// **Fencing.** Every write after a claim carries the [`Lease`] and applies only while the
/// record is present, in progress, and carries the lease's token *and* attempt id (not
/// its `lease_until` or `created_at`: an older copy of the lease fences alike);
/// otherwise it answers [`WriteOutcome::Fenced`] ([`RenewOutcome::Fenced`]) and changes
/// nothing. Only [`Store::renew`] also needs the lease live: an owner whose lease ran out,
/// with nobody taking over, still stores its result. Checked by
/// `stale_owner_is_fenced_after_takeover`, `writes_after_the_end_are_fenced`.
///
/// **Time.** `now` is the store's clock: the database server's where it has one.
/// A lease is live while `now < lease_until`; a record is expired once `now >= expires_at`,
/// and it counts as absent (everywhere: claim, writes, `get`, purge) only when it is
/// expired **and** no live lease holds it. A live owner's record is never claimed
/// afresh, whatever its retention. Durations count in whole milliseconds, and those
/// longer than [`MAX_DURATION`](crate::raw::MAX_DURATION) count as that
/// ([`clamp_duration`](crate::raw::clamp_duration)); zero and [`Duration::MAX`] work.
/// Checked by `lease_and_expiry_end_exactly`, `a_live_lease_is_never_absent`,
/// `extreme_durations_work`.
///
/// **Names.** Each (scope, key) is a record of its own, and every valid key (parts of up
/// to 255 bytes, any UTF-8, quotes) reads back exactly. A store that keeps records in a
/// flat key space under a namespace (a key prefix) must map (namespace, scope, key) to
/// its storage key injectively and never reach past its own namespace, even into one
/// that its namespace is a prefix of; [`crate::raw::storage_name`] does exactly that.
/// Checked by `scopes_are_isolated`, `keys_at_the_limits`, `namespaces_are_isolated`.
///
/// # Writing a store of your own
///
/// 1. Read the memory store (`idem-core/src/memory.rs`, [`MemoryStore`](crate::MemoryStore)):
///    the reference implementation. Each method reads the record, asks the matching
///    [`crate::machine`] function what to answer and what to write, and writes it, all
///    under one lock. Yours does the same inside one atomic operation of its backend;
///    `docs/DESIGN.md` §6 in the repository shows how SQLite (`BEGIN IMMEDIATE`),
///    PostgreSQL (one statement per write), Redis (one Lua script) and DynamoDB (one conditional
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
    /// Claims `request.key` for `request.attempt`. The record is looked at in this order:
    /// absence, then the fingerprint, then the state, then the lease.
    ///
    /// - No record, or an absent one (expired, no live lease): writes a fresh in-progress
    ///   record (the request's fingerprint and attempt; token = the old record's token + 1,
    ///   or 1 where none is stored or the old one is at
    ///   [`MAX_TOKEN`](crate::raw::MAX_TOKEN); `created_at = now`; `lease_until = now + lease`;
    ///   `expires_at = now + retention`; no response; steps cleared) and answers
    ///   [`ClaimOutcome::Claimed`] with `resumed: false`. Checked by
    ///   `absent_key_is_claimed_fresh`, `absent_record_is_claimed_fresh`,
    ///   `tokens_strictly_increase`, `lifetimes_are_told_apart`,
    ///   `lease_and_expiry_end_exactly`, `extreme_durations_work`.
    /// - A present record with another fingerprint: [`ClaimOutcome::Mismatch`], whatever
    ///   its state or lease (an ended lease is not taken over), writing nothing. Checked by
    ///   `different_fingerprint_is_a_mismatch`, `fingerprint_survives_completion`,
    ///   `a_live_lease_is_never_absent`.
    /// - Completed: [`ClaimOutcome::Replay`] with the stored response, byte for byte,
    ///   writing nothing. Checked by `completed_record_replays`, `replays_are_byte_exact`,
    ///   `fingerprint_survives_completion`.
    /// - Failed: [`ClaimOutcome::ReplayFailure`] with the stored response, byte for byte,
    ///   writing nothing. Checked by `failed_record_replays_failure`,
    ///   `replays_are_byte_exact`.
    /// - In progress with a live lease held by the same attempt id: the same lease again
    ///   (`Claimed`, `resumed: false`, stored steps), writing nothing. Checked by
    ///   `same_attempt_gets_its_lease_back`.
    /// - In progress with a live lease: [`ClaimOutcome::InFlight`] with
    ///   `retry_after = lease_until - now`, even when the record's retention has ended,
    ///   writing nothing. Checked by `live_lease_is_in_flight`,
    ///   `a_live_lease_is_never_absent`, `lease_and_expiry_end_exactly`.
    /// - In progress with an ended lease held by the same attempt id (a late copy of a
    ///   claim that attempt already won; the lease was released or ran out): `InFlight`
    ///   with zero time left, writing nothing. Checked by
    ///   `a_late_claim_of_the_same_attempt_takes_nothing_over`.
    /// - In progress with an ended lease: takeover: token + 1, the new attempt id,
    ///   `lease_until = now + lease`,
    ///   `expires_at = max(expires_at, lease_until + retention)`
    ///   ([`machine::kept_past`](crate::machine::kept_past)); fingerprint, `created_at`
    ///   and steps kept; `Claimed` with `resumed: true` and the steps. At
    ///   [`MAX_TOKEN`](crate::raw::MAX_TOKEN) (a hand edit, or 2^53 − 1 claims) no next
    ///   token could fence the owner, so no takeover: [`StoreError::Corrupt`] naming the
    ///   key, writing nothing ([`machine::TokenAtLimit`](crate::machine::TokenAtLimit);
    ///   records planted there are checked with
    ///   `idem_testkit::assert_the_last_token_is_never_passed`). Checked by
    ///   `expired_lease_is_taken_over`, `tokens_strictly_increase`,
    ///   `release_lets_the_next_claim_take_over`, `no_lease_ends_at_the_retention_cliff`,
    ///   `a_live_lease_is_never_absent`, `lease_and_expiry_end_exactly`.
    /// - The lease answered carries the record's `created_at` and the request's
    ///   `retention` ([`Lease::with_retention`]). Checked by `absent_key_is_claimed_fresh`,
    ///   `no_lease_ends_at_the_retention_cliff`, `matches_the_state_machine`.
    /// - Each (scope, key) is a record of its own (see the trait docs): the same key under
    ///   another scope, or another split of the same text into scope and key, is another
    ///   record. Checked by `scopes_are_isolated`, `keys_at_the_limits`.
    /// - Exactly one of any number of concurrent claims on a fresh key (or of a takeover)
    ///   is `Claimed`; the others are `InFlight`. Checked by
    ///   `concurrent_claims_have_one_winner`, `concurrent_takeovers_have_one_winner`.
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError>;

    /// Stores `response` as the result of the work and marks the record Completed.
    ///
    /// - Applies only while the fence holds (see the trait docs), live lease or not;
    ///   otherwise `Fenced`, writing nothing. Checked by
    ///   `stale_owner_is_fenced_after_takeover`, `writes_after_the_end_are_fenced`,
    ///   `stale_completes_race_takeovers`, `release_without_steps_forgets_the_key`,
    ///   `an_ended_lease_is_not_renewed`.
    /// - Sets the state Completed and stores `response` byte for byte (empty, binary,
    ///   as large as the record holds). Checked by `complete_stores_the_response`,
    ///   `replays_are_byte_exact`, `large_responses_replay_or_are_refused`.
    /// - Keeps the fingerprint, token, attempt, steps, `created_at` and `lease_until`.
    ///   Checked by `complete_stores_the_response`, `fingerprint_survives_completion`,
    ///   `matches_the_state_machine`.
    /// - Sets `expires_at = max(expires_at, now + lease.retention)`
    ///   ([`machine::kept_past`](crate::machine::kept_past)): a result stored late (work
    ///   kept alive past its retention by heartbeats, or a takeover near its end) is still
    ///   replayed for one whole retention. Checked by `complete_stores_the_response`,
    ///   `late_results_stay_replayable`, `a_live_lease_is_never_absent`.
    /// - Retried by the same owner after the first call landed (record Completed with the
    ///   lease's token and attempt): `Applied`, writing nothing, whatever bytes the retry
    ///   carries; after a landed [`Store::fail`], `Fenced`. Checked by
    ///   `retried_terminal_writes_are_applied`, `retried_terminal_writes_keep_the_first_bytes`,
    ///   `late_results_stay_replayable`.
    /// - A response that does not fit beside the record's steps (see
    ///   [`Store::max_record_bytes`]) is [`StoreError::TooLarge`] naming
    ///   [`ValuePart::Result`](crate::record::ValuePart::Result), with the response's size
    ///   and the limit, and writes nothing. Checked by
    ///   `large_responses_replay_or_are_refused`, `steps_count_toward_the_record_limit`.
    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError>;

    /// Stores `response` as a permanent failure and marks the record Failed.
    ///
    /// - Exactly as [`Store::complete`] (the fence, what it keeps, `expires_at`, a retry
    ///   after it landed), with the state Failed, replayed as
    ///   [`ClaimOutcome::ReplayFailure`]; after a landed `complete`, `Fenced`. Checked by
    ///   `fail_stores_the_failure`, `late_results_stay_replayable`,
    ///   `a_live_lease_is_never_absent`, `retried_terminal_writes_are_applied`,
    ///   `retried_terminal_writes_keep_the_first_bytes`, `writes_after_the_end_are_fenced`,
    ///   `stale_owner_is_fenced_after_takeover`, `replays_are_byte_exact`.
    /// - A response that does not fit is [`StoreError::TooLarge`] naming
    ///   [`ValuePart::Failure`](crate::record::ValuePart::Failure) (not `Result`), with
    ///   its size and the limit, and writes nothing. Checked by
    ///   `large_responses_replay_or_are_refused`, `steps_count_toward_the_record_limit`.
    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError>;

    /// Ends the lease now so that the next claim takes over at once.
    ///
    /// - Applies only while the fence holds, live lease or not; otherwise `Fenced`,
    ///   writing nothing. Checked by `stale_owner_is_fenced_after_takeover`,
    ///   `writes_after_the_end_are_fenced`, `a_release_after_its_lease_ended_keeps_its_end`.
    /// - Sets `lease_until = min(lease_until, now)` (a lease that ran out keeps its
    ///   end); keeps the state (in progress), token, attempt and steps. Checked by
    ///   `release_lets_the_next_claim_take_over`,
    ///   `a_release_after_its_lease_ended_keeps_its_end`, `tokens_strictly_increase`.
    /// - A record without steps: also `expires_at = now`. Nothing took effect, so the
    ///   record is absent at once and the next claim is fresh, under any fingerprint.
    ///   Checked by `release_without_steps_forgets_the_key`.
    /// - A record with steps keeps its `expires_at`: its checkpoints kept it one
    ///   retention past the lease's end, so the steps are there for the takeover.
    ///   Checked by `a_release_after_the_retention_keeps_its_steps`,
    ///   `a_checkpoint_keeps_the_record_past_its_own_lease_end`,
    ///   `release_lets_the_next_claim_take_over`.
    /// - Repeated by the same owner, it changes nothing more: `Applied` while the record
    ///   is present, `Fenced` once the first release forgot it. Checked by
    ///   `a_release_after_the_retention_keeps_its_steps`, `matches_the_state_machine`.
    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError>;

    /// Extends the lease (a heartbeat).
    ///
    /// - Applies only while the fence holds **and** the record's lease is live
    ///   (`now < lease_until`); otherwise [`RenewOutcome::Fenced`], writing nothing. A
    ///   lease that ended (released, or run out before the renewal arrived) is over for
    ///   its owner even when no other attempt took over yet. Checked by
    ///   `an_ended_lease_is_not_renewed`, `renew_extends_the_lease`,
    ///   `stale_owner_is_fenced_after_takeover`, `writes_after_the_end_are_fenced`.
    /// - Sets `lease_until = now + extend`, even when that is earlier than before (a
    ///   renewal by zero ends the lease at once), and answers [`RenewOutcome::Renewed`]
    ///   with the lease it was handed carrying the new end (token, attempt, `created_at`
    ///   and `retention` unchanged). Checked by `renew_extends_the_lease`,
    ///   `lease_and_expiry_end_exactly`, `extreme_durations_work`,
    ///   `no_lease_ends_at_the_retention_cliff`.
    /// - The record stays present as long as that lease lives, even past its retention.
    ///   Checked by `a_live_lease_is_never_absent`.
    /// - Sets `expires_at = max(expires_at, lease_until + lease.retention)`
    ///   ([`machine::kept_past`](crate::machine::kept_past)): an owner that stops
    ///   leaves its record one retention past the lease's end. Checked by
    ///   `no_lease_ends_at_the_retention_cliff`, `a_live_lease_is_never_absent`.
    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError>;

    /// Records a named checkpoint for multi-step work.
    ///
    /// - Applies only while the fence holds (an older copy of the lease, with the same
    ///   token and attempt, holds it too); otherwise `Fenced`, writing nothing. Checked by
    ///   `stale_owner_is_fenced_after_takeover`, `writes_after_the_end_are_fenced`,
    ///   `a_checkpoint_keeps_the_record_past_its_own_lease_end`.
    /// - Sets `steps[step] = value`, replacing an earlier value of the same step; empty
    ///   and binary values and non-ASCII names read back exactly. Checked by
    ///   `checkpoint_records_steps`, `same_attempt_gets_its_lease_back`.
    /// - Sets `expires_at = max(expires_at, lease_until + lease.retention)`
    ///   ([`machine::kept_past`](crate::machine::kept_past)), `lease_until` being the
    ///   record's, not the lease copy's: a step is never lost to the record's expiry
    ///   while its owner could still come back. Checked by
    ///   `no_lease_ends_at_the_retention_cliff`,
    ///   `a_checkpoint_keeps_the_record_past_its_own_lease_end`,
    ///   `a_release_after_the_retention_keeps_its_steps`.
    /// - Steps survive takeovers and are cleared when an absent record is claimed afresh.
    ///   Checked by `expired_lease_is_taken_over`, `absent_record_is_claimed_fresh`,
    ///   `no_lease_ends_at_the_retention_cliff`.
    /// - A value that does not fit beside the record's other steps (see
    ///   [`Store::max_record_bytes`]; a step counts its name and value, and a step written
    ///   again no longer counts its old value) is [`StoreError::TooLarge`] naming the
    ///   step, with that size and the limit, and writes nothing. Checked by
    ///   `steps_count_toward_the_record_limit`.
    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError>;

    /// Reads a record for inspection.
    ///
    /// - `None` when there is no record or it is absent (expired, no live lease); an
    ///   expired record that a live lease holds is shown. Checked by
    ///   `get_hides_absent_records`, `a_live_lease_is_never_absent`,
    ///   `lease_and_expiry_end_exactly`, `release_without_steps_forgets_the_key`.
    /// - Otherwise the record as stored, every field exact (the key as claimed, the
    ///   response and steps byte for byte). Checked by `absent_key_is_claimed_fresh`,
    ///   `keys_at_the_limits`, `complete_stores_the_response`, `matches_the_state_machine`.
    /// - Changes nothing. Checked by `matches_the_state_machine`.
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError>;

    /// Deletes up to `limit` absent records of this store (its namespace only) and
    /// answers how many it deleted. It must be safe to run from many processes at once;
    /// the suite does not race purges.
    ///
    /// - Deletes absent records (`now >= expires_at`, no live lease) and only those: as
    ///   many as there are, up to `limit`. Checked by `purge_removes_only_absent_records`,
    ///   `lease_and_expiry_end_exactly`.
    /// - A deleted record's key starts a new lifetime: the next claim is fresh, at token
    ///   1, with a later `created_at`. Checked by `purge_removes_only_absent_records`,
    ///   `lifetimes_are_told_apart`, `a_checkpoint_keeps_the_record_past_its_own_lease_end`.
    /// - Never reaches another namespace sharing the backend. Checked by
    ///   `namespaces_are_isolated`.
    /// - Stores whose [`Store::expiry`] is [`Expiry::Vanishes`] answer 0. Checked by
    ///   `purge_removes_only_absent_records`, `namespaces_are_isolated`.
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError>;

    /// How this store gets rid of absent records (default [`Expiry::Purge`]). The suite
    /// reads it, and it must be true:
    ///
    /// - [`Expiry::Vanishes`]: an absent record is gone before the next call, so the
    ///   next claim of its key starts at token 1. Checked by
    ///   `absent_record_is_claimed_fresh`, `tokens_strictly_increase`,
    ///   `a_live_lease_is_never_absent`.
    /// - Otherwise an absent record stays until [`Store::purge_expired`] deletes it
    ///   (`Eventually`: or the store, much later), so the next claim of its key continues
    ///   its token and a purge counts it. Checked by `absent_record_is_claimed_fresh`,
    ///   `tokens_strictly_increase`, `purge_removes_only_absent_records`.
    fn expiry(&self) -> Expiry {
        Expiry::Purge
    }

    /// The most bytes one record's response and checkpoints (names and values together)
    /// may hold, when the store has such a limit; the driver keeps below it.
    ///
    /// - `None` (the default): no limit of its own: two 1 MiB checkpoints and a 1 MiB
    ///   response beside them all fit. Checked by `steps_count_toward_the_record_limit`,
    ///   `large_responses_replay_or_are_refused`.
    /// - `Some(limit)`: a response of exactly `limit` bytes is stored and replayed; a
    ///   value over it, alone or beside the steps, is refused as [`Store::complete`],
    ///   [`Store::fail`] and [`Store::checkpoint`] say. Checked by
    ///   `large_responses_replay_or_are_refused`, `steps_count_toward_the_record_limit`.
    fn max_record_bytes(&self) -> Option<usize> {
        None
    }
}
