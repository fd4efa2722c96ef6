//! The ends of leases and records, where `<` and `<=` differ: a lease is live while
//! `now < lease_until`, a record is expired once `now >= expires_at`.

use std::time::{Duration, Instant};

use idem_core::{
    Clock, ManualClock, Store, record::Lease, store::ClaimOutcome, store::Expiry,
    store::RenewOutcome, store::WriteOutcome,
};

use crate::Capabilities;
use crate::support::{HOUR, ZERO, claim, claimed, get, get_some, key, notice, ok, request};

const MS: Duration = Duration::from_millis(1);

/// Zero-length probes per run on a server's clock: most land in the millisecond their
/// record was written in, the one instant where `<` and `<=` answer differently.
const ZERO_PROBES: usize = 20;
/// A lease, renewal and retention short enough to wait out, long enough that two round
/// trips usually fit inside them.
const SHORT: Duration = Duration::from_millis(25);
const RENEWAL: Duration = Duration::from_millis(50);
/// What a store's clock may lag the suite's measurement by: whole milliseconds on both
/// reads, and scheduling.
const MARGIN: Duration = Duration::from_millis(5);
/// Fresh keys tried until a short lease is seen both live and over.
const SHORT_TRIES: usize = 10;

pub(crate) async fn lease_and_expiry_end_exactly(store: &dyn Store, caps: &Capabilities) {
    match &caps.manual_clock {
        // Before the zero probes, whose absent records purge would count.
        Some(clock) => to_the_millisecond(store, clock).await,
        None => {
            let mut conclusive = false;
            for attempt in 0..SHORT_TRIES {
                if short_spans_on_the_store_clock(store, attempt).await {
                    conclusive = true;
                    break;
                }
            }
            if !conclusive {
                // The other side (over once waited out) was checked on every try.
                notice(
                    "lease_and_expiry_end_exactly",
                    &format!(
                        "in {SHORT_TRIES} tries the round trips never all fit inside a \
                         {SHORT:?} span, so the live side of short spans went partly unchecked"
                    ),
                );
            }
        }
    }
    zero_lengths_are_over_at_once(store).await;
}

/// A zero lease is over, and a zero retention expired, at the instant they are granted.
async fn zero_lengths_are_over_at_once(store: &dyn Store) {
    let vanishes = store.expiry() == Expiry::Vanishes;
    for i in 0..ZERO_PROBES {
        let k = key("edges", &format!("zero-lease-{i}"));
        let (first, _, _) = claimed(store, &request(&k, "a", ZERO, HOUR)).await;
        match claim(store, &request(&k, "a", HOUR, HOUR)).await {
            ClaimOutcome::Claimed { lease, resumed, .. } => assert!(
                resumed && lease.token == first.token + 1,
                "probe {i}: a zero lease is over at once: a takeover, got token {} (resumed \
                 {resumed})",
                lease.token
            ),
            other => panic!(
                "probe {i}: at now == lease_until the lease is over and a claim takes over; \
                 the store answered {other:?}"
            ),
        }

        let k = key("edges", &format!("zero-retention-{i}"));
        let (first, _, _) = claimed(store, &request(&k, "a", ZERO, ZERO)).await;
        assert_eq!(
            get(store, &k).await,
            None,
            "probe {i}: at now == expires_at (and no live lease) the record is absent"
        );
        match claim(store, &request(&k, "b", HOUR, HOUR)).await {
            ClaimOutcome::Claimed { lease, resumed, .. } => assert!(
                !resumed && lease.token == if vanishes { 1 } else { first.token + 1 },
                "probe {i}: an expired record is claimed afresh, got token {} (resumed \
                 {resumed})",
                lease.token
            ),
            other => panic!(
                "probe {i}: at now == expires_at the record is expired: a claim with another \
                 fingerprint is a fresh claim, the store answered {other:?}"
            ),
        }
    }
}

/// A claim of `k` that must be in flight with exactly `left` of the lease to go.
async fn in_flight_for(store: &dyn Store, k: &idem_core::Key, left: Duration, when: &str) {
    match claim(store, &request(k, "a", HOUR, HOUR)).await {
        ClaimOutcome::InFlight { retry_after, .. } => assert_eq!(
            retry_after, left,
            "{when}: in flight for exactly the rest of the lease"
        ),
        other => panic!("{when}: the lease is live, the claim must be InFlight; got {other:?}"),
    }
}

