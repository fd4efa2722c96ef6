//! Time: absence, live leases past retention, `get`, `purge_expired`, record lifetimes
//! and the extremes of every duration.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Heartbeat, Idempotency, Outcome, State, Store, WorkError, key::StepName, raw::MAX_DURATION,
    raw::duration_millis, record::AttemptId, store::ClaimOutcome, store::Expiry,
    store::RenewOutcome, store::WriteOutcome,
};

use crate::Capabilities;
use crate::support::{
    HOUR, SHORT_LEASE, ZERO, claim, claimed, fp, get, get_some, key, let_time_pass, ok, request,
};

pub(crate) async fn get_hides_absent_records(store: &dyn Store, caps: &Capabilities) {
    let live = key("retention", "live");
    let gone = key("retention", "gone");
    let leased = key("retention", "expired-but-leased");
    let _ = claimed(store, &request(&live, "a", HOUR, HOUR)).await;
    let _ = claimed(store, &request(&gone, "a", ZERO, ZERO)).await;
    let _ = claimed(store, &request(&leased, "a", HOUR, ZERO)).await;
    assert!(get(store, &live).await.is_some());
    assert_eq!(
        get(store, &gone).await,
        None,
        "a record past expires_at with no live lease is hidden"
    );
    assert!(
        get(store, &leased).await.is_some(),
        "a record past expires_at that a live lease holds is shown"
    );
    assert_eq!(get(store, &key("retention", "never")).await, None);

    if let Some(clock) = &caps.manual_clock {
        let k = key("retention", "later");
        let retention = Duration::from_secs(60);
        let (lease, _, _) = claimed(store, &request(&k, "a", ZERO, retention)).await;
        assert_eq!(
            ok(store.complete(&lease, b"r").await, "complete"),
            WriteOutcome::Applied
        );
        clock.advance(retention - Duration::from_millis(1));
        assert!(get(store, &k).await.is_some(), "visible until expires_at");
        assert!(matches!(
            claim(store, &request(&k, "a", HOUR, HOUR)).await,
            ClaimOutcome::Replay { .. }
        ));
        clock.advance(Duration::from_millis(1));
        assert_eq!(get(store, &k).await, None, "hidden from expires_at on");
    }
}

