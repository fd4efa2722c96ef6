//! The fenced-write table of docs/DESIGN.md §2.2, stale owners and retried writes.

use idem_core::{
    Key, State, Store, key::StepName, record::Lease, store::ClaimOutcome, store::RenewOutcome,
    store::WriteOutcome,
};

use crate::support::{HOUR, MINUTE, ZERO, claim, claimed, get, get_some, key, ok, request};

fn step(name: &str) -> StepName {
    StepName::new(name).expect("valid step name")
}

pub(crate) async fn complete_stores_the_response(store: &dyn Store) {
    let k = key("orders", "k1");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    let _ = ok(
        store.checkpoint(&lease, &step("s"), b"v").await,
        "checkpoint",
    );
    let before = get_some(store, &k).await;
    assert_eq!(
        ok(store.complete(&lease, b"done").await, "complete"),
        WriteOutcome::Applied
    );
    let after = get_some(store, &k).await;
    assert_eq!(after.state, State::Completed);
    assert_eq!(after.response.as_deref(), Some(&b"done"[..]));
    assert_eq!(
        after.fingerprint, before.fingerprint,
        "completion keeps the fingerprint"
    );
    assert_eq!(after.token, before.token);
    assert_eq!(after.steps, before.steps, "completion keeps the steps");
    assert_eq!(after.created_at, before.created_at);
    // Kept one retention after it is stored: later than the claim's expiry by the time
    // since the claim, never earlier.
    let later = after
        .expires_at
        .saturating_duration_since(before.expires_at);
    assert!(
        after.expires_at >= before.expires_at && later < std::time::Duration::from_secs(60),
        "completion keeps the expiry or moves it by the time since the claim: {:?} then {:?}",
        before.expires_at,
        after.expires_at
    );
}

pub(crate) async fn fail_stores_the_failure(store: &dyn Store) {
    let k = key("orders", "k1");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert_eq!(
        ok(store.fail(&lease, b"declined").await, "fail"),
        WriteOutcome::Applied
    );
    let after = get_some(store, &k).await;
    assert_eq!(after.state, State::Failed);
    assert_eq!(after.response.as_deref(), Some(&b"declined"[..]));
    assert_eq!(after.token, lease.token);
}

pub(crate) async fn release_lets_the_next_claim_take_over(store: &dyn Store) {
    let k = key("orders", "k1");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    let _ = ok(
        store.checkpoint(&lease, &step("debit"), b"1").await,
        "checkpoint",
    );
    assert_eq!(
        ok(store.release(&lease).await, "release"),
        WriteOutcome::Applied
    );
    let record = get_some(store, &k).await;
    assert_eq!(
        record.state,
        State::InProgress,
        "release keeps the record in progress"
    );
    assert_eq!(record.token, lease.token, "release keeps the token");
    let (next, resumed, steps) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert!(resumed, "the claim after a release takes over at once");
    assert_eq!(next.token, lease.token + 1);
    assert!(steps.contains_key("debit"), "release keeps the steps");
}

pub(crate) async fn release_without_steps_forgets_the_key(store: &dyn Store) {
    let k = key("orders", "k1");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert_eq!(
        ok(store.release(&lease).await, "release"),
        WriteOutcome::Applied
    );
    assert!(
        get(store, &k).await.is_none(),
        "a release with no step ends the record's lifetime: get finds nothing"
    );
    // Nothing took effect, so a corrected request under the key runs as new.
    let (next, resumed, steps) = claimed(store, &request(&k, "b", HOUR, HOUR)).await;
    assert!(!resumed, "the claim after a release with no step is fresh");
    assert!(steps.is_empty());
    assert_ne!(next.attempt, lease.attempt);
    assert_eq!(
        ok(store.complete(&lease, b"stale").await, "complete"),
        WriteOutcome::Fenced,
        "the released owner is fenced from the new lifetime"
    );
    assert_eq!(
        ok(store.complete(&next, b"done").await, "complete"),
        WriteOutcome::Applied
    );
    assert_eq!(
        get_some(store, &k).await.response.as_deref(),
        Some(&b"done"[..])
    );
}

