//! The admin contract: listing, stats, an operator's release, deletion.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Admin, Key, State, StoreError, admin::Cursor, admin::ListQuery, admin::ReleaseKeyOutcome,
    key::StepName, store::ClaimOutcome, store::Expiry, store::RenewOutcome, store::WriteOutcome,
};
use tokio::sync::Barrier;

use crate::support::{HOUR, ZERO, claim, claimed, get, get_some, key, ok, request};
use crate::{Capabilities, quiet};

async fn listed(store: &dyn Admin, query: ListQuery) -> Vec<Key> {
    let page = ok(store.list(&query).await, "list");
    page.records.into_iter().map(|l| l.record.key).collect()
}

fn keys(list: &[&Key]) -> Vec<Key> {
    list.iter().map(|k| (*k).clone()).collect()
}

pub(crate) async fn list_filters_and_orders(store: &dyn Admin, caps: &Capabilities) {
    let live = key("acct_1/pay", "a-live");
    let done = key("acct_1/pay", "b-done");
    let failed = key("acct_2/pay", "c-failed");
    let ended = key("acct_1/refund", "d-lease-ended");
    let _ = claimed(store, &request(&live, "f", HOUR, HOUR)).await;
    let (lease, _, _) = claimed(store, &request(&done, "f", HOUR, HOUR)).await;
    let _ = ok(store.complete(&lease, b"ok").await, "complete");
    let (lease, _, _) = claimed(store, &request(&failed, "f", HOUR, HOUR)).await;
    let _ = ok(store.fail(&lease, b"no").await, "fail");
    let _ = claimed(store, &request(&ended, "f", ZERO, HOUR)).await;

    let page = ok(store.list(&ListQuery::new()).await, "list");
    assert_eq!(page.records.len(), 4, "every record is listed");
    assert!(page.next.is_none(), "one page holds them all");
    let order: Vec<_> = page
        .records
        .iter()
        .map(|l| (l.record.created_at, l.record.key.clone()))
        .collect();
    assert!(
        order.windows(2).all(|pair| pair[0] <= pair[1]),
        "oldest first, then by scope and key: {order:?}"
    );
    let by_state = |state| listed(store, ListQuery::new().state(state));
    assert_eq!(by_state(State::Completed).await, keys(&[&done]));
    assert_eq!(by_state(State::Failed).await, keys(&[&failed]));
    let mut in_progress = by_state(State::InProgress).await;
    in_progress.sort();
    assert_eq!(in_progress, keys(&[&live, &ended]));
    assert_eq!(
        listed(store, ListQuery::new().stuck_for(ZERO)).await,
        keys(&[&ended]),
        "stuck: in progress with an ended lease, not a live one"
    );
    assert!(
        listed(store, ListQuery::new().stuck_for(HOUR))
            .await
            .is_empty()
    );
    // Stuck work is in progress: with a state filter it is that state's stuck records.
    assert_eq!(
        listed(
            store,
            ListQuery::new().state(State::InProgress).stuck_for(ZERO)
        )
        .await,
        keys(&[&ended]),
        "stuck and in progress"
    );
    for state in [State::Completed, State::Failed] {
        assert!(
            listed(store, ListQuery::new().state(state).stuck_for(ZERO))
                .await
                .is_empty(),
            "no {state:?} record is stuck work"
        );
    }
    let mut acct_1 = listed(store, ListQuery::new().scope_prefix("acct_1/")).await;
    acct_1.sort();
    assert_eq!(acct_1, keys(&[&live, &done, &ended]));
    assert_eq!(
        listed(store, ListQuery::new().scope_prefix("acct_2")).await,
        keys(&[&failed])
    );
    assert!(
        listed(store, ListQuery::new().scope_prefix("zzz"))
            .await
            .is_empty()
    );
    assert_eq!(
        listed(
            store,
            ListQuery::new()
                .state(State::InProgress)
                .scope_prefix("acct_1/pay")
        )
        .await,
        keys(&[&live]),
        "filters combine"
    );
    if let Some(clock) = &caps.manual_clock {
        clock.advance(HOUR / 2);
        assert_eq!(
            listed(store, ListQuery::new().stuck_for(HOUR / 2)).await,
            keys(&[&ended]),
            "stuck for half an hour: the lease that ended at its claim, not the live one"
        );
        clock.advance(HOUR);
        assert!(
            listed(store, ListQuery::new().stuck_for(ZERO))
                .await
                .is_empty(),
            "past their retention, in-progress records are absent, not stuck"
        );
    }
    // Stuck work under a scope prefix, a page at a time: the filters and the cursor combine.
    let stuck: Vec<Key> = (0..3)
        .map(|i| key("acct_3/refund", &format!("e-ended-{i}")))
        .collect();
    for k in &stuck {
        let _ = claimed(store, &request(k, "f", ZERO, HOUR)).await;
    }
    let _ = claimed(
        store,
        &request(&key("acct_3/refund", "f-live"), "f", HOUR, HOUR),
    )
    .await;
    let _ = claimed(
        store,
        &request(&key("acct_4/refund", "g-ended"), "f", ZERO, HOUR),
    )
    .await;
    let mut query = ListQuery::new()
        .stuck_for(ZERO)
        .scope_prefix("acct_3/")
        .limit(2);
    let mut walked = Vec::new();
    for _ in 0..4 {
        let page = ok(store.list(&query).await, "list");
        assert!(page.records.len() <= 2, "a page holds at most its limit");
        walked.extend(page.records.into_iter().map(|l| l.record.key));
        match page.next {
            Some(next) => query = query.after(next),
            None => break,
        }
    }
    // As a set: the order of pages is `list_pages_through_every_record_once`'s to check,
    // and on a real clock a step back between the claims would reorder them.
    assert_eq!(
        walked.len(),
        stuck.len(),
        "each stuck record once: {walked:?}"
    );
    assert_eq!(
        walked.into_iter().collect::<HashSet<_>>(),
        stuck.into_iter().collect::<HashSet<_>>(),
        "stuck work under the prefix, page after page"
    );
}