pub(crate) async fn a_live_lease_is_never_absent(store: &dyn Store, caps: &Capabilities) {
    // Retention zero, lease an hour: expired at once, yet held by a live owner.
    let k = key("live-lease", "k1");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, ZERO)).await;
    match claim(store, &request(&k, "a", HOUR, HOUR)).await {
        ClaimOutcome::InFlight { retry_after, .. } => assert!(
            retry_after > HOUR / 2 && retry_after <= HOUR,
            "retry_after is the time left on the live lease, got {retry_after:?}"
        ),
        other => panic!(
            "a second claim while the first lease lives must be InFlight, whatever the \
             retention; the store answered {other:?}"
        ),
    }
    assert_eq!(
        claim(store, &request(&k, "b", HOUR, HOUR)).await,
        ClaimOutcome::Mismatch,
        "another request under the key is a mismatch while the lease lives"
    );
    let _ = ok(store.purge_expired(1000).await, "purge");
    let record = get(store, &k)
        .await
        .expect("neither get nor purge treats a leased record as absent");
    assert_eq!(
        (record.state, record.token),
        (State::InProgress, lease.token)
    );
    // Its owner still writes.
    let renewed = match ok(store.renew(&lease, HOUR).await, "renew") {
        RenewOutcome::Renewed(renewed) => renewed,
        RenewOutcome::Fenced => panic!("a live owner's renewal past retention was fenced"),
    };
    let step = StepName::new("debit").expect("valid");
    assert_eq!(
        ok(store.checkpoint(&lease, &step, b"1").await, "checkpoint"),
        WriteOutcome::Applied
    );
    assert_eq!(
        ok(store.complete(&lease, b"done").await, "complete"),
        WriteOutcome::Applied
    );
    // The renewal kept the record one retention (zero) past its lease's end, and the
    // result with it.
    let done = get(store, &k)
        .await
        .expect("a result stored within the renewed lease is shown until the lease's end");
    assert_eq!(done.state, State::Completed);
    assert!(
        done.expires_at >= renewed.lease_until,
        "the renewal must keep the record to the end of its lease at least: expires_at \
         {:?}, lease until {:?}",
        done.expires_at,
        renewed.lease_until
    );
    // Nothing kept this one past its retention: its result is kept one retention after it
    // is stored, zero here, so it is absent at once and the next claim is fresh. (A
    // longer retention is in `late_results_stay_replayable`.)
    let k = key("live-lease", "k2");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, ZERO)).await;
    assert_eq!(
        ok(store.complete(&lease, b"done").await, "complete"),
        WriteOutcome::Applied
    );
    assert_eq!(get(store, &k).await, None);
    let (next, resumed, steps) = claimed(store, &request(&k, "b", HOUR, HOUR)).await;
    assert!(!resumed && steps.is_empty());
    let vanishes = store.expiry() == Expiry::Vanishes;
    assert_eq!(next.token, if vanishes { 1 } else { lease.token + 1 });

    if let Some(clock) = &caps.manual_clock {
        // A takeover near the end of retention: its lease outlives the record's retention.
        let k = key("live-lease", "takeover");
        let (first, _, _) = claimed(
            store,
            &request(&k, "a", Duration::from_secs(60), Duration::from_secs(90)),
        )
        .await;
        clock.advance(Duration::from_secs(80));
        let (taken, resumed, _) = claimed(
            store,
            &request(&k, "a", Duration::from_secs(60), Duration::from_secs(90)),
        )
        .await;
        assert!(resumed && taken.token == first.token + 1);
        assert_eq!(
            get_some(store, &k).await.expires_at,
            taken.created_at.saturating_add(Duration::from_secs(230)),
            "a takeover keeps the record one retention past its lease: 140 s + 90 s"
        );
        clock.advance(Duration::from_secs(20)); // 100 s: retention over, lease until 140 s
        assert!(
            matches!(
                claim(store, &request(&k, "a", HOUR, HOUR)).await,
                ClaimOutcome::InFlight { .. }
            ),
            "the takeover's live lease holds the record past its retention"
        );
        // 200 s: the lease ended at 140 s and nobody took over; the owner's result lands.
        clock.advance(Duration::from_secs(100));
        assert_eq!(
            ok(store.complete(&taken, b"r").await, "complete"),
            WriteOutcome::Applied
        );
        // Stored at 200 s, the result is replayed for the retention of 90 s, then it is
        // absent.
        let done = get_some(store, &k).await;
        assert_eq!(
            done.expires_at,
            done.created_at.saturating_add(Duration::from_secs(290)),
            "a result stored at 200 s is kept until 200 s + the retention of 90 s"
        );
        clock.advance(Duration::from_secs(89));
        assert!(
            matches!(
                claim(store, &request(&k, "a", HOUR, HOUR)).await,
                ClaimOutcome::Replay { .. }
            ),
            "a result stored late is replayed for a whole retention"
        );
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            get(store, &k).await,
            None,
            "absent one retention after it was stored"
        );

        // Heartbeats past retention keep the record held as long as they go on.
        let k = key("live-lease", "heartbeat");
        let (mut beat, _, _) = claimed(
            store,
            &request(&k, "a", Duration::from_secs(10), Duration::from_secs(30)),
        )
        .await;
        for _ in 0..12 {
            clock.advance(Duration::from_secs(5));
            beat = match ok(store.renew(&beat, Duration::from_secs(10)).await, "renew") {
                RenewOutcome::Renewed(renewed) => renewed,
                RenewOutcome::Fenced => panic!("a live owner's renewal past retention was fenced"),
            };
        }
        assert!(matches!(
            claim(store, &request(&k, "a", HOUR, HOUR)).await,
            ClaimOutcome::InFlight { .. }
        ));
        // Failed 60 s after creation: the last renewal (to 70 s) keeps it one retention
        // past that lease, until 100 s, which is later than one retention after the
        // failure (90 s).
        assert_eq!(
            ok(store.fail(&beat, b"no").await, "fail"),
            WriteOutcome::Applied
        );
        clock.advance(Duration::from_secs(39));
        assert!(matches!(
            claim(store, &request(&k, "a", HOUR, HOUR)).await,
            ClaimOutcome::ReplayFailure { .. }
        ));
        clock.advance(Duration::from_secs(1));
        assert_eq!(get(store, &k).await, None);
    }
}