/// On a clock the suite moves: one millisecond before each end, and at it.
async fn to_the_millisecond(store: &dyn Store, clock: &ManualClock) {
    // An expired record that a live lease holds, until the very millisecond it ends. First
    // in the store, so that purge counts only it.
    let k = key("edges", "held");
    let _ = claimed(store, &request(&k, "a", 10 * MS, 5 * MS)).await;
    clock.advance(5 * MS);
    in_flight_for(store, &k, 5 * MS, "expired, lease 5 ms from its end").await;
    clock.advance(4 * MS);
    in_flight_for(store, &k, MS, "expired, lease 1 ms from its end").await;
    assert!(
        get(store, &k).await.is_some(),
        "a live lease keeps it present"
    );
    assert_eq!(
        ok(store.purge_expired(1000).await, "purge"),
        0,
        "purge spares an expired record while its lease lives"
    );
    clock.advance(MS);
    assert_eq!(
        get(store, &k).await,
        None,
        "at now == lease_until an expired record is absent"
    );
    if store.expiry() != Expiry::Vanishes {
        assert_eq!(
            ok(store.purge_expired(1000).await, "purge"),
            1,
            "at now == lease_until purge removes the expired record"
        );
    }
    let (again, resumed, _) = claimed(store, &request(&k, "b", HOUR, HOUR)).await;
    assert!(!resumed && again.token == 1, "claimed afresh once purged");

    // A lease: live 1 ms before its end, over at it.
    let k = key("edges", "lease");
    let (old, _, _) = claimed(store, &request(&k, "a", 10 * MS, HOUR)).await;
    clock.advance(9 * MS);
    in_flight_for(store, &k, MS, "1 ms before lease_until").await;
    clock.advance(MS);
    let (taken, resumed, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert!(
        resumed && taken.token == old.token + 1,
        "at now == lease_until the claim takes over"
    );

    // A renewal (here to a shorter lease): the same, from the moment it was granted.
    let renewed = match ok(store.renew(&taken, 10 * MS).await, "renew") {
        RenewOutcome::Renewed(renewed) => renewed,
        RenewOutcome::Fenced => panic!("the owner's renewal was fenced"),
    };
    assert_eq!(
        renewed.lease_until,
        clock.now().saturating_add(10 * MS),
        "a renewal ends exactly `extend` from now"
    );
    clock.advance(9 * MS);
    in_flight_for(store, &k, MS, "1 ms before a renewed lease ends").await;
    clock.advance(MS);
    let (next, resumed, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert!(
        resumed && next.token == taken.token + 1,
        "at the renewed lease's end the claim takes over"
    );

    // A finished record: replayed 1 ms before its expiry, absent at it.
    let k = key("edges", "expiry");
    let (lease, _, _) = claimed(store, &request(&k, "a", ZERO, 10 * MS)).await;
    assert_eq!(
        ok(store.complete(&lease, b"r").await, "complete"),
        WriteOutcome::Applied
    );
    // Read from the record, so that this holds however a result's retention is counted.
    let expires_at = get_some(store, &k).await.expires_at;
    let left = expires_at.saturating_duration_since(clock.now());
    assert!(
        left >= MS,
        "a 10 ms retention, completed at once, has time left"
    );
    clock.advance(left - MS);
    assert!(
        get(store, &k).await.is_some(),
        "1 ms before expires_at the record is present"
    );
    assert_eq!(
        claim(store, &request(&k, "a", HOUR, HOUR)).await,
        ClaimOutcome::replay(b"r".to_vec()),
        "1 ms before expires_at a retry replays"
    );
    clock.advance(MS);
    assert_eq!(
        get(store, &k).await,
        None,
        "at now == expires_at the record is absent"
    );
    match claim(store, &request(&k, "b", HOUR, HOUR)).await {
        ClaimOutcome::Claimed { resumed: false, .. } => {}
        other => panic!(
            "at now == expires_at a claim with another fingerprint is fresh; the store \
             answered {other:?}"
        ),
    }
}

/// A claim of `k` made right after `started`: in flight while the lease granted then
/// lasts `span`, unless the round trips took too long to tell. Answers the lease of a
/// takeover the claim made, if the lease had run out.
async fn live_unless_slow(
    store: &dyn Store,
    k: &idem_core::Key,
    started: Instant,
    span: Duration,
    what: &str,
) -> Result<(), Lease> {
    let outcome = claim(store, &request(k, "a", HOUR, HOUR)).await;
    let elapsed = started.elapsed();
    match outcome {
        ClaimOutcome::InFlight { retry_after, .. } => {
            assert!(
                retry_after <= span,
                "{what}: retry_after {retry_after:?} is more than the {span:?} granted"
            );
            Ok(())
        }
        // The store's clock cannot have moved further than the suite's did.
        ClaimOutcome::Claimed { lease, .. } if elapsed + MARGIN >= span => Err(lease),
        other => panic!(
            "{what}: a claim {elapsed:?} after a {span:?} lease was granted must be InFlight; \
             the store answered {other:?}"
        ),
    }
}

/// On the store's own clock: short spans live at once and over once waited out. Answers
/// whether the live side could be told every time.
async fn short_spans_on_the_store_clock(store: &dyn Store, attempt: usize) -> bool {
    let vanishes = store.expiry() == Expiry::Vanishes;
    let mut conclusive = true;

    // A short lease.
    let k = key("edges", &format!("short-lease-{attempt}"));
    let started = Instant::now();
    let (first, _, _) = claimed(store, &request(&k, "a", SHORT, HOUR)).await;
    let owner = match live_unless_slow(store, &k, started, SHORT, "just claimed").await {
        Ok(()) => {
            tokio::time::sleep(SHORT + MARGIN).await;
            let (taken, resumed, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
            assert!(
                resumed && taken.token == first.token + 1,
                "after the lease ended, a claim takes over"
            );
            taken
        }
        Err(taken) => {
            conclusive = false;
            taken
        }
    };

    // A renewal of a live lease to a short one: live at once, over once waited out.
    let started = Instant::now();
    match ok(store.renew(&owner, RENEWAL).await, "renew") {
        RenewOutcome::Renewed(_) => {}
        RenewOutcome::Fenced => panic!("the owner's renewal was fenced"),
    }
    match live_unless_slow(store, &k, started, RENEWAL, "just renewed").await {
        Ok(()) => {
            tokio::time::sleep(RENEWAL + MARGIN).await;
            let (next, resumed, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
            assert!(
                resumed && next.token == owner.token + 1,
                "after the renewed lease ended, a claim takes over"
            );
        }
        Err(_) => conclusive = false,
    }

    // A short retention: replayed at once, absent once waited out.
    let k = key("edges", &format!("short-retention-{attempt}"));
    let started = Instant::now();
    let (first, _, _) = claimed(store, &request(&k, "a", ZERO, SHORT)).await;
    match ok(store.complete(&first, b"r").await, "complete") {
        WriteOutcome::Applied => {}
        // The record outlived its retention before the result arrived: too slow to tell.
        WriteOutcome::Fenced if started.elapsed() + MARGIN >= SHORT => return false,
        WriteOutcome::Fenced => panic!(
            "a result stored {:?} after its record was claimed with a {SHORT:?} retention \
             was fenced",
            started.elapsed()
        ),
    }
    let outcome = claim(store, &request(&k, "a", HOUR, HOUR)).await;
    let elapsed = started.elapsed();
    match outcome {
        ClaimOutcome::Replay { response, .. } if response == b"r" => {}
        // Expired already, and claimed afresh: too slow to tell, and nothing left to wait.
        ClaimOutcome::Claimed { resumed: false, .. } if elapsed + MARGIN >= SHORT => {
            return false;
        }
        other => panic!(
            "a claim {elapsed:?} after a record with a {SHORT:?} retention was created must \
             replay it; the store answered {other:?}"
        ),
    }
    // However a result's retention is counted, it is over one retention after the result.
    tokio::time::sleep(SHORT + MARGIN).await;
    assert_eq!(get(store, &k).await, None, "after its retention, absent");
    match claim(store, &request(&k, "b", HOUR, HOUR)).await {
        ClaimOutcome::Claimed { lease, resumed, .. } => assert!(
            !resumed && lease.token == if vanishes { 1 } else { first.token + 1 },
            "after its retention, claimed afresh: token {} (resumed {resumed})",
            lease.token
        ),
        other => panic!("after its retention a record is absent; the store answered {other:?}"),
    }
    conclusive
}
