//! The claim table of docs/DESIGN.md §2.1, row by row.

use std::time::Duration;

use idem_core::{
    State, Store, key::StepName, store::ClaimOutcome, store::Expiry, store::WriteOutcome,
};

use crate::Capabilities;
use crate::support::{HOUR, ZERO, claim, claimed, fp, get, get_some, key, ok, request};

pub(crate) async fn absent_key_is_claimed_fresh(store: &dyn Store) {
    let k = key("orders", "k1");
    assert_eq!(get(store, &k).await, None, "a fresh store holds no record");
    let req = request(&k, "a", HOUR, HOUR);
    let (lease, resumed, steps) = claimed(store, &req).await;
    assert!(!resumed, "a fresh claim is not a takeover");
    assert_eq!(lease.token, 1, "the first claim's token is 1");
    assert_eq!(lease.key, k);
    assert_eq!(lease.attempt, req.attempt);
    assert!(steps.is_empty());
    let record = get_some(store, &k).await;
    assert_eq!(record.state, State::InProgress);
    assert_eq!(record.token, 1);
    assert_eq!(record.fingerprint, fp("a"));
    assert_eq!(record.attempt, req.attempt);
    assert_eq!(record.response, None);
    assert!(record.created_at < record.expires_at);
    assert_eq!(record.lease_until, lease.lease_until);
    assert_eq!(
        record.created_at, lease.created_at,
        "the lease carries the record's creation time"
    );
}

pub(crate) async fn absent_record_is_claimed_fresh(store: &dyn Store, caps: &Capabilities) {
    // Lease and retention zero: absent at once. A store that deletes such records itself
    // starts the next lifetime at token 1; one that keeps them continues the token.
    let vanishes = store.expiry() == Expiry::Vanishes;
    let k = key("orders", "k1");
    let (lease, _, _) = claimed(store, &request(&k, "a", ZERO, ZERO)).await;
    assert_eq!(get(store, &k).await, None, "get hides an absent record");
    // A different fingerprint is no mismatch: the old record counts as absent.
    let (again, resumed, steps) = claimed(store, &request(&k, "b", HOUR, HOUR)).await;
    assert!(
        !resumed,
        "claiming an expired record is fresh, not a takeover"
    );
    assert!(steps.is_empty());
    let expected = if vanishes { 1 } else { lease.token + 1 };
    assert_eq!(
        again.token, expected,
        "the token continues from the absent record (or restarts where it vanished)"
    );
    assert_eq!(get_some(store, &k).await.fingerprint, fp("b"));

    // With a clock the suite can move, a record with steps and a result expires later.
    if let Some(clock) = &caps.manual_clock {
        let k = key("orders", "k2");
        let retention = Duration::from_secs(60);
        let (lease, _, _) = claimed(store, &request(&k, "a", retention, retention)).await;
        let step = StepName::new("debit").expect("valid");
        assert_eq!(
            ok(store.checkpoint(&lease, &step, b"x").await, "checkpoint"),
            WriteOutcome::Applied
        );
        assert_eq!(
            ok(store.complete(&lease, b"old").await, "complete"),
            WriteOutcome::Applied
        );
        // The checkpoint kept the record one retention past its lease of a minute.
        clock.advance(2 * retention);
        assert_eq!(
            get(store, &k).await,
            None,
            "get hides a record once now >= expires_at"
        );
        let (again, resumed, steps) = claimed(store, &request(&k, "b", HOUR, HOUR)).await;
        assert!(!resumed);
        assert!(steps.is_empty(), "steps are cleared by a fresh claim");
        assert_eq!(again.token, if vanishes { 1 } else { lease.token + 1 });
        let record = get_some(store, &k).await;
        assert_eq!(record.response, None, "the old response is gone");
        assert!(record.steps.is_empty());
        assert_eq!(record.state, State::InProgress);
    }
}

pub(crate) async fn different_fingerprint_is_a_mismatch(store: &dyn Store) {
    // In progress, completed and failed records all answer Mismatch and stay as they were.
    for (name, finish) in [("in_progress", 0), ("completed", 1), ("failed", 2)] {
        let k = key("orders", name);
        let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
        let written = match finish {
            1 => ok(store.complete(&lease, b"r").await, "complete"),
            2 => ok(store.fail(&lease, b"r").await, "fail"),
            _ => WriteOutcome::Applied,
        };
        assert_eq!(written, WriteOutcome::Applied);
        let before = get_some(store, &k).await;
        let outcome = claim(store, &request(&k, "b", HOUR, HOUR)).await;
        assert_eq!(outcome, ClaimOutcome::Mismatch, "record {name}");
        assert_eq!(
            get_some(store, &k).await,
            before,
            "a mismatch writes nothing"
        );
    }
    // Mismatch is checked before the lease: an expired lease is not taken over either.
    let k = key("orders", "expired_lease");
    let _ = claimed(store, &request(&k, "a", ZERO, HOUR)).await;
    let outcome = claim(store, &request(&k, "b", HOUR, HOUR)).await;
    assert_eq!(outcome, ClaimOutcome::Mismatch);
    assert_eq!(get_some(store, &k).await.token, 1);
}

