//! Runs without a backend's flags: usage errors, a record idem did not write, a missing
//! SQLite file, a server that cannot be reached or says no, and their exit codes.

use idem_core::Key;
use idem_sqlite::SqliteStore;
use idem_testkit::{Namespace, service_url};
use serde_json::Value;

use crate::support::bare;

#[test]
fn usage_errors_exit_2_and_say_what_to_do() {
    let none = bare(&["stats"]);
    assert_eq!(none.code, 2, "{none:?}");
    assert!(none.stderr.contains("--store"), "{none:?}");
    let scheme = bare(&["stats", "--store", "mysql://127.0.0.1/db"]);
    assert_eq!(scheme.code, 2, "{scheme:?}");
    assert!(scheme.stderr.contains("sqlite://"), "{scheme:?}");
    let flag = bare(&["stats", "--store", "sqlite:///tmp/x.db", "--prefix", "p"]);
    assert_eq!(flag.code, 2, "{flag:?}");
    assert!(flag.stderr.contains("--prefix"), "{flag:?}");
    let unknown = bare(&["frobnicate"]);
    assert_eq!(unknown.code, 2, "{unknown:?}");
    let no_creds = bare(&[
        "stats",
        "--store",
        "dynamodb://idem?region=us-east-1&endpoint=http://127.0.0.1:1",
    ]);
    assert_eq!(no_creds.code, 2, "{no_creds:?}");
    assert!(
        no_creds.stderr.contains("AWS_ACCESS_KEY_ID"),
        "{no_creds:?}"
    );
    // A table name DynamoDB refuses is found from the URL alone, before credentials.
    let bad_table = bare(&["stats", "--store", "dynamodb://t?region=us-east-1"]);
    assert_eq!(bad_table.code, 2, "{bad_table:?}");
    assert!(bad_table.stderr.contains("3 to 255"), "{bad_table:?}");
}

#[test]
fn inspect_shows_a_record_that_does_not_decode_as_stored() {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("idem-cli-{}.db", Namespace::fresh().as_str()));
    let _ = std::fs::remove_file(&path);
    drop(SqliteStore::open(&path).expect("create the schema"));
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "PRAGMA ignore_check_constraints = ON;
         INSERT INTO idem_records VALUES
           ('acct_9/charge', 'hand-edited', zeroblob(32), 'paused', 1, zeroblob(16), 1, 1,
            4102444800000, x'7b7d');",
    )
    .unwrap();
    let store = format!("sqlite://{}", path.display());
    let shown = bare(&["inspect", "acct_9/charge", "hand-edited", "--store", &store]);
    assert_ne!(shown.code, 0, "{shown:?}");
    let hash = Key::new("acct_9/charge", "hand-edited")
        .unwrap()
        .short_hash();
    assert!(
        shown.stdout.contains("does not decode") && shown.stdout.contains("'paused'"),
        "{shown:?}"
    );
    assert!(shown.stdout.contains("response       2 bytes"), "{shown:?}");
    assert!(shown.stderr.contains(&format!("#{hash}")), "{shown:?}");
    let json = bare(&[
        "inspect",
        "acct_9/charge",
        "hand-edited",
        "--json",
        "--store",
        &store,
    ]);
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value["decodes"], false);
    assert_eq!(value["stored"]["state"], "'paused'");
}