/// How long `late_results_stay_replayable` keeps its records: short enough to wait for
/// on a server's clock, long enough to claim and read within it after storing.
const SHORT_RETENTION: Duration = Duration::from_secs(1);

pub(crate) async fn a_release_after_the_retention_keeps_its_steps(
    store: &dyn Store,
    caps: &Capabilities,
) {
    // An hour's lease holds the record past a retention of a second (as heartbeats
    // would); the work checkpointed a step, then released.
    let k = key("late-release", "stepped");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, SHORT_RETENTION)).await;
    let debit = StepName::new("debit").expect("valid step name");
    let _ = ok(store.checkpoint(&lease, &debit, b"1").await, "checkpoint");
    let_time_pass(caps, SHORT_RETENTION).await;
    assert_eq!(
        ok(store.release(&lease).await, "release"),
        WriteOutcome::Applied
    );
    let record = get(store, &k).await.unwrap_or_else(|| {
        panic!("a release after the retention ended must keep a record with steps")
    });
    let kept = record
        .expires_at
        .saturating_duration_since(record.created_at);
    assert!(
        kept >= 2 * SHORT_RETENTION,
        "expires_at must be at least one retention after the release; it is {kept:?} after creation"
    );
    if caps.manual_clock.is_some() {
        assert_eq!(
            kept,
            HOUR + SHORT_RETENTION,
            "the checkpoint kept the record one retention past its lease of an hour, and \
             the release keeps it so"
        );
    }
    // Released again (a retry whose first try landed): nothing moves twice.
    assert_eq!(
        ok(store.release(&lease).await, "release"),
        WriteOutcome::Applied
    );
    assert_eq!(
        get_some(store, &k).await.expires_at,
        record.expires_at,
        "a release repeated must not move the expiry again"
    );
    let (next, resumed, steps) = claimed(store, &request(&k, "a", HOUR, SHORT_RETENTION)).await;
    assert!(resumed, "the next claim takes over");
    assert_eq!(next.token, lease.token + 1);
    assert_eq!(
        steps.get("debit").map(Vec::as_slice),
        Some(&b"1"[..]),
        "the step is kept, so it does not run again"
    );
}

pub(crate) async fn a_release_after_its_lease_ended_keeps_its_end(
    store: &dyn Store,
    caps: &Capabilities,
) {
    // A step keeps the record through the release; the lease ran out before the release
    // came, and nobody took over.
    let k = key("late-release", "ended-lease");
    let (lease, _, _) = claimed(store, &request(&k, "a", SHORT_LEASE, HOUR)).await;
    let debit = StepName::new("debit").expect("valid step name");
    assert_eq!(
        ok(store.checkpoint(&lease, &debit, b"1").await, "checkpoint"),
        WriteOutcome::Applied
    );
    let_time_pass(caps, SHORT_LEASE + Duration::from_millis(100)).await;
    assert_eq!(
        ok(store.release(&lease).await, "release"),
        WriteOutcome::Applied
    );
    let record = get_some(store, &k).await;
    assert_eq!(
        record.lease_until, lease.lease_until,
        "a release after the lease ran out must keep the lease's end (lease_until = \
         min(lease_until, now)), not move it to the release"
    );
}