pub(crate) async fn completed_record_replays(store: &dyn Store) {
    let k = key("orders", "k1");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert_eq!(
        ok(store.complete(&lease, b"receipt-1").await, "complete"),
        WriteOutcome::Applied
    );
    let before = get_some(store, &k).await;
    for _ in 0..3 {
        let outcome = claim(store, &request(&k, "a", HOUR, HOUR)).await;
        assert_eq!(outcome, ClaimOutcome::replay(b"receipt-1".to_vec()));
    }
    let after = get_some(store, &k).await;
    assert_eq!(after, before, "a replay writes nothing");
    assert_eq!(after.state, State::Completed);
}

pub(crate) async fn failed_record_replays_failure(store: &dyn Store) {
    let k = key("orders", "k1");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert_eq!(
        ok(store.fail(&lease, b"declined").await, "fail"),
        WriteOutcome::Applied
    );
    let before = get_some(store, &k).await;
    let outcome = claim(store, &request(&k, "a", HOUR, HOUR)).await;
    assert_eq!(outcome, ClaimOutcome::replay_failure(b"declined".to_vec()));
    let after = get_some(store, &k).await;
    assert_eq!(after, before, "a replayed failure writes nothing");
    assert_eq!(after.state, State::Failed);
}

pub(crate) async fn live_lease_is_in_flight(store: &dyn Store) {
    let k = key("orders", "k1");
    let _ = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    let before = get_some(store, &k).await;
    match claim(store, &request(&k, "a", HOUR, HOUR)).await {
        ClaimOutcome::InFlight { retry_after, .. } => {
            assert!(
                retry_after > HOUR / 2 && retry_after <= HOUR,
                "retry_after is the time left on the lease, got {retry_after:?}"
            );
        }
        other => panic!("expected InFlight, the store answered {other:?}"),
    }
    assert_eq!(
        get_some(store, &k).await,
        before,
        "in-flight writes nothing"
    );
}

pub(crate) async fn same_attempt_gets_its_lease_back(store: &dyn Store) {
    let k = key("orders", "k1");
    let req = request(&k, "a", HOUR, HOUR);
    let (lease, _, _) = claimed(store, &req).await;
    let step = StepName::new("debit").expect("valid");
    let _ = ok(store.checkpoint(&lease, &step, b"1").await, "checkpoint");
    // The answer to the first claim was "lost": the same request again.
    let (again, resumed, steps) = claimed(store, &req).await;
    assert_eq!(again, lease, "the same attempt gets the same lease");
    assert!(!resumed);
    assert_eq!(steps.get("debit").map(Vec::as_slice), Some(&b"1"[..]));
    assert_eq!(get_some(store, &k).await.token, 1, "no takeover happened");
    assert_eq!(
        ok(store.complete(&again, b"r").await, "complete"),
        WriteOutcome::Applied
    );
}

pub(crate) async fn expired_lease_is_taken_over(store: &dyn Store) {
    let k = key("orders", "k1");
    let first = request(&k, "a", ZERO, HOUR);
    let (old, _, _) = claimed(store, &first).await;
    let step = StepName::new("debit").expect("valid");
    assert_eq!(
        ok(store.checkpoint(&old, &step, b"d1").await, "checkpoint"),
        WriteOutcome::Applied
    );
    let created = get_some(store, &k).await.created_at;

    let second = request(&k, "a", HOUR, HOUR);
    let (new, resumed, steps) = claimed(store, &second).await;
    assert!(resumed, "taking over an expired lease is a resumption");
    assert_eq!(new.token, old.token + 1);
    assert_eq!(new.attempt, second.attempt);
    assert_eq!(
        steps.get("debit").map(Vec::as_slice),
        Some(&b"d1"[..]),
        "steps survive a takeover"
    );
    let record = get_some(store, &k).await;
    assert_eq!(record.state, State::InProgress);
    assert_eq!(record.token, new.token);
    assert_eq!(record.attempt, second.attempt);
    assert_eq!(
        record.created_at, created,
        "a takeover keeps the record's creation time"
    );
    // The new lease is live: a third attempt is in flight.
    assert!(matches!(
        claim(store, &request(&k, "a", HOUR, HOUR)).await,
        ClaimOutcome::InFlight { .. }
    ));
}

pub(crate) async fn tokens_strictly_increase(store: &dyn Store) {
    let k = key("orders", "k1");
    let mut last = 0;
    // Takeovers.
    for _ in 0..5 {
        let (lease, _, _) = claimed(store, &request(&k, "a", ZERO, HOUR)).await;
        assert!(lease.token > last, "token {} after {last}", lease.token);
        last = lease.token;
    }
    // Release (of a record with a step, kept for a takeover), then takeover.
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert!(lease.token > last);
    last = lease.token;
    let debit = idem_core::key::StepName::new("debit").expect("valid step name");
    let _ = ok(store.checkpoint(&lease, &debit, b"1").await, "checkpoint");
    assert_eq!(
        ok(store.release(&lease).await, "release"),
        WriteOutcome::Applied
    );
    let (lease, resumed, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert!(resumed && lease.token > last);

    // Re-claims of an absent record that the store keeps (until purged) continue the
    // token; a store whose absent records vanish starts each lifetime again at 1.
    let k = key("orders", "k2");
    let vanishes = store.expiry() == Expiry::Vanishes;
    let mut last = 0;
    for round in 0..5 {
        let (lease, _, _) = claimed(store, &request(&k, "a", ZERO, ZERO)).await;
        if vanishes {
            assert_eq!(
                lease.token, 1,
                "round {round}: a vanished record starts over"
            );
        } else {
            assert!(
                lease.token > last,
                "round {round}: token {} after {last}",
                lease.token
            );
        }
        last = lease.token;
    }
}
