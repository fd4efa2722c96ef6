//! The pure state machine: **the specification every store implements**.
//!
//! Each function takes the existing record (or none), the request and the store's current
//! time, and returns the outcome together with the record to write, without any I/O. The
//! in-memory store applies these functions directly, and `idem-testkit` checks every other
//! store's answers against them. A backend that answers differently from these functions
//! is wrong.
//!
//! # Time
//!
//! A lease is live while `now < lease_until`. A record is *expired* once
//! `now >= expires_at`, and it is *absent* when it is expired **and** no live lease holds
//! it ([`Record::is_absent`]): a live owner's record is in flight, whatever its
//! retention, so a fresh claim can never run the work beside a live owner. Durations
//! longer than [`MAX_DURATION`](crate::raw::MAX_DURATION) count as that.
//!
//! # Claim
//!
//! | existing record | outcome | write | checked by (`idem-testkit`) |
//! |---|---|---|---|
//! | none, or absent (expired, no live lease) | `Claimed { resumed: false }` | fresh in-progress record; token = old token + 1 (or 1, also after [`MAX_TOKEN`]); steps cleared | `cases::claim::absent_key_is_claimed_fresh`, `cases::claim::absent_record_is_claimed_fresh`, `cases::claim::tokens_strictly_increase`, `cases::edges::lease_and_expiry_end_exactly`, `cases::retention::lifetimes_are_told_apart` |
//! | fingerprint differs | `Mismatch` | none (checked first for any record that is not absent) | `cases::claim::different_fingerprint_is_a_mismatch`, `cases::fencing::fingerprint_survives_completion`, `cases::retention::a_live_lease_is_never_absent` |
//! | Completed | `Replay(response)` | none | `cases::claim::completed_record_replays`, `cases::payloads::replays_are_byte_exact`, `cases::fencing::fingerprint_survives_completion` |
//! | Failed | `ReplayFailure(response)` | none | `cases::claim::failed_record_replays_failure`, `cases::payloads::replays_are_byte_exact` |
//! | InProgress, same attempt id, lease live | `Claimed` with the same lease (`resumed: false`) | none | `cases::claim::same_attempt_gets_its_lease_back` |
//! | InProgress, lease ended, same attempt id (a late copy of a claim it won) | `InFlight { retry_after: 0 }` | none | `cases::long_work::a_late_claim_of_the_same_attempt_takes_nothing_over` |
//! | InProgress, lease live | `InFlight { retry_after }` | none | `cases::claim::live_lease_is_in_flight`, `cases::retention::a_live_lease_is_never_absent`, `cases::edges::lease_and_expiry_end_exactly`, `cases::concurrency::concurrent_claims_have_one_winner` |
//! | InProgress, lease expired | `Claimed { resumed: true }` (takeover; steps kept) | token + 1, new attempt, new lease, `expires_at = max(expires_at, lease_until + retention)` ([`kept_past`]) | `cases::claim::expired_lease_is_taken_over`, `cases::long_work::no_lease_ends_at_the_retention_cliff`, `cases::claim::tokens_strictly_increase`, `cases::edges::lease_and_expiry_end_exactly`, `cases::concurrency::concurrent_takeovers_have_one_winner` |
//! | InProgress, lease expired, token at [`MAX_TOKEN`] (only by hand, or after 2^53 − 1 claims) | error [`TokenAtLimit`]: no next token could fence the owner | none | `idem_testkit::assert_the_last_token_is_never_passed` |
//!
//! # Fenced writes
//!
//! A write applies only when the record is not absent, in progress, and carries the
//! lease's token and attempt id; otherwise it is `Fenced` and changes nothing. A `complete`
//! (or `fail`) retried by the same owner after the first try landed answers `Applied`
//! without writing again.
//!
//! | op | effect when the fence holds | checked by (`idem-testkit`) |
//! |---|---|---|
//! | `complete(lease, response)` | Completed, response stored, `expires_at = max(expires_at, now + lease.retention)` | `cases::fencing::complete_stores_the_response`, `cases::retention::late_results_stay_replayable`, `cases::retention::a_live_lease_is_never_absent`, `cases::payloads::large_responses_replay_or_are_refused` |
//! | `fail(lease, response)` | Failed, response stored, `expires_at = max(expires_at, now + lease.retention)` | `cases::fencing::fail_stores_the_failure`, `cases::retention::late_results_stay_replayable`, `cases::retention::a_live_lease_is_never_absent` |
//! | `release(lease)` | `lease_until = min(lease_until, now)`; token, steps and `expires_at` kept (the checkpoints kept the record one retention past the lease), so the next claim takes over. With no step recorded, `expires_at = now` instead: the record is absent at once and the next claim is fresh, under any fingerprint | `cases::fencing::release_lets_the_next_claim_take_over`, `cases::fencing::release_without_steps_forgets_the_key`, `cases::retention::a_release_after_the_retention_keeps_its_steps`, `cases::retention::a_release_after_its_lease_ended_keeps_its_end`, `cases::claim::tokens_strictly_increase` |
//! | `renew(lease, extend)` | only while the lease is live (else `Fenced`): `lease_until = now + extend`, `expires_at = max(expires_at, lease_until + lease.retention)` | `cases::fencing::renew_extends_the_lease`, `cases::long_work::no_lease_ends_at_the_retention_cliff`, `cases::long_work::an_ended_lease_is_not_renewed`, `cases::edges::lease_and_expiry_end_exactly`, `cases::retention::a_live_lease_is_never_absent`, `cases::retention::extreme_durations_work` |
//! | `checkpoint(lease, step, bytes)` | `steps[step] = bytes`, `expires_at = max(expires_at, lease_until + lease.retention)` with the record's `lease_until` | `cases::fencing::checkpoint_records_steps`, `cases::long_work::no_lease_ends_at_the_retention_cliff`, `cases::retention::a_checkpoint_keeps_the_record_past_its_own_lease_end`, `cases::payloads::steps_count_toward_the_record_limit` |
//!
//! `get` hides absent records; `purge_expired` removes absent records ([`is_purgeable`]).
//!
//! # No lease ends at the retention cliff
//!
//! A lease carries its claim's retention ([`Lease::retention`]). Takeovers, renewals and
//! checkpoints keep the record at least that long past the end of its lease
//! ([`kept_past`]): an owner that stops without a word (a crash, a pause, a partition)
//! leaves a record that the retry finds, with its steps, however long the work ran and
//! however close to its expiry the lease ended. Without it, a record whose retention
//! passed while its work ran was absent the moment the lease lapsed, and the retry ran
//! every checkpointed step again.
//!
//! # A stored result stays replayable
//!
//! Work kept alive by heartbeats past the retention, or a takeover near its end, may
//! finish after the claim's `expires_at`; without more, its result would be absent the
//! moment it is stored, and the next retry would run the work again. So a `complete` or
//! `fail` that applies also moves `expires_at` to at least `now + lease.retention`
//! ([`kept_past`]): every stored result is replayed for at least one retention after it
//! was stored.