pub(crate) async fn renew_extends_the_lease(store: &dyn Store) {
    let k = key("orders", "k1");
    // A lease of a minute, renewed for an hour: a duplicate is in flight.
    let (lease, _, _) = claimed(store, &request(&k, "a", MINUTE, HOUR)).await;
    let renewed = match ok(store.renew(&lease, HOUR).await, "renew") {
        RenewOutcome::Renewed(renewed) => renewed,
        RenewOutcome::Fenced => panic!("the owner's renewal was fenced"),
    };
    assert_eq!(renewed.token, lease.token);
    assert_eq!(renewed.attempt, lease.attempt);
    assert!(
        renewed.lease_until > lease.lease_until,
        "the lease end moved forward"
    );
    assert_eq!(get_some(store, &k).await.lease_until, renewed.lease_until);
    assert!(matches!(
        claim(store, &request(&k, "a", HOUR, HOUR)).await,
        ClaimOutcome::InFlight { .. }
    ));
    // Renewed to zero: over at once, so the next claim takes over.
    assert!(matches!(
        ok(store.renew(&renewed, ZERO).await, "renew"),
        RenewOutcome::Renewed(_)
    ));
    // Over, it is not renewed again: its owner has let go.
    assert_eq!(
        ok(store.renew(&renewed, HOUR).await, "renew"),
        RenewOutcome::Fenced,
        "a renewal of a lease that has ended must be fenced"
    );
    let (next, resumed, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert!(resumed);
    assert_eq!(next.token, lease.token + 1);
}

pub(crate) async fn checkpoint_records_steps(store: &dyn Store) {
    let k = key("orders", "k1");
    let req = request(&k, "a", HOUR, HOUR);
    let (lease, _, _) = claimed(store, &req).await;
    for (name, value) in [("debit", &b"1"[..]), ("charge", b""), ("debit", b"2")] {
        assert_eq!(
            ok(
                store.checkpoint(&lease, &step(name), value).await,
                "checkpoint"
            ),
            WriteOutcome::Applied
        );
    }
    let steps = get_some(store, &k).await.steps;
    assert_eq!(steps.len(), 2);
    assert_eq!(
        steps["debit"], b"2",
        "a step written twice keeps the last value"
    );
    assert_eq!(steps["charge"], b"", "an empty checkpoint is kept");
    // Binary values and unicode names survive.
    let all_bytes: Vec<u8> = (0..=255).collect();
    let _ = ok(
        store
            .checkpoint(&lease, &step("zahlung-✓"), &all_bytes)
            .await,
        "checkpoint",
    );
    let steps = get_some(store, &k).await.steps;
    assert_eq!(steps["zahlung-✓"], all_bytes);
    // A retried claim of the same attempt reads them back too, byte for byte.
    let (_, _, reclaimed) = claimed(store, &req).await;
    assert_eq!(
        reclaimed, steps,
        "a retried claim returns the steps get returns"
    );
}

/// The four writes other than `complete` with `lease`, each of which must be refused.
async fn assert_others_fenced(store: &dyn Store, lease: &Lease, who: &str) {
    let results = [
        ("fail", ok(store.fail(lease, b"stale").await, "fail")),
        ("release", ok(store.release(lease).await, "release")),
        (
            "checkpoint",
            ok(
                store.checkpoint(lease, &step("stale"), b"x").await,
                "checkpoint",
            ),
        ),
    ];
    for (op, outcome) in results {
        assert_eq!(
            outcome,
            WriteOutcome::Fenced,
            "{op} by {who} must be fenced"
        );
    }
    assert_eq!(
        ok(store.renew(lease, HOUR).await, "renew"),
        RenewOutcome::Fenced,
        "renew by {who} must be fenced"
    );
}

/// All five fenced writes with `lease`, each of which must be refused.
async fn assert_all_fenced(store: &dyn Store, lease: &Lease, who: &str) {
    assert_eq!(
        ok(store.complete(lease, b"stale").await, "complete"),
        WriteOutcome::Fenced,
        "complete by {who} must be fenced"
    );
    assert_others_fenced(store, lease, who).await;
}

pub(crate) async fn stale_owner_is_fenced_after_takeover(store: &dyn Store) {
    let k = key("orders", "k1");
    let (stale, _, _) = claimed(store, &request(&k, "a", ZERO, HOUR)).await;
    let (owner, resumed, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert!(resumed);
    // While the new owner works.
    let before = get_some(store, &k).await;
    assert_all_fenced(store, &stale, "the stale owner").await;
    assert_eq!(
        get_some(store, &k).await,
        before,
        "fenced writes change nothing"
    );
    assert_eq!(
        ok(store.complete(&owner, b"winner").await, "complete"),
        WriteOutcome::Applied
    );
    // After the new owner completed, the stale owner can neither overwrite nor erase it.
    let done = get_some(store, &k).await;
    assert_all_fenced(store, &stale, "the stale owner").await;
    assert_eq!(get_some(store, &k).await, done);
    assert_eq!(
        claim(store, &request(&k, "a", HOUR, HOUR)).await,
        ClaimOutcome::replay(b"winner".to_vec()),
        "the new owner's result survives the stale owner"
    );
}

pub(crate) async fn writes_after_the_end_are_fenced(store: &dyn Store) {
    // A completed record refuses every write but an identical retry of its completion.
    let k = key("orders", "k1");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert_eq!(
        ok(store.complete(&lease, b"r").await, "complete"),
        WriteOutcome::Applied
    );
    assert_others_fenced(store, &lease, "the owner of a completed record").await;
    let record = get_some(store, &k).await;
    assert_eq!(
        (record.state, record.response.as_deref()),
        (State::Completed, Some(&b"r"[..]))
    );

    // A record that never existed, or is absent, refuses every write.
    let mut ghost = lease.clone();
    ghost.key = key("orders", "never-claimed");
    assert_all_fenced(store, &ghost, "a lease for a missing record").await;
    let k = key("orders", "absent");
    let (absent, _, _) = claimed(store, &request(&k, "a", ZERO, ZERO)).await;
    assert_all_fenced(store, &absent, "a lease on an absent record").await;

    // A lease with the right token but another attempt id is not the owner.
    let k = key("orders", "k3");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    let mut forged = lease.clone();
    forged.attempt = idem_core::record::AttemptId::random();
    assert_all_fenced(store, &forged, "a lease with another attempt id").await;
    assert_eq!(get_some(store, &k).await.state, State::InProgress);
}

pub(crate) async fn retried_terminal_writes_are_applied(store: &dyn Store) {
    // complete, retried after the first try landed.
    let k = key("orders", "k1");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert_eq!(
        ok(store.complete(&lease, b"r").await, "complete"),
        WriteOutcome::Applied
    );
    assert_eq!(
        ok(store.complete(&lease, b"r").await, "retried complete"),
        WriteOutcome::Applied
    );
    assert_eq!(
        get_some(store, &k).await.response.as_deref(),
        Some(&b"r"[..])
    );
    // fail, likewise; a complete after a landed fail is another terminal state: fenced.
    let k = key("orders", "k2");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert_eq!(
        ok(store.fail(&lease, b"e").await, "fail"),
        WriteOutcome::Applied
    );
    assert_eq!(
        ok(store.fail(&lease, b"e").await, "retried fail"),
        WriteOutcome::Applied
    );
    assert_eq!(
        ok(store.complete(&lease, b"r").await, "complete"),
        WriteOutcome::Fenced
    );
    let record = get_some(store, &k).await;
    assert_eq!(
        (record.state, record.response.as_deref()),
        (State::Failed, Some(&b"e"[..]))
    );
}

pub(crate) async fn retried_terminal_writes_keep_the_first_bytes(store: &dyn Store) {
    // A retry is Applied because the first try landed; it must not store its own bytes.
    // Bytes of another length and content, so a partial rewrite shows too.
    let first: &[u8] = b"first\x00\xff";
    let second: &[u8] = b"second, longer";
    for failed in [false, true] {
        let what = if failed { "fail" } else { "complete" };
        let k = key("orders", &format!("retried-{what}"));
        let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
        let write = |bytes: &'static [u8]| {
            let lease = lease.clone();
            async move {
                let answer = if failed {
                    store.fail(&lease, bytes).await
                } else {
                    store.complete(&lease, bytes).await
                };
                ok(answer, what)
            }
        };
        assert_eq!(write(first).await, WriteOutcome::Applied);
        let landed = get_some(store, &k).await;
        assert_eq!(
            write(second).await,
            WriteOutcome::Applied,
            "{what} retried by the same lease with other bytes"
        );
        let after = get_some(store, &k).await;
        assert!(
            after.response.as_deref() == Some(first),
            "a retried {what} rewrote the stored bytes: {:?} instead of {first:?}",
            after.response
        );
        assert_eq!(after, landed, "a retried {what} writes nothing");
        let expected = if failed {
            ClaimOutcome::replay_failure(first.to_vec())
        } else {
            ClaimOutcome::replay(first.to_vec())
        };
        match claim(store, &request(&k, "a", HOUR, HOUR)).await {
            replayed if replayed == expected => {}
            other => {
                panic!("after a retried {what}, a claim must replay the first bytes: {other:?}")
            }
        }
    }
}

pub(crate) async fn fingerprint_survives_completion(store: &dyn Store) {
    let k = key("orders", "k1");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert_eq!(
        ok(store.complete(&lease, b"r").await, "complete"),
        WriteOutcome::Applied
    );
    assert_eq!(
        get_some(store, &k).await.fingerprint,
        crate::support::fp("a")
    );
    assert_eq!(
        claim(store, &request(&k, "a", HOUR, HOUR)).await,
        ClaimOutcome::replay(b"r".to_vec()),
        "an identical retry replays"
    );
    assert_eq!(
        claim(store, &request(&k, "changed", HOUR, HOUR)).await,
        ClaimOutcome::Mismatch,
        "a changed request under the same key is a mismatch"
    );
}

pub(crate) async fn scopes_are_isolated(store: &dyn Store) {
    let a = Key::new("acct_1/payments.create", "same-key").expect("valid");
    let b = Key::new("acct_2/payments.create", "same-key").expect("valid");
    let (la, _, _) = claimed(store, &request(&a, "a", HOUR, HOUR)).await;
    let (lb, resumed, _) = claimed(store, &request(&b, "other", HOUR, HOUR)).await;
    assert!(
        !resumed && lb.token == 1,
        "the same key in another scope is a fresh record"
    );
    assert_eq!(
        ok(store.complete(&la, b"for-a").await, "complete"),
        WriteOutcome::Applied
    );
    assert_eq!(get_some(store, &b).await.state, State::InProgress);
    assert_eq!(
        ok(store.fail(&lb, b"for-b").await, "fail"),
        WriteOutcome::Applied
    );
    assert_eq!(
        get_some(store, &a).await.response.as_deref(),
        Some(&b"for-a"[..])
    );
    assert_eq!(
        get_some(store, &b).await.response.as_deref(),
        Some(&b"for-b"[..])
    );
    // Scope and key are not concatenated, with or without a separator: each split of
    // the same text is a record of its own.
    let splits = [
        ("ab", "c"),
        ("a", "bc"),
        ("x:y", "z"),
        ("x", "y:z"),
        ("1:x", "y"),
        ("1", "x:y"),
    ];
    for (i, (scope, k)) in splits.iter().enumerate() {
        let split = Key::new(*scope, *k).expect("valid");
        let (lease, resumed, _) =
            claimed(store, &request(&split, &format!("f{i}"), HOUR, HOUR)).await;
        assert!(
            !resumed && lease.token == 1,
            "({scope:?}, {k:?}) met another split of the same text"
        );
    }
}