pub(crate) async fn list_pages_through_every_record_once(store: &dyn Admin) {
    let mut expected = HashSet::new();
    // Named in the reverse of their creation order: a cursor that pairs one record's
    // position with a neighbour's key then skips or repeats a record, where names in
    // creation order would hide it.
    for i in 0..25 {
        let k = key("pages", &format!("k{:02}", 24 - i));
        let _ = claimed(store, &request(&k, "f", HOUR, HOUR)).await;
        expected.insert(k);
    }
    let mut seen = Vec::new();
    let mut query = ListQuery::new().limit(7);
    let mut pages = 0;
    loop {
        let page = ok(store.list(&query).await, "list");
        pages += 1;
        assert!(page.records.len() <= 7, "a page holds at most its limit");
        assert!(pages <= 10, "the walk ends");
        seen.extend(
            page.records
                .into_iter()
                .map(|l| (l.record.created_at, l.record.key)),
        );
        if pages == 1 {
            // Records added during the walk.
            for i in 0..3 {
                let k = key("pages", &format!("late{i}"));
                let _ = claimed(store, &request(&k, "f", HOUR, HOUR)).await;
            }
        }
        match page.next {
            Some(next) => query = query.after(next),
            None => break,
        }
    }
    assert!(
        seen.windows(2).all(|pair| pair[0].0 <= pair[1].0),
        "pages continue in order of creation"
    );
    let walked_order: Vec<Key> = seen
        .iter()
        .map(|(_, k)| k.clone())
        .filter(|k| expected.contains(k))
        .collect();
    let walked = seen.len();
    let seen: HashSet<Key> = seen.into_iter().map(|(_, k)| k).collect();
    assert_eq!(seen.len(), walked, "no record is listed twice");
    assert!(
        expected.is_subset(&seen),
        "every record that existed when the walk began was listed"
    );
    // Pages joined are one listing cut in pieces: the same records in the store's own
    // order, ties within the store's clock precision included.
    let all = listed(store, ListQuery::new().scope_prefix("pages").limit(100)).await;
    let whole_order: Vec<Key> = all
        .iter()
        .filter(|k| expected.contains(k))
        .cloned()
        .collect();
    assert_eq!(
        walked_order, whole_order,
        "the pages joined list the records in the order of one listing"
    );
    // The last page says it is the last, also when it is exactly full: a cursor there
    // would send a walker for an empty page, and one missing a page early ends the walk.
    let full = ok(
        store
            .list(&ListQuery::new().scope_prefix("pages").limit(all.len()))
            .await,
        "list",
    );
    assert_eq!(
        full.records.len(),
        all.len(),
        "a page holds up to its limit"
    );
    assert!(
        full.next.is_none(),
        "a page holding the last of {} records at its limit of {} has a next cursor; it must have none",
        all.len(),
        all.len()
    );
    let short = ok(
        store
            .list(&ListQuery::new().scope_prefix("pages").limit(all.len() - 1))
            .await,
        "list",
    );
    assert!(
        short.next.is_some(),
        "a page of {} leaving one of {} records out has no next cursor",
        all.len() - 1,
        all.len()
    );
    // A cursor the store did not print is bad input: a typed error, not a guess.
    for foreign in ["not a cursor", "zz", "3a"] {
        let answer = store
            .list(&ListQuery::new().after(Cursor::new(foreign)))
            .await;
        assert!(
            matches!(answer, Err(StoreError::InvalidCursor)),
            "list after the foreign cursor {foreign:?} answered {answer:?}, not InvalidCursor"
        );
    }
}

