//! Long work and owners that stop without a word: no lease ends at the record's expiry,
//! and a lease that has ended is over for its owner (docs/DESIGN.md §2.2, "No lease ends
//! at the retention cliff").

use std::time::Duration;

use idem_core::{
    Record, Store, key::StepName, record::Lease, store::ClaimOutcome, store::RenewOutcome,
    store::WriteOutcome,
};

use crate::Capabilities;
use crate::support::{HOUR, claim, claimed, get_some, key, let_time_pass, ok, request};

/// The lease and the retention of the cliff case: equal, as the minimal case has
/// them, and short enough to wait out twice on a server's clock.
const SPAN: Duration = Duration::from_secs(1);
/// A lease that runs out while the case waits, on any server.
const SHORT: Duration = Duration::from_millis(200);

fn step(name: &str) -> StepName {
    StepName::new(name).expect("valid step name")
}

/// Checkpoints a step under `lease` (so that the release keeps the record for a
/// takeover), releases, and answers the record as released.
async fn step_and_release(store: &dyn Store, lease: &Lease) -> Record {
    assert_eq!(
        ok(
            store.checkpoint(lease, &step("s"), b"1").await,
            "checkpoint"
        ),
        WriteOutcome::Applied
    );
    assert_eq!(
        ok(store.release(lease).await, "release"),
        WriteOutcome::Applied
    );
    get_some(store, &lease.key).await
}

pub(crate) async fn no_lease_ends_at_the_retention_cliff(store: &dyn Store, caps: &Capabilities) {
    // Lease and retention equal: the work checkpoints `charge`, then stops without a word
    // (a crash, an Unknown outcome): its lease runs out exactly when the claim's retention
    // does.
    let k = key("long-work", "cliff");
    let (lease, _, _) = claimed(store, &request(&k, "a", SPAN, SPAN)).await;
    assert_eq!(
        lease.retention, SPAN,
        "the lease a claim answers carries the request's retention (Lease::with_retention)"
    );
    assert_eq!(
        ok(
            store.checkpoint(&lease, &step("charge"), b"ch_1").await,
            "checkpoint"
        ),
        WriteOutcome::Applied
    );
    let record = get_some(store, &k).await;
    assert_eq!(
        record.expires_at,
        record.lease_until.saturating_add(SPAN),
        "a checkpoint keeps the record one retention past the end of its lease \
         (expires_at = max(expires_at, lease_until + retention))"
    );

    // The lease is over, and the claim's own retention with it: the retry must find the
    // step, not a fresh record (which would charge again).
    let_time_pass(caps, SPAN).await;
    let (taken, resumed, steps) = claimed(store, &request(&k, "a", SPAN, SPAN)).await;
    assert!(
        resumed,
        "a retry after the lease ran out, within one retention of its end, takes over; the \
         store claimed afresh, so every checkpointed step would run again"
    );
    assert_eq!(steps.get("charge").map(Vec::as_slice), Some(&b"ch_1"[..]));
    assert_eq!(taken.created_at, lease.created_at, "the same lifetime");
    assert_eq!(
        get_some(store, &k).await.expires_at,
        taken.lease_until.saturating_add(SPAN),
        "a takeover keeps the record one retention past the end of its new lease"
    );

    // Renewed, the same from the renewed end.
    let renewed = match ok(store.renew(&taken, SPAN).await, "renew") {
        RenewOutcome::Renewed(renewed) => renewed,
        RenewOutcome::Fenced => panic!("the owner's renewal of its live lease was fenced"),
    };
    assert_eq!(
        get_some(store, &k).await.expires_at,
        renewed.lease_until.saturating_add(SPAN),
        "a renewal keeps the record one retention past the end of the renewed lease"
    );
    assert_eq!(
        renewed.retention, SPAN,
        "a renewal answers the lease with its retention"
    );

    // This owner stops too; the next retry still finds the step.
    let_time_pass(caps, SPAN).await;
    let (last, resumed, steps) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert!(
        resumed && steps.contains_key("charge"),
        "a retry after the renewed lease ran out takes over with the steps"
    );
    assert_eq!(last.token, taken.token + 1);
}

pub(crate) async fn an_ended_lease_is_not_renewed(store: &dyn Store, caps: &Capabilities) {
    // Released (with a step, so the record stays for a takeover): a heartbeat that was on
    // its way lands after the release.
    let k = key("long-work", "released");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    let released = step_and_release(store, &lease).await;
    assert_eq!(
        ok(store.renew(&lease, HOUR).await, "renew"),
        RenewOutcome::Fenced,
        "a renewal after its owner released must be fenced: it would hold the key a whole \
         lease for an owner that is gone"
    );
    assert_eq!(
        get_some(store, &k).await,
        released,
        "a fenced renewal changes nothing"
    );
    let (_, resumed, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert!(resumed, "the next claim takes over at once");

    // Run out, and nobody took over yet: over for its owner all the same, who must learn
    // that it has to stop.
    let k = key("long-work", "ran-out");
    let (lease, _, _) = claimed(store, &request(&k, "a", SHORT, HOUR)).await;
    let_time_pass(caps, SHORT).await;
    let before = get_some(store, &k).await;
    assert_eq!(
        ok(store.renew(&lease, HOUR).await, "renew"),
        RenewOutcome::Fenced,
        "a renewal after the lease ran out must be fenced, even before another attempt \
         took over"
    );
    assert_eq!(get_some(store, &k).await, before);
    // The owner's result still lands (nobody took over): a late result is never lost.
    assert_eq!(
        ok(store.complete(&lease, b"done").await, "complete"),
        WriteOutcome::Applied
    );
}

pub(crate) async fn a_late_claim_of_the_same_attempt_takes_nothing_over(
    store: &dyn Store,
    caps: &Capabilities,
) {
    // A claim that won, then released (with a step): a late copy of that claim (same
    // attempt id) lands afterwards.
    let k = key("long-work", "late-claim");
    let won = request(&k, "a", HOUR, HOUR);
    let (lease, _, _) = claimed(store, &won).await;
    let released = step_and_release(store, &lease).await;
    match claim(store, &won).await {
        ClaimOutcome::InFlight { retry_after, .. } => assert_eq!(
            retry_after,
            Duration::ZERO,
            "a late claim of the attempt whose lease ended is in flight with nothing left"
        ),
        other => panic!(
            "a late copy of a claim whose lease was released must take nothing over (it \
             would hold the key a whole lease for an owner that is gone); the store \
             answered {other:?}"
        ),
    }
    assert_eq!(get_some(store, &k).await, released, "and write nothing");
    let (next, resumed, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert!(
        resumed && next.token == lease.token + 1,
        "another attempt takes over"
    );

    // The same after a lease that ran out.
    let k = key("long-work", "late-claim-ran-out");
    let won = request(&k, "a", SHORT, HOUR);
    let (lease, _, _) = claimed(store, &won).await;
    let_time_pass(caps, SHORT).await;
    let before = get_some(store, &k).await;
    assert!(
        matches!(
            claim(store, &won).await,
            ClaimOutcome::InFlight { retry_after, .. } if retry_after.is_zero()
        ),
        "a late claim of the attempt whose lease ran out takes nothing over"
    );
    assert_eq!(get_some(store, &k).await, before);
    let (next, resumed, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert!(resumed && next.token == lease.token + 1);
}
