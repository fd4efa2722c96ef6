//! Records idem did not write, planted in the table by hand: never absent, never a panic,
//! always a typed error naming the key's hash.

mod common;

use std::sync::Arc;

use idem_core::{Admin, Key};
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_testkit::{Namespace, assert_foreign_record_is_refused};

#[tokio::test]
async fn foreign_records_are_refused_not_absent() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh();
    let table = table.as_str();
    let store = common::store_in(&url, table, 4).await;
    let pool = store.pool().clone();
    let store: Arc<dyn Admin> = Arc::new(store);
    // An older schema, or a hand edit, without the state check.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "ALTER TABLE \"{table}\" DROP CONSTRAINT IF EXISTS \"{table}_state_check\""
    )))
    .execute(&pool)
    .await
    .unwrap();
    let cases = [
        ("an unknown state", "'paused'", "1", "'{}'"),
        (
            "a token beyond 2^53 - 1",
            "'in_progress'",
            "9007199254740993",
            "'{}'",
        ),
        (
            "steps that are not an object",
            "'in_progress'",
            "1",
            "'[1, 2]'",
        ),
        (
            "a step value that is not base64",
            "'in_progress'",
            "1",
            "'{\"charge\": \"!!!\"}'",
        ),
        (
            "a step value that is a number",
            "'in_progress'",
            "1",
            "'{\"charge\": 7}'",
        ),
    ];
    for (n, (what, state, token, steps)) in cases.into_iter().enumerate() {
        let key = Key::new("foreign", format!("case-{n}")).unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{table}\" (scope, key, fingerprint, state, token, attempt, lease_until, created_at, expires_at, steps)
             VALUES ($1, $2, decode(repeat('00', 32), 'hex'), {state}, {token}, decode(repeat('00', 16), 'hex'),
                     now() - interval '1 hour', now() - interval '1 hour', now() + interval '1 day', {steps}::jsonb)"
        )))
        .bind(key.scope())
        .bind(key.key())
        .execute(&pool)
        .await
        .unwrap();
        assert_foreign_record_is_refused(Arc::clone(&store), &key, what).await;
    }
}