pub(crate) async fn late_results_stay_replayable(store: &dyn Store, caps: &Capabilities) {
    // Leases of an hour hold both records past a retention of a second: the work goes on
    // (as heartbeats would keep it going) and stores its result after the retention ended.
    let done = key("late-result", "completed");
    let failed = key("late-result", "failed");
    let (done_lease, _, _) = claimed(store, &request(&done, "a", HOUR, SHORT_RETENTION)).await;
    let (failed_lease, _, _) = claimed(store, &request(&failed, "a", HOUR, SHORT_RETENTION)).await;
    let_time_pass(caps, SHORT_RETENTION).await;
    assert!(
        matches!(
            claim(store, &request(&done, "a", HOUR, HOUR)).await,
            ClaimOutcome::InFlight { .. }
        ),
        "the live lease holds the record past its retention"
    );
    assert_eq!(
        ok(store.complete(&done_lease, b"late").await, "complete"),
        WriteOutcome::Applied
    );
    assert_eq!(
        ok(store.fail(&failed_lease, b"late failure").await, "fail"),
        WriteOutcome::Applied
    );
    match claim(store, &request(&done, "a", HOUR, HOUR)).await {
        ClaimOutcome::Replay { response, .. } => assert_eq!(response, b"late".to_vec()),
        other => panic!(
            "a result stored after the retention ended must be replayed for one retention \
             after it is stored; the store answered {other:?}"
        ),
    }
    match claim(store, &request(&failed, "a", HOUR, HOUR)).await {
        ClaimOutcome::ReplayFailure { response, .. } => {
            assert_eq!(response, b"late failure".to_vec())
        }
        other => panic!(
            "a failure stored after the retention ended must be replayed for one retention \
             after it is stored; the store answered {other:?}"
        ),
    }
    for (k, state) in [(&done, State::Completed), (&failed, State::Failed)] {
        let record = get(store, k)
            .await
            .unwrap_or_else(|| panic!("get must show the {state:?} record stored late"));
        assert_eq!(record.state, state);
        // Stored at least one retention after creation, kept one retention after that.
        let kept = record
            .expires_at
            .saturating_duration_since(record.created_at);
        assert!(
            kept >= 2 * SHORT_RETENTION,
            "{state:?}: expires_at must be at least one retention after the result was \
             stored; it is {kept:?} after creation"
        );
    }
    // Retried by the same owner, the terminal writes are still applied and write nothing.
    let before = get_some(store, &done).await;
    assert_eq!(
        ok(store.complete(&done_lease, b"late").await, "complete"),
        WriteOutcome::Applied
    );
    assert_eq!(
        get_some(store, &done).await,
        before,
        "a retried complete wrote"
    );

    if let Some(clock) = &caps.manual_clock {
        // Exactly one retention after it was stored, the result is absent.
        let record = get_some(store, &done).await;
        assert_eq!(
            record.expires_at,
            record.created_at.saturating_add(2 * SHORT_RETENTION)
        );
        clock.advance(SHORT_RETENTION - Duration::from_millis(1));
        assert!(matches!(
            claim(store, &request(&done, "a", HOUR, HOUR)).await,
            ClaimOutcome::Replay { .. }
        ));
        clock.advance(Duration::from_millis(1));
        assert_eq!(get(store, &done).await, None);
    }
}

pub(crate) async fn purge_removes_only_absent_records(store: &dyn Store, caps: &Capabilities) {
    // Kept: present records in every state.
    let in_progress = key("purge", "in_progress");
    let completed = key("purge", "completed");
    let lease_over = key("purge", "lease_over");
    let _ = claimed(store, &request(&in_progress, "a", HOUR, HOUR)).await;
    let (lease, _, _) = claimed(store, &request(&completed, "a", HOUR, HOUR)).await;
    let _ = ok(store.complete(&lease, b"r").await, "complete");
    let _ = claimed(store, &request(&lease_over, "a", ZERO, HOUR)).await;
    // Purged: absent records (expired, lease over).
    for i in 0..5 {
        let _ = claimed(
            store,
            &request(&key("purge", &format!("gone-{i}")), "a", ZERO, ZERO),
        )
        .await;
    }
    // Never purged: an expired record whose lease is live.
    let leased = key("purge", "expired_but_leased");
    let (leased_lease, _, _) = claimed(store, &request(&leased, "a", HOUR, ZERO)).await;

    if store.expiry() == Expiry::Vanishes {
        // The store deleted them itself: nothing is left for purge to do.
        assert_eq!(ok(store.purge_expired(1000).await, "purge"), 0);
    } else {
        assert_eq!(
            ok(store.purge_expired(2).await, "purge"),
            2,
            "purge honours its limit"
        );
        assert_eq!(
            ok(store.purge_expired(1000).await, "purge"),
            3,
            "the rest of the absent records"
        );
        assert_eq!(
            ok(store.purge_expired(1000).await, "purge"),
            0,
            "nothing left to purge"
        );
    }
    // Purged records are gone: claimed again, they start over at token 1.
    for i in 0..5 {
        let gone = key("purge", &format!("gone-{i}"));
        let (again, _, _) = claimed(store, &request(&gone, "b", HOUR, HOUR)).await;
        assert_eq!(again.token, 1, "gone-{i} was not purged");
    }
    for k in [&in_progress, &completed, &lease_over] {
        assert!(
            get(store, k).await.is_some(),
            "purge removed a record that was not expired"
        );
    }
    let survivor = get(store, &leased)
        .await
        .expect("purge removed an expired record whose lease is live");
    assert_eq!(survivor.token, leased_lease.token);

    if let Some(clock) = &caps.manual_clock {
        clock.advance(2 * HOUR);
        // Now everything above has expired and no lease is live.
        assert_eq!(ok(store.purge_expired(1000).await, "purge"), 9);
    }
}