pub(crate) async fn list_leaves_responses_out_unless_asked(store: &dyn Admin) {
    let k = key("responses", "k");
    let (lease, _, _) = claimed(store, &request(&k, "f", HOUR, HOUR)).await;
    let body = vec![7u8; 300];
    let _ = ok(store.complete(&lease, &body).await, "complete");
    let find = |page: idem_core::admin::Page| {
        page.records
            .into_iter()
            .find(|l| l.record.key == k)
            .expect("the record is listed")
    };
    let listed = find(ok(store.list(&ListQuery::new()).await, "list"));
    assert_eq!(listed.record.response, None, "no body unless asked");
    assert_eq!(listed.response_len, Some(300), "its length always");
    let listed = find(ok(
        store.list(&ListQuery::new().with_responses(true)).await,
        "list",
    ));
    assert_eq!(listed.record.response.as_deref(), Some(&body[..]));
    assert_eq!(listed.response_len, Some(300));
}

pub(crate) async fn stats_count_what_the_store_holds(store: &dyn Admin, caps: &Capabilities) {
    let vanishes = store.expiry() == Expiry::Vanishes;
    // A finished record older than every in-progress one, so that an oldest in-progress
    // age that counted finished records would show.
    let (lease, _, _) = claimed(store, &request(&key("s4", "done-early"), "f", HOUR, HOUR)).await;
    let finished_created = lease.created_at;
    let _ = ok(store.complete(&lease, b"r").await, "complete");
    crate::support::let_time_pass(caps, Duration::from_millis(10)).await;
    // Absent in-progress records next, so that an oldest in-progress age that counted
    // them would show.
    let mut absent_created = None;
    for i in 0..2 {
        let (lease, _, _) = claimed(
            store,
            &request(&key("s3", &format!("absent{i}")), "f", ZERO, ZERO),
        )
        .await;
        absent_created = Some(lease.created_at);
    }
    crate::support::let_time_pass(caps, Duration::from_millis(10)).await;
    for i in 0..2 {
        let _ = claimed(
            store,
            &request(&key("s1", &format!("live{i}")), "f", HOUR, HOUR),
        )
        .await;
    }
    let _ = claimed(store, &request(&key("s2", "ended"), "f", ZERO, HOUR)).await;
    for i in 0..3 {
        let (lease, _, _) = claimed(
            store,
            &request(&key("s1", &format!("done{i}")), "f", HOUR, HOUR),
        )
        .await;
        let _ = ok(store.complete(&lease, b"r").await, "complete");
    }
    let (lease, _, _) = claimed(store, &request(&key("s3", "failed"), "f", HOUR, HOUR)).await;
    let _ = ok(store.fail(&lease, b"e").await, "fail");
    // Results stored after their leases ended: a finished record whose lease is over is
    // not abandoned work (two of them, against the one abandoned record).
    for i in 0..2 {
        let k = key("s4", &format!("done-late{i}"));
        let (lease, _, _) = claimed(store, &request(&k, "f", ZERO, HOUR)).await;
        let _ = ok(store.complete(&lease, b"r").await, "complete");
    }
    // A result with no retention, under a lease still running: absent at once, however
    // long the lease was.
    let (lease, _, _) = claimed(store, &request(&key("s4", "done-gone"), "f", HOUR, ZERO)).await;
    let _ = ok(store.complete(&lease, b"r").await, "complete");
    let stats = ok(store.stats(2).await, "stats");
    let absent = if vanishes { 0 } else { 2 };
    let gone = if vanishes { 0 } else { 1 };
    assert_eq!(stats.total, 10 + absent + gone);
    assert_eq!(stats.in_progress, 3 + absent);
    assert_eq!(stats.completed, 6 + gone);
    assert_eq!(stats.failed, 1);
    assert_eq!(stats.in_progress_live, 2);
    assert_eq!(
        stats.in_progress_lease_ended, 1,
        "abandoned: the ended lease within its retention, not the absent records"
    );
    assert_eq!(
        stats.absent,
        absent + gone,
        "absent records not yet purged, the finished one past its retention among them"
    );
    assert_eq!(
        stats.top_scopes.first(),
        Some(&("s1".to_string(), 5)),
        "the largest scope first: {:?}",
        stats.top_scopes
    );
    assert_eq!(stats.top_scopes.len(), 2);
    assert!(
        stats.oldest_in_progress > absent_created,
        "the oldest in-progress record is a present one, not an absent one: {:?} against {:?}",
        stats.oldest_in_progress,
        absent_created
    );
    assert!(
        stats.oldest_in_progress > Some(finished_created),
        "the oldest in-progress record is in progress, not a finished one: {:?} against {:?}",
        stats.oldest_in_progress,
        finished_created
    );
    let age = stats
        .oldest_in_progress_age()
        .expect("records are in progress");
    assert!(age < HOUR, "{age:?}");
    if let Some(clock) = &caps.manual_clock {
        clock.advance(HOUR / 2);
        let later = ok(store.stats(2).await, "stats");
        assert!(later.oldest_in_progress_age().unwrap() >= HOUR / 2);
    }
}

