//! Unit tests of the state machine: each transition against the tables of the module docs.

use super::*;
use crate::{Fingerprint, Key};

/// [`super::claim`] below the last token, where it never refuses.
fn claim(
    existing: Option<&Record>,
    request: &ClaimRequest,
    now: Timestamp,
) -> Transition<ClaimOutcome> {
    super::claim(existing, request, now).expect("no token at its limit here")
}

/// [`super::release_key`] below the last token, where it never refuses.
fn release_key(
    existing: Option<&Record>,
    attempt: AttemptId,
    now: Timestamp,
) -> Transition<crate::admin::ReleaseKeyOutcome> {
    super::release_key(existing, attempt, now).expect("no token at its limit here")
}

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
    let (lease2, resumed, record2) = claimed(claim(Some(&record), &request("different"), later));
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
    let RenewOutcome::Renewed(renewed) = renew(Some(&record), &lease, Duration::MAX, T0).outcome
    else {
        panic!("renew applies")
    };
    assert_eq!(
        renewed.lease_until,
        T0.saturating_add(crate::raw::MAX_DURATION)
    );
}

#[test]
fn the_last_token_is_never_passed() {
    let (_, _, mut record) = claimed(claim(None, &request("a"), T0));
    record.token = MAX_TOKEN;
    let later = T0.saturating_add(2 * HOUR);
    // A takeover and an operator's release would need the token after the last.
    assert_eq!(
        super::claim(Some(&record), &request("a"), later),
        Err(TokenAtLimit)
    );
    assert_eq!(
        super::release_key(Some(&record), AttemptId::random(), T0),
        Err(TokenAtLimit)
    );
    // Every answer that writes nothing is as for any record.
    assert_eq!(
        claim(Some(&record), &request("b"), later).outcome,
        ClaimOutcome::Mismatch
    );
    assert!(matches!(
        claim(Some(&record), &request("a"), T0).outcome,
        ClaimOutcome::InFlight { .. }
    ));
    let mut finished = record.clone();
    finished.state = State::Completed;
    finished.response = Some(b"paid".to_vec());
    assert_eq!(
        claim(Some(&finished), &request("a"), later).outcome,
        ClaimOutcome::replay(b"paid".to_vec())
    );
    assert_eq!(
        release_key(Some(&finished), AttemptId::random(), later).outcome,
        crate::admin::ReleaseKeyOutcome::Finished(State::Completed)
    );
    // Absent: a new lifetime, from token 1 again.
    let gone = record.expires_at.saturating_add(HOUR);
    let (lease, resumed, fresh) = claimed(claim(Some(&record), &request("b"), gone));
    assert_eq!((lease.token, resumed, fresh.token), (1, false, 1));
    assert!(fresh.steps.is_empty());
    // The token before the last still has one after it.
    record.token = MAX_TOKEN - 1;
    let (lease, resumed, _) = claimed(claim(Some(&record), &request("a"), later));
    assert_eq!((lease.token, resumed), (MAX_TOKEN, true));
    let released = release_key(Some(&record), AttemptId::random(), T0);
    assert_eq!(
        released.outcome,
        crate::admin::ReleaseKeyOutcome::Released { token: MAX_TOKEN }
    );
}