use std::time::Duration;

use crate::{
    Record, State, StoreError, Timestamp, key::StepName, raw::MAX_TOKEN, raw::clamp_duration,
    record::AttemptId, record::Lease, store::ClaimOutcome, store::ClaimRequest,
    store::RenewOutcome, store::WriteOutcome,
};

/// A takeover or an operator's release the machine refuses: the record's fencing token is
/// at [`MAX_TOKEN`], so no next token could fence its owner. Only a record written by
/// hand, or 2^53 − 1 claims of one key, gets there. A unit value: the key is the caller's,
/// and the token is always [`MAX_TOKEN`]. A store answers it as [`StoreError::Corrupt`]
/// naming the key, and changes nothing:
///
/// ```
/// use idem_core::{machine::TokenAtLimit, Key, StoreError};
///
/// let key = Key::new("payments", "order-1187")?;
/// let err = StoreError::from(TokenAtLimit).for_key(&key);
/// assert!(matches!(err, StoreError::Corrupt { .. }));
/// assert!(err.to_string().contains(&key.short_hash().to_string()));
/// # Ok::<(), idem_core::key::KeyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the record's fencing token is at its limit ({MAX_TOKEN}): no takeover or release can pass it"
)]
pub struct TokenAtLimit;

impl From<TokenAtLimit> for StoreError {
    fn from(refusal: TokenAtLimit) -> Self {
        StoreError::Corrupt {
            what: "a token at its limit, which no takeover or release can pass",
            key: None,
            source: Some(Box::new(refusal)),
        }
    }
}