pub(crate) async fn release_key_fences_the_owner(store: &dyn Admin) {
    let k = key("release", "k");
    let (owner, _, _) = claimed(store, &request(&k, "f", HOUR, HOUR)).await;
    let step = StepName::new("debit").expect("valid");
    let _ = ok(store.checkpoint(&owner, &step, b"1").await, "checkpoint");
    assert_eq!(
        ok(store.release_key(&k).await, "release_key"),
        ReleaseKeyOutcome::Released {
            token: owner.token + 1
        }
    );
    // The attempt that held the key can no longer write.
    for (op, outcome) in [
        (
            "complete",
            ok(store.complete(&owner, b"late").await, "complete"),
        ),
        ("fail", ok(store.fail(&owner, b"late").await, "fail")),
        ("release", ok(store.release(&owner).await, "release")),
        (
            "checkpoint",
            ok(store.checkpoint(&owner, &step, b"2").await, "checkpoint"),
        ),
    ] {
        assert_eq!(outcome, WriteOutcome::Fenced, "{op} by the released owner");
    }
    assert_eq!(
        ok(store.renew(&owner, HOUR).await, "renew"),
        RenewOutcome::Fenced
    );
    // The next retry takes over at once, resuming through the steps.
    let (next, resumed, steps) = claimed(store, &request(&k, "f", HOUR, HOUR)).await;
    assert!(resumed, "the next claim is a takeover");
    assert_eq!(next.token, owner.token + 2);
    assert_eq!(steps.get("debit").map(Vec::as_slice), Some(&b"1"[..]));
    let _ = ok(store.complete(&next, b"done").await, "complete");
    let before = ok(store.get(&k).await, "get");
    assert_eq!(
        ok(store.release_key(&k).await, "release_key"),
        ReleaseKeyOutcome::Finished(State::Completed),
        "a completed record is refused"
    );
    assert_eq!(
        ok(store.get(&k).await, "get"),
        before,
        "a refused release changes nothing in the record"
    );
    assert_eq!(
        ok(
            store.release_key(&key("release", "never")).await,
            "release_key"
        ),
        ReleaseKeyOutcome::NotFound
    );
    assert_eq!(
        claim(store, &request(&k, "f", HOUR, HOUR)).await,
        ClaimOutcome::replay(b"done".to_vec())
    );
}

pub(crate) async fn release_key_races_the_owners_complete(store: Arc<dyn Admin>) {
    for i in 0..20 {
        let k = key("race", &format!("k{i}"));
        let (owner, _, _) = claimed(store.as_ref(), &request(&k, "f", HOUR, HOUR)).await;
        let barrier = Arc::new(Barrier::new(2));
        // Which task is spawned first alternates, so either may win.
        let release_first = i % 2 == 0;
        let releasing_early = release_first.then(|| {
            let (store, barrier, k) = (Arc::clone(&store), Arc::clone(&barrier), k.clone());
            quiet::spawn(async move {
                barrier.wait().await;
                store.release_key(&k).await
            })
        });
        let completing = {
            let (store, barrier, owner) = (Arc::clone(&store), Arc::clone(&barrier), owner.clone());
            quiet::spawn(async move {
                barrier.wait().await;
                store.complete(&owner, b"owner").await
            })
        };
        let releasing = releasing_early.unwrap_or_else(|| {
            let (store, barrier, k) = (Arc::clone(&store), Arc::clone(&barrier), k.clone());
            quiet::spawn(async move {
                barrier.wait().await;
                store.release_key(&k).await
            })
        });
        let completed = ok(completing.await.expect("no panic"), "complete");
        let released = ok(releasing.await.expect("no panic"), "release_key");
        let winner: &[u8] = match (completed, released) {
            (WriteOutcome::Applied, ReleaseKeyOutcome::Finished(State::Completed)) => b"owner",
            (WriteOutcome::Fenced, ReleaseKeyOutcome::Released { .. }) => {
                let (next, resumed, _) =
                    claimed(store.as_ref(), &request(&k, "f", HOUR, HOUR)).await;
                assert!(resumed);
                let _ = ok(store.complete(&next, b"retry").await, "complete");
                b"retry"
            }
            other => panic!("key {i}: both or neither won the race: {other:?}"),
        };
        assert_eq!(
            claim(store.as_ref(), &request(&k, "f", HOUR, HOUR)).await,
            ClaimOutcome::replay(winner.to_vec()),
            "key {i}: exactly one result is stored"
        );
    }
}

