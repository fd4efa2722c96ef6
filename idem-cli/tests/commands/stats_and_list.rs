//! `idem migrate`, `idem stats` and `idem list` on every backend.

use idem_core::Key;

use crate::support::{Backend, LONG};

pub(crate) fn migrate_then_stats_count_by_state(backend: Backend) {
    // Twice: migrating is idempotent.
    backend.ok(&["migrate"]);
    backend.ok(&["migrate"]);
    let empty = backend.ok(&["stats", "--json"]).json();
    assert_eq!(empty["total"], 0, "{empty}");

    backend.seed();
    let stats = backend.ok(&["stats", "--json"]).json();
    assert_eq!(stats["total"], 5, "{stats}");
    assert_eq!(stats["completed"], 2, "{stats}");
    assert_eq!(stats["failed"], 1, "{stats}");
    assert_eq!(stats["in_progress"], 2, "{stats}");
    assert_eq!(stats["in_progress_live"], 1, "{stats}");
    assert_eq!(stats["in_progress_lease_ended"], 1, "{stats}");
    assert_eq!(stats["expired_not_deleted"], 0, "{stats}");
    assert_eq!(stats["top_scopes"][0]["scope"], "acct_1/charge", "{stats}");
    assert_eq!(stats["top_scopes"][0]["records"], 3, "{stats}");
    assert!(stats["oldest_in_progress_age_seconds"].as_f64().unwrap() >= 0.0);

    let text = backend.ok(&["stats"]).stdout;
    assert!(text.contains("lease live 1, lease ended 1"), "{text}");
    let prometheus = backend.ok(&["stats", "--prometheus", "--top", "1"]).stdout;
    // The scope's short hash, never the scope, is its label; `idem stats` shows both.
    let hash = idem_core::key::scope_short_hash("acct_1/charge").to_string();
    assert!(text.contains(&format!("{hash}  acct_1/charge")), "{text}");
    assert!(
        !prometheus.contains("acct_1"),
        "a raw scope in a label: {prometheus}"
    );
    let scope_line = format!("idem_store_scope_records{{scope=\"{hash}\"}} 3");
    for line in [
        "idem_store_records{state=\"completed\"} 2",
        "idem_store_records{state=\"in_progress\"} 2",
        "idem_store_in_progress_records{lease=\"ended\"} 1",
        "idem_store_expired_records 0",
        scope_line.as_str(),
    ] {
        assert!(
            prometheus.lines().any(|l| l == line),
            "{line} in {prometheus}"
        );
    }
    let raw = backend
        .ok(&["stats", "--prometheus", "--raw-scope-labels", "--top", "1"])
        .stdout;
    assert!(
        raw.lines()
            .any(|l| l == "idem_store_scope_records{scope=\"acct_1/charge\"} 3"),
        "{raw}"
    );
    assert!(!raw.contains("acct_2"), "--top 1: {raw}");
}

pub(crate) fn list_filters_pages_and_hides_keys(backend: Backend) {
    backend.seed();
    for n in 0..5 {
        backend.completed("acct_4/charge", &format!("secret-{n}"), LONG, "{}");
    }
    // Every record exactly once through the cursors, keys hidden.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let mut args = vec!["list", "--json", "--limit", "3"];
        if let Some(cursor) = &cursor {
            args.extend(["--cursor", cursor.as_str()]);
        }
        let page = backend.ok(&args);
        assert!(
            !page.stdout.contains("secret-"),
            "keys hidden: {}",
            page.stdout
        );
        let json = page.json();
        for record in json["records"].as_array().unwrap() {
            seen.push(record["key_hash"].as_str().unwrap().to_owned());
        }
        match json["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let count = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!((count, seen.len()), (10, 10));

    let stuck = backend
        .ok(&["list", "--stuck", "0s", "--json", "--show-keys"])
        .json();
    let stuck = stuck["records"].as_array().unwrap();
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert_eq!(stuck[0]["key"], "secret-stuck");
    assert_eq!(stuck[0]["lease_live"], false);
    // Stuck for an hour: nothing yet.
    let none = backend.ok(&["list", "--stuck", "1h"]);
    assert!(none.stdout.contains("no records match"), "{none:?}");

    let failed = backend
        .ok(&["list", "--state", "failed", "--show-keys"])
        .stdout;
    assert!(
        failed.contains("secret-f") && failed.contains("acct_2/refund"),
        "{failed}"
    );
    assert_eq!(failed.lines().count(), 2, "a header and one row: {failed}");

    let scoped = backend
        .ok(&["list", "--scope-prefix", "acct_3/", "--json"])
        .json();
    assert_eq!(scoped["records"].as_array().unwrap().len(), 1, "{scoped}");
    assert!(scoped["records"][0].get("key").is_none(), "{scoped}");
    assert!(
        scoped["records"][0].get("response_base64").is_none(),
        "{scoped}"
    );

    let table = backend.ok(&["list", "--limit", "2"]).stdout;
    let hash = Key::new("acct_1/charge", "secret-a").unwrap().short_hash();
    assert!(table.contains(&format!("#{hash}")), "{table}");
    assert!(
        table.contains("more records follow: add --cursor "),
        "{table}"
    );

    // Under the service's log hash secret the hashes change, so they match its logs.
    let keyed = backend
        .ok(&[
            "list",
            "--limit",
            "2",
            "--log-hash-secret",
            "0123456789abcdef-secret",
        ])
        .stdout;
    assert!(!keyed.contains(&format!("#{hash}")), "{keyed}");
    assert_eq!(keyed.lines().count(), table.lines().count(), "{keyed}");
    let short = backend.idem(&["list", "--log-hash-secret", "short"]);
    assert_eq!(short.code, 2, "{short:?}");
    assert!(short.stderr.contains("at least 16"), "{short:?}");

    let bad = backend.idem(&["list", "--cursor", "not-a-cursor"]);
    assert_eq!(bad.code, 2, "{bad:?}");
}