/// Long enough that a store's clock has certainly moved past a short lease and
/// retention, and that two creation times differ.
const PAUSE: Duration = Duration::from_millis(10);

pub(crate) async fn lifetimes_are_told_apart(store: Arc<dyn Store>, caps: &Capabilities) {
    let vanishes = store.expiry() == Expiry::Vanishes;
    // Store level: a record that is deleted, then claimed again, starts a new lifetime.
    let k = key("lifetimes", "store");
    let (first, _, _) = claimed(store.as_ref(), &request(&k, "a", ZERO, ZERO)).await;
    let_time_pass(caps, PAUSE).await;
    if !vanishes {
        assert_eq!(ok(store.purge_expired(1000).await, "purge"), 1);
    }
    let (second, _, _) = claimed(store.as_ref(), &request(&k, "a", HOUR, HOUR)).await;
    assert_eq!(
        second.token, 1,
        "a deleted record's next lifetime starts at 1"
    );
    assert!(
        second.created_at > first.created_at,
        "a new lifetime has a later creation time: {:?} after {:?}",
        second.created_at,
        first.created_at
    );
    assert_eq!(
        get_some(store.as_ref(), &k).await.created_at,
        second.created_at
    );

    // Driver level: the derived keys of two lifetimes differ, so a downstream system that
    // deduplicates on them never merges the two. The lease lasts through a claim's round
    // trips on a loaded server: shorter, the driver would find it over before the work
    // began, and start nothing.
    let short = SHORT_LEASE;
    let idem = Idempotency::builder(Arc::clone(&store))
        .lease(short)
        .retention(short)
        .heartbeat(Heartbeat::Off)
        .build()
        .expect("valid driver settings");
    let k = key("lifetimes", "driver");
    let derive = |ctx: idem_core::Context| async move {
        let lease = ctx.lease();
        Err::<(), _>(WorkError::Unknown((
            ctx.derive("charge"),
            lease.created_at.as_unix_millis(),
            lease.token,
        )))
    };
    let run = || async {
        match idem.execute(&k, fp("same request"), derive).await {
            Ok(Outcome::Unknown(found)) => found,
            other => panic!("the work ran and reported an unknown outcome: {other:?}"),
        }
    };
    let (derived_1, created_1, _) = run().await;
    let_time_pass(caps, short + PAUSE).await;
    if !vanishes {
        let _ = ok(store.purge_expired(1000).await, "purge");
    }
    let (derived_2, created_2, token_2) = run().await;
    assert_eq!(token_2, 1, "the record was deleted: a new lifetime");
    assert!(created_2 > created_1);
    assert_ne!(
        derived_1, derived_2,
        "two lifetimes of a key derive different downstream keys"
    );
}