/// The token after `token`, or the refusal at [`MAX_TOKEN`].
fn next_token(token: u64) -> Result<u64, TokenAtLimit> {
    token
        .checked_add(1)
        .filter(|next| *next <= MAX_TOKEN)
        .ok_or(TokenAtLimit)
}

/// An outcome and the record to write for it (`None`: write nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition<O> {
    /// What the store answers.
    pub outcome: O,
    /// The record as it must be after the operation, when it changes.
    pub write: Option<Record>,
}

impl<O> Transition<O> {
    fn answer(outcome: O) -> Self {
        Self {
            outcome,
            write: None,
        }
    }

    fn write(outcome: O, record: Record) -> Self {
        Self {
            outcome,
            write: Some(record),
        }
    }
}

/// The record as the outside sees it at `now`: none when there is none or it is absent
/// (expired and held by no live lease).
pub fn visible(existing: Option<&Record>, now: Timestamp) -> Option<&Record> {
    existing.filter(|record| !record.is_absent(now))
}

/// Whether `purge_expired` may delete this record at `now`: exactly when it is absent.
pub fn is_purgeable(record: &Record, now: Timestamp) -> bool {
    record.is_absent(now)
}

/// Claim (first table of the module docs).
///
/// # Errors
/// [`TokenAtLimit`] for a takeover of a record at [`MAX_TOKEN`]: no next token could fence
/// its owner. Its replay, mismatch and in-flight answers are as for any record, and an
/// absent one is replaced starting again at token 1 (no lease holds it, and every write
/// is fenced by token and attempt id, so an old owner's writes match none of the new
/// lifetime's).
pub fn claim(
    existing: Option<&Record>,
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<Transition<ClaimOutcome>, TokenAtLimit> {
    let Some(record) = visible(existing, now) else {
        let token = existing.map_or(1, |old| next_token(old.token).unwrap_or(1));
        let lease_until = now.saturating_add(clamp_duration(request.lease));
        let fresh = Record {
            key: request.key.clone(),
            fingerprint: request.fingerprint,
            state: State::InProgress,
            token,
            attempt: request.attempt,
            lease_until,
            created_at: now,
            expires_at: now.saturating_add(clamp_duration(request.retention)),
            response: None,
            steps: Default::default(),
        };
        let outcome = ClaimOutcome::claimed(
            lease_of(&fresh, request.retention),
            false,
            Default::default(),
        );
        return Ok(Transition::write(outcome, fresh));
    };
    if record.fingerprint != request.fingerprint {
        return Ok(Transition::answer(ClaimOutcome::Mismatch));
    }
    Ok(match record.state {
        State::Completed => Transition::answer(ClaimOutcome::replay(
            record.response.clone().unwrap_or_default(),
        )),
        State::Failed => Transition::answer(ClaimOutcome::replay_failure(
            record.response.clone().unwrap_or_default(),
        )),
        State::InProgress if record.lease_is_live(now) => {
            if record.attempt == request.attempt {
                Transition::answer(ClaimOutcome::claimed(
                    lease_of(record, request.retention),
                    false,
                    record.steps.clone(),
                ))
            } else {
                Transition::answer(ClaimOutcome::in_flight(
                    record.lease_until.saturating_duration_since(now),
                ))
            }
        }
        // The attempt whose lease this was, after that lease ended (released, or run
        // out): a late copy of a claim it already won. Taking over would hold the key a
        // whole lease for an owner that is gone; the caller's next claim, under a new
        // attempt id, takes over.
        State::InProgress if record.attempt == request.attempt => {
            Transition::answer(ClaimOutcome::in_flight(Duration::ZERO))
        }
        State::InProgress => {
            let lease_until = now.saturating_add(clamp_duration(request.lease));
            let taken = Record {
                token: next_token(record.token)?,
                attempt: request.attempt,
                lease_until,
                expires_at: kept_past(record.expires_at, lease_until, request.retention),
                ..record.clone()
            };
            let outcome = ClaimOutcome::claimed(
                lease_of(&taken, request.retention),
                true,
                taken.steps.clone(),
            );
            Transition::write(outcome, taken)
        }
    })
}

/// Complete: store the response as the result.
pub fn complete(
    existing: Option<&Record>,
    lease: &Lease,
    response: &[u8],
    now: Timestamp,
) -> Transition<WriteOutcome> {
    finish(existing, lease, State::Completed, response, now)
}

/// Fail: store the response as a permanent failure.
pub fn fail(
    existing: Option<&Record>,
    lease: &Lease,
    response: &[u8],
    now: Timestamp,
) -> Transition<WriteOutcome> {
    finish(existing, lease, State::Failed, response, now)
}

/// Release: end the lease now, keeping token and steps so the next claim takes over.
///
/// The work released because nothing took effect. A record that holds no step has
/// nothing left to resume, so its lifetime ends too (`expires_at = now`): it is absent at
/// once, and the next claim is fresh under any fingerprint (a corrected request under
/// the same key is not a mismatch). A record with steps is kept for a takeover, since
/// those steps did take effect for this request, with its expiry as it is: the
/// checkpoints kept it one retention past the lease's end ([`kept_past`]), and the
/// release only brings that end forward. A lease that has ended already keeps its end,
/// so a release repeated changes nothing more.
pub fn release(
    existing: Option<&Record>,
    lease: &Lease,
    now: Timestamp,
) -> Transition<WriteOutcome> {
    fenced_update(existing, lease, now, |record| {
        // A lease that ran out already ends where it ended: a release repeated moves
        // nothing, and no lease end moves past the one the record is kept for.
        record.lease_until = record.lease_until.min(now);
        if record.steps.is_empty() {
            record.expires_at = now;
        }
    })
}

/// Renew: the lease now ends at `now + extend`, and the record is kept at least one
/// retention past that end.
///
/// Only a live lease is renewed: once it has ended (released, or run out before the
/// renewal arrived) the owner has let go, whether or not another attempt took over yet,
/// so a late renewal is `Fenced` and the owner learns that it must stop.
pub fn renew(
    existing: Option<&Record>,
    lease: &Lease,
    extend: Duration,
    now: Timestamp,
) -> Transition<RenewOutcome> {
    if !existing.is_some_and(|record| record.lease_is_live(now)) {
        return Transition::answer(RenewOutcome::Fenced);
    }
    let lease_until = now.saturating_add(clamp_duration(extend));
    let update = fenced_update(existing, lease, now, |record| {
        record.lease_until = lease_until;
        record.expires_at = kept_past(record.expires_at, lease_until, lease.retention);
    });
    match update.outcome {
        WriteOutcome::Applied => Transition {
            outcome: RenewOutcome::Renewed(lease.clone().with_lease_until(lease_until)),
            write: update.write,
        },
        WriteOutcome::Fenced => Transition::answer(RenewOutcome::Fenced),
    }
}

/// Checkpoint: `steps[step] = value`, and the record is kept at least one retention past
/// the end of its lease.
pub fn checkpoint(
    existing: Option<&Record>,
    lease: &Lease,
    step: &StepName,
    value: &[u8],
    now: Timestamp,
) -> Transition<WriteOutcome> {
    fenced_update(existing, lease, now, |record| {
        record
            .steps
            .insert(step.as_str().to_owned(), value.to_vec());
        record.expires_at = kept_past(record.expires_at, record.lease_until, lease.retention);
    })
}

/// The expiry that keeps a record at least `retention` past `lease_until`: `expires_at`,
/// or `lease_until + retention` when that is later.
///
/// A record whose owner stops (a crash, a pause, a partition) must still be there when
/// the retry comes: its steps say what already happened, and [`Record::derive`] keys
/// depend on its creation time. Takeovers, renewals and checkpoints apply it, so no
/// lease of a record ends within one retention of the record's expiry.
pub fn kept_past(expires_at: Timestamp, lease_until: Timestamp, retention: Duration) -> Timestamp {
    expires_at.max(lease_until.saturating_add(clamp_duration(retention)))
}

/// An operator's release (see [`Admin::release_key`](crate::Admin::release_key)): a fenced
/// takeover on the operator's behalf. `attempt` is a fresh id no worker holds.
///
/// | existing record | outcome | write | checked by (`idem-testkit`) |
/// |---|---|---|---|
/// | none, or absent | `NotFound` | none | `cases::admin::release_key_fences_the_owner` |
/// | Completed or Failed | `Finished(state)` | none | `cases::admin::release_key_fences_the_owner`, `cases::admin::release_key_races_the_owners_complete` |
/// | InProgress | `Released { token: token + 1 }` | token + 1, `attempt`, `lease_until = now`; steps kept | `cases::admin::release_key_fences_the_owner`, `cases::admin::release_key_races_the_owners_complete` |
/// | InProgress at [`MAX_TOKEN`] | [`TokenAtLimit`] | none | `idem_testkit::assert_the_last_token_is_never_passed` |
///
/// # Errors
/// [`TokenAtLimit`] for a record in progress at [`MAX_TOKEN`].
pub fn release_key(
    existing: Option<&Record>,
    attempt: AttemptId,
    now: Timestamp,
) -> Result<Transition<crate::admin::ReleaseKeyOutcome>, TokenAtLimit> {
    Ok(match visible(existing, now) {
        None => Transition::answer(crate::admin::ReleaseKeyOutcome::NotFound),
        Some(record) if record.state != State::InProgress => {
            Transition::answer(crate::admin::ReleaseKeyOutcome::Finished(record.state))
        }
        Some(record) => {
            let mut released = record.clone();
            released.token = next_token(record.token)?;
            released.attempt = attempt;
            released.lease_until = now;
            Transition::write(
                crate::admin::ReleaseKeyOutcome::Released {
                    token: released.token,
                },
                released,
            )
        }
    })
}

/// The lease a record grants to its current owner, claimed with `retention` (the claim
/// request's).
pub fn lease_of(record: &Record, retention: Duration) -> Lease {
    Lease::new(
        record.key.clone(),
        record.token,
        record.attempt,
        record.lease_until,
        record.created_at,
    )
    .with_retention(retention)
}

/// The record if it is present and still carries the lease's token and attempt.
fn owned_by<'r>(existing: Option<&'r Record>, lease: &Lease, now: Timestamp) -> Option<&'r Record> {
    visible(existing, now).filter(|record| {
        record.key == lease.key && record.token == lease.token && record.attempt == lease.attempt
    })
}

fn fenced_update(
    existing: Option<&Record>,
    lease: &Lease,
    now: Timestamp,
    change: impl FnOnce(&mut Record),
) -> Transition<WriteOutcome> {
    match owned_by(existing, lease, now) {
        Some(record) if record.state == State::InProgress => {
            let mut updated = record.clone();
            change(&mut updated);
            Transition::write(WriteOutcome::Applied, updated)
        }
        _ => Transition::answer(WriteOutcome::Fenced),
    }
}

fn finish(
    existing: Option<&Record>,
    lease: &Lease,
    terminal: State,
    response: &[u8],
    now: Timestamp,
) -> Transition<WriteOutcome> {
    match owned_by(existing, lease, now) {
        // The same owner retrying after its first write landed.
        Some(record) if record.state == terminal => Transition::answer(WriteOutcome::Applied),
        _ => fenced_update(existing, lease, now, |record| {
            record.expires_at = kept_past(record.expires_at, now, lease.retention);
            record.state = terminal;
            record.response = Some(response.to_vec());
        }),
    }
}

#[cfg(test)]
mod tests;
