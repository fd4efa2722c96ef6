//! Two stores whose namespaces are prefixes of each other, on one backend: nothing crosses.

use idem_core::{Key, State, Store, store::ClaimOutcome, store::Expiry, store::WriteOutcome};

use crate::support::{HOUR, ZERO, claim, claimed, get, get_some, ok, request};

fn k(scope: &str, key: &str) -> Key {
    Key::new(scope, key).expect("valid key")
}

/// Pairs of keys, the first for the store whose namespace is the longer one, that meet
/// in one storage key under encodings that do not end the namespace: the first pair
/// under `<namespace><scope length>:<scope>:<key>` (`n1` + `1:x:...` = `n` + `11:x:...`),
/// the second under plain concatenation (`n1` + `s` + `k` = `n` + `1s` + `k`).
fn colliding_pairs() -> [(Key, Key); 3] {
    [
        (k("x", "y:zzzzzzz:w"), k("x:y:zzzzzzz", "w")),
        (k("s", "k"), k("1s", "k")),
        (k("same", "key"), k("same", "key")),
    ]
}

/// `short` has a namespace that is a prefix of `long`'s.
pub(crate) async fn namespaces_are_isolated(short: &dyn Store, long: &dyn Store) {
    // Records and replays: what one store completed, the other never replays.
    for (i, (in_long, in_short)) in colliding_pairs().into_iter().enumerate() {
        let (lease, _, _) = claimed(long, &request(&in_long, "same", HOUR, HOUR)).await;
        assert_eq!(
            ok(
                long.complete(&lease, b"secret of the long namespace").await,
                "complete"
            ),
            WriteOutcome::Applied
        );
        match claim(short, &request(&in_short, "same", HOUR, HOUR)).await {
            ClaimOutcome::Claimed { lease, resumed, .. } => assert!(
                lease.token == 1 && !resumed,
                "pair {i}: the other namespace's record leaked in (token {}, resumed {resumed})",
                lease.token
            ),
            ClaimOutcome::Replay { .. } => {
                panic!("pair {i}: a store replayed the response of a store in another namespace")
            }
            other => panic!("pair {i}: the other namespace's record leaked in: {other:?}"),
        }
        let mine = get_some(short, &in_short).await;
        assert_eq!((mine.state, mine.response), (State::InProgress, None));
        // And the other way round: the short store's record is not the long one's.
        assert_eq!(
            get_some(long, &in_long).await.response.as_deref(),
            Some(&b"secret of the long namespace"[..])
        );
        if in_long != in_short {
            assert_eq!(get(short, &in_long).await, None, "pair {i}");
            assert_eq!(get(long, &in_short).await, None, "pair {i}");
        }
    }

    // Purge: each store deletes exactly its own absent records.
    if short.expiry() == Expiry::Vanishes {
        assert_eq!(ok(short.purge_expired(1000).await, "purge"), 0);
        return;
    }
    for round in 0..2 {
        for i in 0..3 {
            let gone = k("purge", &format!("long-{round}-{i}"));
            let _ = claimed(long, &request(&gone, "a", ZERO, ZERO)).await;
        }
        for i in 0..2 {
            let gone = k("purge", &format!("short-{round}-{i}"));
            let _ = claimed(short, &request(&gone, "a", ZERO, ZERO)).await;
        }
        // Either order: a purge never reaches the other namespace.
        let (first, second, expected) = if round == 0 {
            (short, long, (2, 3))
        } else {
            (long, short, (3, 2))
        };
        let purged = (
            ok(first.purge_expired(1000).await, "purge"),
            ok(second.purge_expired(1000).await, "purge"),
        );
        assert_eq!(
            purged, expected,
            "round {round}: each purge deletes its own namespace's absent records only"
        );
    }
}
