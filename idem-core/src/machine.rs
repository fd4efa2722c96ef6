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
//! | none, or absent (expired, no live lease) | `Claimed { resumed: false }` | fresh in-progress record; token = old token + 1 (or 1); steps cleared | `cases::claim::absent_key_is_claimed_fresh`, `cases::claim::absent_record_is_claimed_fresh`, `cases::claim::tokens_strictly_increase`, `cases::edges::lease_and_expiry_end_exactly`, `cases::retention::lifetimes_are_told_apart` |
//! | fingerprint differs | `Mismatch` | none (checked first for any record that is not absent) | `cases::claim::different_fingerprint_is_a_mismatch`, `cases::fencing::fingerprint_survives_completion`, `cases::retention::a_live_lease_is_never_absent` |
//! | Completed | `Replay(response)` | none | `cases::claim::completed_record_replays`, `cases::payloads::replays_are_byte_exact`, `cases::fencing::fingerprint_survives_completion` |
//! | Failed | `ReplayFailure(response)` | none | `cases::claim::failed_record_replays_failure`, `cases::payloads::replays_are_byte_exact` |
//! | InProgress, same attempt id, lease live | `Claimed` with the same lease (`resumed: false`) | none | `cases::claim::same_attempt_gets_its_lease_back` |
//! | InProgress, lease ended, same attempt id (a late copy of a claim it won) | `InFlight { retry_after: 0 }` | none | `cases::long_work::a_late_claim_of_the_same_attempt_takes_nothing_over` |
//! | InProgress, lease live | `InFlight { retry_after }` | none | `cases::claim::live_lease_is_in_flight`, `cases::retention::a_live_lease_is_never_absent`, `cases::edges::lease_and_expiry_end_exactly`, `cases::concurrency::concurrent_claims_have_one_winner` |
//! | InProgress, lease expired | `Claimed { resumed: true }` (takeover; steps kept) | token + 1, new attempt, new lease, `expires_at = max(expires_at, lease_until + retention)` ([`kept_past`]) | `cases::claim::expired_lease_is_taken_over`, `cases::long_work::no_lease_ends_at_the_retention_cliff`, `cases::claim::tokens_strictly_increase`, `cases::edges::lease_and_expiry_end_exactly`, `cases::concurrency::concurrent_takeovers_have_one_winner` |
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
    Record, State, Timestamp, key::StepName, raw::clamp_duration, record::AttemptId, record::Lease,
    store::ClaimOutcome, store::ClaimRequest, store::RenewOutcome, store::WriteOutcome,
};

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
pub fn claim(
    existing: Option<&Record>,
    request: &ClaimRequest,
    now: Timestamp,
) -> Transition<ClaimOutcome> {
    let Some(record) = visible(existing, now) else {
        let token = existing.map_or(1, |old| old.token.saturating_add(1));
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
        return Transition::write(outcome, fresh);
    };
    if record.fingerprint != request.fingerprint {
        return Transition::answer(ClaimOutcome::Mismatch);
    }
    match record.state {
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
                token: record.token.saturating_add(1),
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
    }
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
pub fn release_key(
    existing: Option<&Record>,
    attempt: AttemptId,
    now: Timestamp,
) -> Transition<crate::admin::ReleaseKeyOutcome> {
    match visible(existing, now) {
        None => Transition::answer(crate::admin::ReleaseKeyOutcome::NotFound),
        Some(record) if record.state != State::InProgress => {
            Transition::answer(crate::admin::ReleaseKeyOutcome::Finished(record.state))
        }
        Some(record) => {
            let mut released = record.clone();
            released.token = record.token.saturating_add(1);
            released.attempt = attempt;
            released.lease_until = now;
            Transition::write(
                crate::admin::ReleaseKeyOutcome::Released {
                    token: released.token,
                },
                released,
            )
        }
    }
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
mod tests {
    use super::*;
    use crate::{Fingerprint, Key};

    const HOUR: Duration = Duration::from_secs(3600);
    const T0: Timestamp = Timestamp::from_unix_millis(1_000_000);

    fn request(fp: &str) -> ClaimRequest {
        ClaimRequest::new(
            Key::new("scope", "key").unwrap(),
            Fingerprint::of_bytes(fp),
            HOUR,
            24 * HOUR,
        )
    }

    fn claimed(t: Transition<ClaimOutcome>) -> (Lease, bool, Record) {
        match t.outcome {
            ClaimOutcome::Claimed { lease, resumed, .. } => {
                (lease, resumed, t.write.expect("a claim writes"))
            }
            other => panic!("expected Claimed, got {other:?}"),
        }
    }

    #[test]
    fn fresh_claim_on_nothing() {
        let (lease, resumed, record) = claimed(claim(None, &request("a"), T0));
        assert!(!resumed);
        assert_eq!(lease.token, 1);
        assert_eq!(lease.lease_until, T0.saturating_add(HOUR));
        assert_eq!(record.state, State::InProgress);
        assert_eq!(record.expires_at, T0.saturating_add(24 * HOUR));
    }

    #[test]
    fn expired_record_is_reclaimed_with_next_token_and_no_steps() {
        let (lease, _, mut record) = claimed(claim(None, &request("a"), T0));
        record.steps.insert("s".into(), vec![1]);
        record.state = State::Completed;
        let later = record.expires_at;
        let (lease2, resumed, record2) =
            claimed(claim(Some(&record), &request("different"), later));
        assert!(!resumed);
        assert_eq!(lease2.token, lease.token + 1);
        assert!(record2.steps.is_empty());
        assert_eq!(record2.response, None);
    }

    #[test]
    fn mismatch_is_checked_before_state() {
        let (_, _, record) = claimed(claim(None, &request("a"), T0));
        let t = claim(Some(&record), &request("b"), T0);
        assert_eq!(t.outcome, ClaimOutcome::Mismatch);
        assert_eq!(t.write, None);
    }

    #[test]
    fn replays_and_in_flight() {
        let req = request("a");
        let (lease, _, record) = claimed(claim(None, &req, T0));
        let later = T0.saturating_add(Duration::from_secs(10));
        let t = claim(Some(&record), &request("a"), later);
        assert_eq!(
            t.outcome,
            ClaimOutcome::in_flight(HOUR - Duration::from_secs(10))
        );
        // The same attempt gets its lease back.
        let again = claim(Some(&record), &req, later);
        assert_eq!(again.write, None);
        assert!(
            matches!(again.outcome, ClaimOutcome::Claimed { lease: ref l, resumed: false, .. } if *l == lease)
        );

        let done = complete(Some(&record), &lease, b"ok", later).write.unwrap();
        let t = claim(Some(&done), &request("a"), later);
        assert_eq!(t.outcome, ClaimOutcome::replay(b"ok".to_vec()));
        let failed = fail(Some(&record), &lease, b"no", later).write.unwrap();
        let t = claim(Some(&failed), &request("a"), later);
        assert_eq!(t.outcome, ClaimOutcome::replay_failure(b"no".to_vec()));
    }

    #[test]
    fn takeover_keeps_steps_and_fences_the_old_owner() {
        let (old, _, mut record) = claimed(claim(None, &request("a"), T0));
        record.steps.insert("debit".into(), b"1".to_vec());
        let after = record.lease_until;
        let (new, resumed, taken) = claimed(claim(Some(&record), &request("a"), after));
        assert!(resumed);
        assert_eq!(new.token, old.token + 1);
        assert_eq!(taken.steps.len(), 1);
        assert_eq!(taken.created_at, record.created_at);
        let step = StepName::new("x").unwrap();
        for outcome in [
            complete(Some(&taken), &old, b"stale", after).outcome,
            fail(Some(&taken), &old, b"stale", after).outcome,
            release(Some(&taken), &old, after).outcome,
            checkpoint(Some(&taken), &old, &step, b"", after).outcome,
        ] {
            assert_eq!(outcome, WriteOutcome::Fenced);
        }
        assert_eq!(
            renew(Some(&taken), &old, HOUR, after).outcome,
            RenewOutcome::Fenced
        );
    }

    #[test]
    fn a_late_claim_of_the_same_attempt_takes_nothing_over() {
        let req = request("a");
        let (lease, _, record) = claimed(claim(None, &req, T0));
        // Its lease ran out: a late copy of the claim that won it holds nothing again.
        let late = claim(Some(&record), &req, record.lease_until);
        assert_eq!(late.outcome, ClaimOutcome::in_flight(Duration::ZERO));
        assert_eq!(late.write, None);
        // Released (with a step, so the record stays): the same.
        let step = StepName::new("s").unwrap();
        let stepped = checkpoint(Some(&record), &lease, &step, b"1", T0)
            .write
            .unwrap();
        let released = release(Some(&stepped), &lease, T0).write.unwrap();
        let late = claim(Some(&released), &req, T0);
        assert_eq!(late.outcome, ClaimOutcome::in_flight(Duration::ZERO));
        assert_eq!(late.write, None);
        // Another attempt takes over.
        let other = req.clone().with_attempt(AttemptId::random());
        let (taken, resumed, _) = claimed(claim(Some(&released), &other, T0));
        assert!(resumed);
        assert_eq!(taken.token, 2);
    }

    #[test]
    fn an_ended_lease_is_not_renewed() {
        let (lease, _, record) = claimed(claim(None, &request("a"), T0));
        let step = StepName::new("s").unwrap();
        let stepped = checkpoint(Some(&record), &lease, &step, b"1", T0)
            .write
            .unwrap();
        let released = release(Some(&stepped), &lease, T0).write.unwrap();
        let late = renew(Some(&released), &lease, HOUR, T0);
        assert_eq!(late.outcome, RenewOutcome::Fenced);
        assert_eq!(late.write, None);
        // Run out, not yet taken over: fenced as well.
        let ran_out = renew(Some(&record), &lease, HOUR, record.lease_until);
        assert_eq!(ran_out.outcome, RenewOutcome::Fenced);
        // One millisecond before its end it is still renewed.
        let just = Timestamp::from_unix_millis(record.lease_until.as_unix_millis() - 1);
        assert!(matches!(
            renew(Some(&record), &lease, HOUR, just).outcome,
            RenewOutcome::Renewed(_)
        ));
    }

    /// Lease and retention of 2 s: the work checkpoints `charge` and stops without a word
    /// (its lease runs out). The retry 2.1 s later must find the step, not a fresh record.
    #[test]
    fn no_lease_ends_at_the_retention_cliff() {
        let two = Duration::from_secs(2);
        let mut req = request("a");
        req.lease = two;
        req.retention = two;
        let at = |millis| T0.saturating_add(Duration::from_millis(millis));
        let (lease, _, record) = claimed(claim(None, &req, T0));
        assert_eq!(lease.retention, two);
        let step = StepName::new("charge").unwrap();
        let stepped = checkpoint(Some(&record), &lease, &step, b"ch_1", at(100))
            .write
            .unwrap();
        assert_eq!(stepped.expires_at, record.lease_until.saturating_add(two));
        let retry = req.clone().with_attempt(AttemptId::random());
        let (taken, resumed, record) = claimed(claim(Some(&stepped), &retry, at(2_100)));
        assert!(resumed, "the step is still there");
        assert!(record.steps.contains_key("charge"));
        // The takeover's lease too ends a retention before the record does.
        assert_eq!(record.expires_at, taken.lease_until.saturating_add(two));
        // So do renewals, however long the work goes on.
        let mut record = record;
        let mut lease = taken;
        for second in 3..50 {
            let renewed = renew(Some(&record), &lease, two, at(second * 1000));
            let RenewOutcome::Renewed(next) = renewed.outcome else {
                panic!("renew applies")
            };
            record = renewed.write.unwrap();
            assert_eq!(record.expires_at, next.lease_until.saturating_add(two));
            lease = next;
        }
        // The owner stops; a retry just before the record's end still resumes.
        let end = Timestamp::from_unix_millis(record.expires_at.as_unix_millis() - 1);
        let later = req.with_attempt(AttemptId::random());
        let (_, resumed, _) = claimed(claim(Some(&record), &later, end));
        assert!(resumed);
    }

    #[test]
    fn retried_complete_is_applied_but_not_a_switch_to_failed() {
        let (lease, _, record) = claimed(claim(None, &request("a"), T0));
        let done = complete(Some(&record), &lease, b"ok", T0).write.unwrap();
        let again = complete(Some(&done), &lease, b"ok", T0);
        assert_eq!(again.outcome, WriteOutcome::Applied);
        assert_eq!(again.write, None);
        assert_eq!(
            fail(Some(&done), &lease, b"no", T0).outcome,
            WriteOutcome::Fenced
        );
    }

    #[test]
    fn fenced_writes_need_the_attempt_too() {
        let (lease, _, record) = claimed(claim(None, &request("a"), T0));
        let mut forged = lease;
        forged.attempt = AttemptId::from_bytes([9; 16]);
        assert_eq!(
            complete(Some(&record), &forged, b"x", T0).outcome,
            WriteOutcome::Fenced
        );
    }

    #[test]
    fn release_renew_checkpoint() {
        let (lease, _, record) = claimed(claim(None, &request("a"), T0));
        // Without a step, a release forgets the key: another request under it is fresh.
        let forgotten = release(Some(&record), &lease, T0).write.unwrap();
        assert_eq!(visible(Some(&forgotten), T0), None);
        let (fresh, resumed, _) = claimed(claim(Some(&forgotten), &request("b"), T0));
        assert!(!resumed);
        assert_eq!(fresh.token, lease.token + 1);
        assert_eq!(
            release(Some(&forgotten), &lease, T0).outcome,
            WriteOutcome::Fenced
        );

        // With one, it is kept for a takeover, under the same fingerprint only.
        let step = StepName::new("charge").unwrap();
        let stepped = checkpoint(Some(&record), &lease, &step, b"42", T0)
            .write
            .unwrap();
        let released = release(Some(&stepped), &lease, T0).write.unwrap();
        assert!(!released.lease_is_live(T0));
        // The checkpoint kept the record a retention past the lease; the release keeps it.
        assert_eq!(
            released.expires_at,
            record.lease_until.saturating_add(24 * HOUR)
        );
        assert_eq!(
            claim(Some(&released), &request("b"), T0).outcome,
            ClaimOutcome::Mismatch
        );
        let t = claim(Some(&released), &request("a"), T0);
        assert!(matches!(
            t.outcome,
            ClaimOutcome::Claimed { resumed: true, .. }
        ));

        let renewed = renew(Some(&record), &lease, 2 * HOUR, T0);
        let RenewOutcome::Renewed(new_lease) = renewed.outcome else {
            panic!("renew applies")
        };
        assert_eq!(new_lease.lease_until, T0.saturating_add(2 * HOUR));

        let step = StepName::new("charge").unwrap();
        let t = checkpoint(Some(&record), &lease, &step, b"42", T0);
        assert_eq!(t.write.unwrap().steps["charge"], b"42");
    }

    #[test]
    fn zero_lease_and_zero_retention_expire_at_once() {
        let mut req = request("a");
        req.lease = Duration::ZERO;
        req.retention = Duration::ZERO;
        let (lease, _, record) = claimed(claim(None, &req, T0));
        assert!(!record.lease_is_live(T0));
        assert!(record.is_expired(T0));
        assert_eq!(visible(Some(&record), T0), None);
        assert!(is_purgeable(&record, T0));
        assert_eq!(
            complete(Some(&record), &lease, b"", T0).outcome,
            WriteOutcome::Fenced
        );
    }

    #[test]
    fn purge_spares_live_leases() {
        let mut req = request("a");
        req.retention = Duration::ZERO;
        let (_, _, record) = claimed(claim(None, &req, T0));
        assert!(record.is_expired(T0));
        assert!(!is_purgeable(&record, T0));
        assert!(is_purgeable(&record, record.lease_until));
    }

    /// A takeover or heartbeat can push the lease past `expires_at`;
    /// the record must stay in flight until that lease ends, never be claimed afresh.
    #[test]
    fn a_live_lease_keeps_an_expired_record_present() {
        let mut req = request("a");
        req.retention = Duration::ZERO;
        let (lease, _, record) = claimed(claim(None, &req, T0));
        assert_eq!(visible(Some(&record), T0), Some(&record));
        let later = T0.saturating_add(Duration::from_secs(10));
        // A second claim while the lease lives: in flight, not a fresh claim.
        let t = claim(Some(&record), &request("a"), later);
        assert_eq!(
            t.outcome,
            ClaimOutcome::in_flight(HOUR - Duration::from_secs(10))
        );
        assert_eq!(t.write, None);
        // Another fingerprint is a mismatch, as on any present record.
        assert_eq!(
            claim(Some(&record), &request("b"), later).outcome,
            ClaimOutcome::Mismatch
        );
        // The owner still writes: a heartbeat, a checkpoint, then its result.
        let renewed = renew(Some(&record), &lease, 2 * HOUR, later).write.unwrap();
        assert!(renewed.lease_until > record.lease_until);
        let step = StepName::new("s").unwrap();
        let with_step = checkpoint(Some(&renewed), &lease, &step, b"1", later)
            .write
            .unwrap();
        let done = complete(Some(&with_step), &lease, b"ok", later);
        assert_eq!(done.outcome, WriteOutcome::Applied);
        // The renewal kept the record to its new lease's end (retention zero), and so does
        // the result; then it is absent and the next claim is fresh (the driver refuses a
        // retention shorter than the lease; the next test has a real one).
        let done = done.write.unwrap();
        assert_eq!(done.expires_at, renewed.lease_until);
        assert!(!done.is_absent(later));
        assert!(done.is_absent(renewed.lease_until));
        let (next, resumed, _) = claimed(claim(Some(&done), &request("b"), renewed.lease_until));
        assert!(!resumed);
        assert_eq!(next.token, lease.token + 1);
    }

    #[test]
    fn a_result_stored_after_expiry_is_replayed_for_a_whole_retention() {
        let mut req = request("a");
        req.lease = Duration::from_secs(60);
        req.retention = Duration::from_secs(90);
        let (lease, _, record) = claimed(claim(None, &req, T0));
        // Heartbeats keep the work alive past the retention's end at 90 s.
        let at = |secs| T0.saturating_add(Duration::from_secs(secs));
        let minute = Duration::from_secs(60);
        let renewed = renew(Some(&record), &lease, minute, at(50)).write.unwrap();
        let renewed = renew(Some(&renewed), &lease, minute, at(100))
            .write
            .unwrap();
        // Each renewal kept the record one retention past the lease: 160 s + 90 s.
        assert_eq!(renewed.expires_at, at(250));
        // The lease ran out at 160 s; nobody took over, and the result lands at 200 s.
        let late = at(200);
        let done = complete(Some(&renewed), &lease, b"ok", late).write.unwrap();
        assert_eq!(
            done.expires_at,
            late.saturating_add(Duration::from_secs(90))
        );
        assert_eq!(done.created_at, T0);
        let just_before = late.saturating_add(Duration::from_secs(89));
        assert_eq!(
            claim(Some(&done), &request("a"), just_before).outcome,
            ClaimOutcome::replay(b"ok".to_vec())
        );
        assert!(done.is_absent(late.saturating_add(Duration::from_secs(90))));
        // A result stored early keeps the later of the two expiries.
        let early = T0.saturating_add(Duration::from_secs(10));
        let failed = fail(Some(&record), &lease, b"no", early).write.unwrap();
        assert_eq!(
            failed.expires_at,
            early.saturating_add(Duration::from_secs(90))
        );
    }

    #[test]
    fn a_takeover_near_the_end_of_retention_is_not_overtaken() {
        let mut req = request("a");
        req.lease = Duration::from_secs(60);
        req.retention = Duration::from_secs(90);
        let (_, _, record) = claimed(claim(None, &req, T0));
        // At 80 s the first lease is over: a takeover whose new lease outlives retention.
        let at = T0.saturating_add(Duration::from_secs(80));
        let (taken, resumed, record) = claimed(claim(
            Some(&record),
            &req.clone().with_attempt(AttemptId::random()),
            at,
        ));
        assert!(resumed);
        // At 100 s retention has ended but the takeover's lease lives until 140 s.
        let after = T0.saturating_add(Duration::from_secs(100));
        assert!(matches!(
            claim(Some(&record), &request("a"), after).outcome,
            ClaimOutcome::InFlight { .. }
        ));
        assert_eq!(
            complete(Some(&record), &taken, b"ok", after).outcome,
            WriteOutcome::Applied
        );
    }

    #[test]
    fn an_release_key_fences_the_owner_and_refuses_finished_records() {
        let (lease, _, record) = claimed(claim(None, &request("a"), T0));
        let operator = AttemptId::random();
        let t = release_key(Some(&record), operator, T0);
        assert_eq!(
            t.outcome,
            crate::admin::ReleaseKeyOutcome::Released {
                token: lease.token + 1
            }
        );
        let released = t.write.unwrap();
        assert_eq!(
            complete(Some(&released), &lease, b"late", T0).outcome,
            WriteOutcome::Fenced,
            "the old owner is fenced"
        );
        let (next, resumed, _) = claimed(claim(Some(&released), &request("a"), T0));
        assert!(resumed && next.token == lease.token + 2);
        let done = complete(Some(&record), &lease, b"ok", T0).write.unwrap();
        assert_eq!(
            release_key(Some(&done), operator, T0).outcome,
            crate::admin::ReleaseKeyOutcome::Finished(State::Completed)
        );
        assert_eq!(
            release_key(None, operator, T0).outcome,
            crate::admin::ReleaseKeyOutcome::NotFound
        );
    }

    #[test]
    fn durations_past_the_maximum_count_as_the_maximum() {
        let mut req = request("a");
        req.lease = Duration::MAX;
        req.retention = Duration::MAX;
        let (lease, _, record) = claimed(claim(None, &req, T0));
        assert_eq!(
            lease.lease_until,
            T0.saturating_add(crate::raw::MAX_DURATION)
        );
        assert_eq!(
            record.expires_at,
            T0.saturating_add(crate::raw::MAX_DURATION)
        );
        let RenewOutcome::Renewed(renewed) =
            renew(Some(&record), &lease, Duration::MAX, T0).outcome
        else {
            panic!("renew applies")
        };
        assert_eq!(
            renewed.lease_until,
            T0.saturating_add(crate::raw::MAX_DURATION)
        );
    }
}