/// A record at the last fencing token, its lease live and then ended: `idem release` shows
/// it and refuses it before asking (no release can pass that token), with exit 4, and
/// changes nothing; `idem delete` frees the key.
#[test]
fn release_refuses_a_record_at_the_last_token_before_asking() {
    use idem_core::Store;
    use idem_core::store::{ClaimOutcome, ClaimRequest};
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("idem-cli-{}.db", Namespace::fresh().as_str()));
    let _ = std::fs::remove_file(&path);
    let store = SqliteStore::open(&path).expect("create the schema");
    let key = Key::new("acct_9/charge", "at-the-limit").unwrap();
    let hour = std::time::Duration::from_secs(3600);
    let request = ClaimRequest::new(key, idem_core::Fingerprint::of_bytes("a"), hour, hour);
    let claimed = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(store.claim(&request))
        .unwrap();
    assert!(
        matches!(claimed, ClaimOutcome::Claimed { .. }),
        "{claimed:?}"
    );
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let max = i64::try_from(idem_core::raw::MAX_TOKEN).unwrap();
    conn.execute("UPDATE idem_records SET token = ?1", [max])
        .unwrap();
    let url = format!("sqlite://{}", path.display());
    for lease in ["live", "ended"] {
        if lease == "ended" {
            // Its lease ended long ago; its retention runs on.
            conn.execute("UPDATE idem_records SET lease_until = 1", [])
                .unwrap();
        }
        for confirmed in [&["--yes"][..], &[]] {
            let mut args = vec!["release", "acct_9/charge", "at-the-limit", "--store", &url];
            args.extend_from_slice(confirmed);
            let refused = bare(&args);
            assert_eq!(refused.code, 4, "{lease} {confirmed:?}: {refused:?}");
            let said = &refused.stderr;
            assert!(
                said.contains("the last one") && said.contains("idem delete"),
                "{refused:?}"
            );
            assert!(said.contains("can still complete it"), "{refused:?}");
            let now = match lease {
                "live" => "told it is in flight",
                _ => "refused as corrupt until its retention ends",
            };
            assert!(said.contains(now), "{lease}: {refused:?}");
            // The record is shown, its steps with it, so that the operator can decide.
            assert!(
                refused.stdout.contains(&format!("token        {max}")),
                "{refused:?}"
            );
            let asked = refused.stdout.contains("Release it?") || said.contains("Release it?");
            assert!(!asked, "refused before asking: {refused:?}");
        }
    }
    let token: i64 = conn
        .query_row("SELECT token FROM idem_records", [], |row| row.get(0))
        .unwrap();
    assert_eq!(token, max, "nothing changed");
    let shown = bare(&["inspect", "acct_9/charge", "at-the-limit", "--store", &url]);
    assert_eq!(shown.code, 0, "{shown:?}");
    assert!(shown.stdout.contains(&max.to_string()), "{shown:?}");
    // What an operator does instead, once no worker runs it: the key is free again.
    let deleted = bare(&[
        "delete",
        "acct_9/charge",
        "at-the-limit",
        "--yes",
        "--store",
        &url,
    ]);
    assert_eq!(deleted.code, 0, "{deleted:?}");
    assert!(
        deleted
            .stdout
            .contains(&format!("deleted: the record (in_progress, token {max})")),
        "{deleted:?}"
    );
    let left: i64 = conn
        .query_row("SELECT count(*) FROM idem_records", [], |row| row.get(0))
        .unwrap();
    assert_eq!(left, 0, "deleted");
}

#[test]
fn a_missing_sqlite_file_is_not_created_except_by_migrate() {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("idem-cli-{}.db", Namespace::fresh().as_str()));
    let _ = std::fs::remove_file(&path);
    let url = format!("sqlite://{}", path.display());
    let missing = bare(&["stats", "--store", &url]);
    assert_eq!(missing.code, 6, "{missing:?}");
    assert!(missing.stderr.contains("idem migrate"), "{missing:?}");
    assert!(!path.exists(), "a typo must not create a database");
    let created = bare(&["migrate", "--store", &url]);
    assert_eq!(created.code, 0, "{created:?}");
    assert!(created.stdout.starts_with("created"), "{created:?}");
    assert!(path.exists());
    let again = bare(&["migrate", "--store", &url]);
    assert!(again.stdout.starts_with("migrated"), "{again:?}");
}

#[test]
fn an_unreachable_server_exits_1_without_showing_the_password() {
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    let down = bare(&["stats", "--store", "postgres://app:hunter2@127.0.0.1:1/db"]);
    assert_eq!(down.code, 1, "{down:?}");
    assert!(down.stderr.contains("could not reach"), "{down:?}");
    assert!(!down.stderr.contains("hunter2"), "{down:?}");
}

#[test]
fn a_server_that_says_no_exits_6() {
    let Some(url) = service_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let mut wrong = url::Url::parse(&url).expect("a URL");
    wrong.set_path("/no_such_database_for_idem");
    let refused = bare(&["stats", "--store", wrong.as_str()]);
    assert_eq!(refused.code, 6, "{refused:?}");
    assert!(
        refused.stderr.contains("refused the connection"),
        "{refused:?}"
    );
    assert!(
        refused.stderr.contains("no_such_database_for_idem"),
        "{refused:?}"
    );
}
