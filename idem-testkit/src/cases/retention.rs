//! Expiry, `get` and `purge_expired`.

use std::time::Duration;

use idem_core::{ClaimOutcome, Store, WriteOutcome};

use crate::Capabilities;
use crate::support::{HOUR, ZERO, claim, claimed, get, key, ok, request};

pub(crate) async fn get_hides_expired_records(store: &dyn Store, caps: &Capabilities) {
    let live = key("retention", "live");
    let gone = key("retention", "gone");
    let _ = claimed(store, &request(&live, "a", HOUR, HOUR)).await;
    let _ = claimed(store, &request(&gone, "a", HOUR, ZERO)).await;
    assert!(get(store, &live).await.is_some());
    assert_eq!(
        get(store, &gone).await,
        None,
        "a record past expires_at is hidden"
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

pub(crate) async fn purge_removes_only_expired_records(store: &dyn Store, caps: &Capabilities) {
    // Kept: unexpired records in every state.
    let in_progress = key("purge", "in_progress");
    let completed = key("purge", "completed");
    let lease_over = key("purge", "lease_over");
    let _ = claimed(store, &request(&in_progress, "a", HOUR, HOUR)).await;
    let (lease, _, _) = claimed(store, &request(&completed, "a", HOUR, HOUR)).await;
    let _ = ok(store.complete(&lease, b"r").await, "complete");
    let _ = claimed(store, &request(&lease_over, "a", ZERO, HOUR)).await;
    // Purged: expired records whose lease is over.
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

    if caps.expired_records_vanish {
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
            "the rest of the expired records"
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
            "purge removed an unexpired record"
        );
    }
    // The leased record survived the purge: its token continues on the next claim.
    let (next, _, _) = claimed(store, &request(&leased, "b", HOUR, HOUR)).await;
    assert_eq!(
        next.token,
        leased_lease.token + 1,
        "purge removed an expired record whose lease is live"
    );

    if let Some(clock) = &caps.manual_clock {
        clock.advance(2 * HOUR);
        // Now everything above has expired and no lease is live.
        assert_eq!(ok(store.purge_expired(1000).await, "purge"), 9);
    }
}
