//! Records idem did not write, planted in the tables by hand: never absent, never a panic,
//! always a typed error naming the key's hash.

mod common;

use std::sync::Arc;

use idem_core::{Admin, Key};
use idem_sqlite::SqliteStore;
use idem_testkit::assert_foreign_record_is_refused;

/// A record row, field by field as SQL literals, with a far expiry and a lease that ended.
struct Row {
    fingerprint: &'static str,
    state: &'static str,
    token: &'static str,
}

const GOOD: Row = Row {
    fingerprint: "zeroblob(32)",
    state: "'in_progress'",
    token: "1",
};

fn plant(path: &std::path::Path, key: &Key, row: Row, step: Option<&str>) {
    let conn = rusqlite::Connection::open(path).unwrap();
    // Older schemas and hand edits need not have kept the checks.
    conn.execute_batch("PRAGMA ignore_check_constraints = ON")
        .unwrap();
    conn.execute(
        &format!(
            "INSERT INTO idem_records (scope, key, fingerprint, state, token, attempt, lease_until, created_at, expires_at, response)
             VALUES (?1, ?2, {}, {}, {}, zeroblob(16), 1, 1, 4102444800000, NULL)",
            row.fingerprint, row.state, row.token
        ),
        [key.scope(), key.key()],
    )
    .unwrap();
    if let Some(step) = step {
        conn.execute(
            &format!(
                "INSERT INTO idem_steps (scope, key, step, value) VALUES (?1, ?2, {step}, x'00')"
            ),
            [key.scope(), key.key()],
        )
        .unwrap();
    }
}

#[tokio::test]
async fn foreign_records_are_refused_not_absent() {
    let path = common::fresh_db_path();
    let store: Arc<dyn Admin> = Arc::new(SqliteStore::open(&path).unwrap());
    let cases: [(&str, Row, Option<&str>); 6] = [
        (
            "an unknown state",
            Row {
                state: "'paused'",
                ..GOOD
            },
            None,
        ),
        (
            "a token that is text",
            Row {
                token: "'abc'",
                ..GOOD
            },
            None,
        ),
        ("a token of zero", Row { token: "0", ..GOOD }, None),
        (
            "a token beyond 2^53 - 1",
            Row {
                token: "9007199254740993",
                ..GOOD
            },
            None,
        ),
        (
            "a fingerprint of 5 bytes",
            Row {
                fingerprint: "x'0102030405'",
                ..GOOD
            },
            None,
        ),
        ("a step name that is not UTF-8", GOOD, Some("x'ff'")),
    ];
    for (n, (what, row, step)) in cases.into_iter().enumerate() {
        let key = Key::new("foreign", format!("case-{n}")).unwrap();
        plant(&path, &key, row, step);
        assert_foreign_record_is_refused(Arc::clone(&store), &key, what).await;
    }
}

/// Records at the last token (2^53 - 1, planted by hand): read, replayed and answered in
/// flight, but never taken over or released; once absent, claimed afresh from token 1.
#[tokio::test]
async fn a_record_at_the_last_token_is_read_but_never_taken_over() {
    use idem_testkit::{LastTokenRecords, assert_the_last_token_is_never_passed};
    let path = common::fresh_db_path();
    let store: Arc<dyn Admin> = Arc::new(SqliteStore::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    let now = i64::try_from(idem_core::Timestamp::now().as_unix_millis()).unwrap();
    let (hour, fingerprint) = (3_600_000, LastTokenRecords::fingerprint());
    let plant = |key: &Key, state: &str, lease_until: i64, expires_at: i64| {
        conn.execute(
            "INSERT INTO idem_records (scope, key, fingerprint, state, token, attempt, lease_until, created_at, expires_at, response)
             VALUES (?1, ?2, ?3, ?4, 9007199254740991, zeroblob(16), ?5, ?6, ?7, ?8)",
            rusqlite::params![
                key.scope(),
                key.key(),
                &fingerprint.as_bytes()[..],
                state,
                lease_until,
                now - 2 * hour,
                expires_at,
                LastTokenRecords::RESPONSE,
            ],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO idem_steps (scope, key, step, value) VALUES (?1, ?2, 'charge', x'00')",
            [key.scope(), key.key()],
        )
        .unwrap();
    };
    let (ended, tomorrow) = (now - hour, now + 24 * hour);
    let planted =
        LastTokenRecords::under("foreign", idem_core::record::AttemptId::from_bytes([0; 16]))
            .unwrap();
    plant(&planted.completed, "completed", ended, tomorrow);
    plant(&planted.held, "in_progress", now + hour, tomorrow);
    plant(&planted.ended, "in_progress", ended, tomorrow);
    plant(&planted.absent, "in_progress", ended, ended);
    assert_the_last_token_is_never_passed(store, &planted).await;
}