pub(crate) async fn delete_removes_one_record(store: &dyn Admin) {
    let held = key("delete", "held");
    let kept = key("delete", "kept");
    let (owner, _, _) = claimed(store, &request(&held, "f", HOUR, HOUR)).await;
    let (lease, _, _) = claimed(store, &request(&kept, "f", HOUR, HOUR)).await;
    let _ = ok(store.complete(&lease, b"kept").await, "complete");
    assert!(
        ok(store.delete(&held).await, "delete"),
        "there was a record"
    );
    assert_eq!(get(store, &held).await, None);
    assert_eq!(
        ok(store.complete(&owner, b"late").await, "complete"),
        WriteOutcome::Fenced,
        "the owner of a deleted record is fenced"
    );
    let (fresh, resumed, _) = claimed(store, &request(&held, "other", HOUR, HOUR)).await;
    assert!(!resumed && fresh.token == 1, "a new lifetime");
    assert!(!ok(store.delete(&key("delete", "never")).await, "delete"));
    assert_eq!(
        get_some(store, &kept).await.response.as_deref(),
        Some(&b"kept"[..])
    );
}

pub(crate) async fn raw_shows_what_is_stored(store: &dyn Admin) {
    let done = key("raw", "done");
    let (lease, _, _) = claimed(store, &request(&done, "f", HOUR, HOUR)).await;
    let step = idem_core::key::StepName::new("charge").expect("a valid step name");
    let _ = ok(store.checkpoint(&lease, &step, b"ch_1").await, "checkpoint");
    let _ = ok(store.complete(&lease, b"secret receipt").await, "complete");
    // Records beside it, in its scope and under its key in another scope, with steps of
    // their own: the raw view shows this record's steps only (by name, or as a count).
    for (k, name) in [
        (key("raw", "other"), "refund"),
        (key("raw2", "done"), "notify"),
    ] {
        let (lease, _, _) = claimed(store, &request(&k, "f", HOUR, HOUR)).await;
        let step = idem_core::key::StepName::new(name).expect("a valid step name");
        let _ = ok(store.checkpoint(&lease, &step, b"x").await, "checkpoint");
    }
    let fields = ok(store.raw(&done).await, "raw").expect("a stored record shows");
    let text = format!("{fields:?}");
    assert!(
        !text.contains("refund") && !text.contains("notify"),
        "another record's steps do not: {text}"
    );
    assert!(text.contains("completed"), "the state shows: {text}");
    assert!(text.contains("14"), "the response's length shows: {text}");
    assert!(
        !text.contains("secret receipt"),
        "the response itself does not: {text}"
    );
    assert_eq!(
        ok(store.raw(&key("raw", "never")).await, "raw"),
        None,
        "nothing stored, nothing shown"
    );
}

pub(crate) async fn admin_reaches_only_its_namespace(short: &dyn Admin, long: &dyn Admin) {
    let only_long = key("ns", "long-only");
    let shared = key("ns", "both");
    let _ = claimed(long, &request(&only_long, "f", HOUR, HOUR)).await;
    let _ = claimed(long, &request(&shared, "f", HOUR, HOUR)).await;
    let _ = claimed(short, &request(&shared, "f", HOUR, HOUR)).await;
    assert_eq!(listed(short, ListQuery::new()).await, keys(&[&shared]));
    assert_eq!(listed(long, ListQuery::new()).await.len(), 2);
    assert_eq!(ok(short.stats(10).await, "stats").total, 1);
    assert_eq!(ok(long.stats(10).await, "stats").total, 2);
    assert_eq!(
        ok(short.release_key(&only_long).await, "release_key"),
        ReleaseKeyOutcome::NotFound
    );
    assert!(!ok(short.delete(&only_long).await, "delete"));
    assert!(ok(short.delete(&shared).await, "delete"));
    assert_eq!(
        get_some(long, &shared).await.token,
        1,
        "the other namespace's record stays"
    );
    assert!(get(long, &only_long).await.is_some());
}
