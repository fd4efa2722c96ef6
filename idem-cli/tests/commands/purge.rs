//! `idem purge` on every backend: only expired records, and no more than `--max`.

use std::time::Duration;

use crate::support::{Backend, LONG};

pub(crate) fn purge_deletes_only_expired_records(backend: Backend) {
    let short = Duration::from_millis(1);
    for n in 0..5 {
        backend.completed("acct_1/charge", &format!("old-{n}"), short, "{}");
    }
    backend.completed("acct_1/charge", "kept", LONG, "{}");
    // Retention over, but a live lease holds it: present, never purged.
    backend.claim("acct_1/charge", "held", LONG, short);
    std::thread::sleep(Duration::from_millis(50));

    let purged = backend.ok(&["purge", "--batch", "2"]);
    if backend.purges {
        assert!(
            purged.stdout.starts_with("purged 5 expired records"),
            "{purged:?}"
        );
    } else {
        assert!(purged.stdout.contains("nothing to purge"), "{purged:?}");
    }
    let stats = backend.ok(&["stats", "--json"]).json();
    assert_eq!(stats["total"], 2, "{stats}");
    assert_eq!(stats["expired_not_deleted"], 0, "{stats}");
    assert!(backend.get("acct_1/charge", "held").is_some());

    let again = backend.ok(&["purge"]);
    if backend.purges {
        assert!(again.stdout.starts_with("purged 0 "), "{again:?}");
    }
}

pub(crate) fn purge_stops_at_max(backend: Backend) {
    for n in 0..4 {
        let key = format!("old-{n}");
        backend.completed("acct_1/charge", &key, Duration::from_millis(1), "{}");
    }
    std::thread::sleep(Duration::from_millis(50));
    let purged = backend.ok(&["purge", "--max", "3", "--batch", "2"]);
    let stats = backend.ok(&["stats", "--json"]).json();
    if backend.purges {
        assert!(purged.stdout.starts_with("purged 3 "), "{purged:?}");
        assert_eq!(stats["total"], 1, "{stats}");
    } else {
        // The store deleted all four itself: the purge has nothing to stop at.
        assert!(purged.stdout.contains("nothing to purge"), "{purged:?}");
        assert_eq!(stats["total"], 0, "{stats}");
    }
}