/// The same attempt claims a key again after its record was purged: the new record starts
/// at token 1 again, so the attempt's lease from the first lifetime fences like the new
/// one. A checkpoint through that older copy keeps the record one retention past the
/// lease end the record holds, not the copy's, so its step survives a release.
pub(crate) async fn a_checkpoint_keeps_the_record_past_its_own_lease_end(
    store: &dyn Store,
    caps: &Capabilities,
) {
    let k = key("lifetimes", "older-copy");
    let attempt = AttemptId::random();
    let (first, _, _) = claimed(store, &request(&k, "a", ZERO, ZERO).with_attempt(attempt)).await;
    let_time_pass(caps, PAUSE).await;
    if store.expiry() != Expiry::Vanishes {
        assert_eq!(ok(store.purge_expired(1000).await, "purge"), 1);
    }
    let (second, _, _) = claimed(store, &request(&k, "a", HOUR, ZERO).with_attempt(attempt)).await;
    assert_eq!(
        (first.token, second.token),
        (1, 1),
        "a purged record's next lifetime starts at token 1 again"
    );
    let step = StepName::new("debit").expect("valid");
    assert_eq!(
        ok(store.checkpoint(&first, &step, b"1").await, "checkpoint"),
        WriteOutcome::Applied,
        "the same token and attempt fence alike, whichever copy of the lease carries them"
    );
    let record = get_some(store, &k).await;
    assert!(
        record.expires_at >= record.lease_until,
        "the checkpoint keeps the record one retention (zero) past the record's own lease \
         end {:?}, not the older copy's {:?}: it expires at {:?}",
        record.lease_until,
        first.lease_until,
        record.expires_at
    );
    assert_eq!(
        ok(store.release(&second).await, "release"),
        WriteOutcome::Applied
    );
    match claim(store, &request(&k, "a", HOUR, HOUR)).await {
        ClaimOutcome::Claimed {
            resumed: true,
            steps,
            ..
        } => assert_eq!(steps.get("debit").map(Vec::as_slice), Some(&b"1"[..])),
        other => panic!(
            "a released record with a step is taken over with it; the store answered {other:?}"
        ),
    }
}

pub(crate) async fn extreme_durations_work(store: &dyn Store, caps: &Capabilities) {
    let durations = [
        ("zero", ZERO),
        ("1 ms", Duration::from_millis(1)),
        ("MAX_DURATION", MAX_DURATION),
        ("Duration::MAX", Duration::MAX),
    ];
    let long = |d: Duration| d >= MAX_DURATION;
    let mut leases = Vec::new();
    for (i, (lease_name, lease)) in durations.iter().enumerate() {
        for (j, (retention_name, retention)) in durations.iter().enumerate() {
            let what = format!("lease {lease_name}, retention {retention_name}");
            let k = key("durations", &format!("{i}-{j}"));
            let granted = match store.claim(&request(&k, "a", *lease, *retention)).await {
                Ok(ClaimOutcome::Claimed { lease, .. }) => lease,
                Ok(other) => panic!("{what}: expected Claimed, the store answered {other:?}"),
                Err(err) => panic!("{what}: the store failed: {err}"),
            };
            assert_eq!(
                granted
                    .lease_until
                    .saturating_duration_since(granted.created_at),
                Duration::from_millis(duration_millis(*lease)),
                "{what}: the lease runs exactly its (clamped) length"
            );
            if long(*retention) {
                let record = get_some(store, &k).await;
                assert_eq!(
                    record
                        .expires_at
                        .saturating_duration_since(record.created_at),
                    Duration::from_millis(duration_millis(*retention)),
                    "{what}: the record is kept exactly its (clamped) retention"
                );
            }
            leases.push((
                what,
                k,
                granted,
                long(*lease) || long(*retention),
                long(*lease),
            ));
        }
    }
    // Every short duration is over now.
    let_time_pass(caps, PAUSE).await;
    for (what, k, lease, present, live) in leases {
        if live {
            match ok(store.renew(&lease, Duration::MAX).await, "renew") {
                RenewOutcome::Renewed(renewed) => assert_eq!(
                    get_some(store, &k).await.lease_until,
                    renewed.lease_until,
                    "{what}: a renewal by Duration::MAX holds"
                ),
                RenewOutcome::Fenced => panic!("{what}: the owner's renewal was fenced"),
            }
        }
        if present {
            assert_eq!(
                ok(store.complete(&lease, b"r").await, "complete"),
                WriteOutcome::Applied,
                "{what}: completing a present record"
            );
        } else {
            assert_eq!(get(store, &k).await, None, "{what}: the record is absent");
        }
    }
}
