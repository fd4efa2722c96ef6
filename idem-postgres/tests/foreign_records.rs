//! Records idem did not write, planted in the table by hand: never absent, never a panic,
//! always a typed error naming the key's hash.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{ClaimOutcome, ClaimRequest};
use idem_core::{Admin, Fingerprint, Key, Store, StoreError};
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_testkit::{
    LastTokenRecords, Namespace, assert_foreign_record_is_refused,
    assert_the_last_token_is_never_passed,
};

/// The answer is a corrupt record whose error names `key`'s hash.
#[track_caller]
fn assert_corrupt_naming<T: std::fmt::Debug>(key: &Key, answer: Result<T, StoreError>) {
    match answer {
        Err(err @ StoreError::Corrupt { .. }) => {
            assert!(
                err.to_string().contains(&key.short_hash().to_string()),
                "{err}"
            );
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[tokio::test]
async fn foreign_records_are_refused_not_absent() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh();
    let table = table.as_str();
    let store = common::store_in(&url, table, 4).await;
    let pool = store.pool().clone();
    let store: Arc<dyn Admin> = Arc::new(store);
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

/// A record in flight under the claim's own fingerprint, its lease over, that idem cannot
/// read: the claim takes it over (the statement commits) before the row is decoded. Every
/// claim answers Corrupt, under any fingerprint; each takeover leaves no live lease that
/// nobody holds and the record present; and the work never runs. Two records: steps that
/// are not base64, and no steps with a creation time before 1970 (a release there would
/// have made the record absent, and the next claim fresh).
#[tokio::test]
async fn a_takeover_of_an_undecodable_record_is_refused_every_time() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh();
    let table = table.as_str();
    let store = common::store_in(&url, table, 2).await;
    let fingerprint = Fingerprint::of_bytes("foreign");
    let cases = [
        ("steps", "now() - interval '1 hour'", r#"{"charge": "!!!"}"#),
        ("created", "'1960-01-01'::timestamptz", "{}"),
    ];
    for (name, created_at, steps) in cases {
        let key = Key::new("foreign", format!("undecodable-{name}")).unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{table}\" (scope, key, fingerprint, state, token, attempt, lease_until, created_at, expires_at, steps)
             VALUES ($1, $2, $3, 'in_progress', 1, decode(repeat('00', 16), 'hex'),
                     now() - interval '1 hour', {created_at}, now() + interval '1 day', $4::jsonb)"
        )))
        .bind(key.scope())
        .bind(key.key())
        .bind(&fingerprint.as_bytes()[..])
        .bind(steps)
        .execute(store.pool())
        .await
        .unwrap();
        let request = |fingerprint| {
            ClaimRequest::new(
                key.clone(),
                fingerprint,
                Duration::from_secs(60),
                Duration::from_secs(3600),
            )
        };
        let mut last = request(fingerprint);
        for _ in 0..3 {
            last = request(fingerprint);
            assert_corrupt_naming(&key, store.claim(&last).await);
        }
        // Each claim took the record over (the token rose) and ended its own lease; the
        // steps and the expiry are as they were.
        let (token, attempt, state, lease_over, kept, steps_now): (
            i64,
            Vec<u8>,
            String,
            bool,
            bool,
            String,
        ) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT token, attempt, state, lease_until <= now(),
                        expires_at > now() + interval '23 hours', steps::text
                 FROM \"{table}\" WHERE scope = $1 AND key = $2"
        )))
        .bind(key.scope())
        .bind(key.key())
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(token, 4, "{name}: three takeovers");
        assert_eq!(
            attempt,
            last.attempt.as_bytes(),
            "{name}: the last claim's attempt"
        );
        assert_eq!(state, "in_progress", "{name}");
        assert!(lease_over, "{name}: no live lease that nobody holds");
        assert!(kept, "{name}: the record keeps its expiry");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&steps_now).unwrap(),
            serde_json::from_str::<serde_json::Value>(steps).unwrap(),
            "{name}: the steps are as they were"
        );
        // Another fingerprint does not find the record absent either.
        assert_corrupt_naming(
            &key,
            store.claim(&request(Fingerprint::of_bytes("other"))).await,
        );
        // Then what every foreign record must meet: get, the writes and execute refuse it
        // (execute under the record's own fingerprint: one more takeover), and the work
        // never runs.
        let admin: Arc<dyn Admin> = Arc::new(store.clone());
        assert_foreign_record_is_refused(admin, &key, name).await;
    }
}

/// A record whose lease end something other than idem moved to the end of timestamptz's
/// range: a checkpoint's "one retention past the lease's end" overflows in PostgreSQL (a
/// data exception), which the store answers as a corrupt record naming the key's hash, as
/// every other write does, and nothing is written.
#[tokio::test]
async fn a_checkpoint_past_timestamptz_s_range_is_corrupt_and_names_its_key() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh();
    let table = table.as_str();
    let store = common::store_in(&url, table, 2).await;
    let key = Key::new("foreign", "lease-at-the-end-of-time").unwrap();
    let request = ClaimRequest::new(
        key.clone(),
        Fingerprint::of_bytes("a"),
        Duration::from_secs(60),
        Duration::from_secs(3600),
    );
    let lease = match store.claim(&request).await.unwrap() {
        idem_core::store::ClaimOutcome::Claimed { lease, .. } => lease,
        other => panic!("a fresh key is claimed: {other:?}"),
    };
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{table}\" SET lease_until = '294276-12-31 23:59:59+00'
         WHERE scope = $1 AND key = $2"
    )))
    .bind(key.scope())
    .bind(key.key())
    .execute(store.pool())
    .await
    .unwrap();
    let step = idem_core::key::StepName::new("charge").unwrap();
    assert_corrupt_naming(&key, store.checkpoint(&lease, &step, b"ch_1").await);
    let steps: String = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT steps::text FROM \"{table}\" WHERE scope = $1 AND key = $2"
    )))
    .bind(key.scope())
    .bind(key.key())
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(steps, "{}", "nothing was written");
}

/// An operator's release of a record at bigint's last token (past idem's, so not a row
/// idem writes): the release leaves it as it was and answers a corrupt record naming the
/// key's hash (before the release tested the row, its next token overflowed in
/// PostgreSQL, with the same answer).
#[tokio::test]
async fn an_operator_s_release_at_the_last_token_is_corrupt_and_names_its_key() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh();
    let table = table.as_str();
    let store = common::store_in(&url, table, 2).await;
    let key = Key::new("foreign", "last-token").unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{table}\" (scope, key, fingerprint, state, token, attempt, lease_until, created_at, expires_at)
         VALUES ($1, $2, decode(repeat('00', 32), 'hex'), 'in_progress', 9223372036854775807,
                 decode(repeat('00', 16), 'hex'), now() + interval '1 hour', now(), now() + interval '1 day')"
    )))
    .bind(key.scope())
    .bind(key.key())
    .execute(store.pool())
    .await
    .unwrap();
    assert_corrupt_naming(&key, store.release_key(&key).await);
    let (token, live): (i64, bool) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT token, lease_until > now() FROM \"{table}\" WHERE scope = $1 AND key = $2"
    )))
    .bind(key.scope())
    .bind(key.key())
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(token, i64::MAX, "the token is as it was");
    assert!(live, "the lease is as it was");
}

/// What a row holds that decides whether idem may act on it without reading it: state,
/// token, attempt, fingerprint, expiry (compared in SQL).
async fn row_as_stored(store: &idem_postgres::PostgresStore, table: &str, key: &Key) -> String {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT concat_ws(' ', state, token, encode(attempt, 'hex'), encode(fingerprint, 'hex'),
                          expires_at, lease_until)
         FROM \"{table}\" WHERE scope = $1 AND key = $2"
    )))
    .bind(key.scope())
    .bind(key.key())
    .fetch_one(store.pool())
    .await
    .expect("the planted row is still there")
}

/// The table has no CHECK constraints, so a hand edit can store any value. Each value idem
/// never writes is refused by every door, whether the record is present or long expired:
/// no claim takes it for absent (an unknown state may hide a live lease), none takes it
/// over (the attempt case: in progress under the claim's own fingerprint, its lease over),
/// the purge leaves it for an operator, and the row is unchanged afterwards.
#[tokio::test]
async fn rows_idem_never_writes_are_refused_present_or_expired_and_never_purged() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh();
    let table = table.as_str();
    let store = common::store_in(&url, table, 4).await;
    assert_eq!(
        check_constraints(&store, table).await,
        0,
        "migrate makes a table without CHECK constraints"
    );
    let admin: Arc<dyn Admin> = Arc::new(store.clone());
    let foreign = Fingerprint::of_bytes("foreign");
    let foreign = &foreign.as_bytes()[..];
    // (what, state, token, attempt bytes, fingerprint)
    let cases = [
        ("an unknown state", "'paused'", "1", 16, foreign),
        ("a state in capitals", "'IN_PROGRESS'", "1", 16, foreign),
        ("a token of 0", "'completed'", "0", 16, foreign),
        ("a negative token", "'in_progress'", "-7", 16, foreign),
        ("an attempt of 15 bytes", "'in_progress'", "1", 15, foreign),
        (
            "a fingerprint of 31 bytes",
            "'in_progress'",
            "1",
            16,
            &foreign[..31],
        ),
        (
            "a token past 2^53 - 1",
            "'in_progress'",
            "9007199254740992",
            16,
            foreign,
        ),
    ];
    let mut planted = Vec::new();
    for (n, (what, state, token, attempt, fingerprint)) in cases.into_iter().enumerate() {
        // Present (expires tomorrow), then expired an hour ago; either way its lease, if
        // it had one, ended an hour ago, and the hand edit below keeps one live for the
        // state in capitals.
        for (when, expires) in [
            ("present", "now() + interval '1 day'"),
            ("expired", "now() - interval '1 hour'"),
        ] {
            let key = Key::new("foreign", format!("never-written-{n}-{when}")).unwrap();
            let lease_until = if state == "'IN_PROGRESS'" {
                "now() + interval '1 hour'"
            } else {
                "now() - interval '1 hour'"
            };
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO \"{table}\" (scope, key, fingerprint, state, token, attempt, lease_until, created_at, expires_at)
                 VALUES ($1, $2, $3, {state}, {token},
                         decode(repeat('ab', {attempt}), 'hex'), {lease_until}, now() - interval '2 hours', {expires})"
            )))
            .bind(key.scope())
            .bind(key.key())
            .bind(fingerprint)
            .execute(store.pool())
            .await
            .unwrap();
            let before = row_as_stored(&store, table, &key).await;
            let what = format!("{what}, {when}");
            assert_foreign_record_is_refused(Arc::clone(&admin), &key, &what).await;
            // An operator's release neither takes it over nor calls it finished or absent.
            assert_corrupt_naming(&key, admin.release_key(&key).await);
            assert_eq!(
                row_as_stored(&store, table, &key).await,
                before,
                "{what}: the row changed"
            );
            planted.push((key, before, what));
        }
    }
    let purged = store.purge_expired(1000).await.unwrap();
    assert_eq!(purged, 0, "the purge deleted a row it cannot read");
    let stats = admin.stats(5).await.unwrap();
    assert_eq!(stats.total, planted.len() as u64);
    assert_eq!(
        stats.absent, 0,
        "stats counts as absent what the purge never deletes"
    );
    for (key, before, what) in &planted {
        assert_eq!(
            &row_as_stored(&store, table, key).await,
            before,
            "{what}: the purge changed the row"
        );
    }
}

/// A table made by an older idem keeps its CHECK constraints: migrate leaves them, and the
/// statements work on it as on a new table.
#[tokio::test]
async fn a_table_with_the_older_check_constraints_keeps_them_and_works() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh();
    let table = table.as_str();
    let store = common::store_in(&url, table, 2).await;
    common::add_older_checks(&store, table).await;
    store.migrate().await.unwrap();
    assert_eq!(
        check_constraints(&store, table).await,
        4,
        "migrate dropped an operator's constraints"
    );
    let idem = idem_core::Idempotency::new(store);
    let key = Key::new("older", "order-1").unwrap();
    let runs = std::sync::atomic::AtomicUsize::new(0);
    for replayed in [false, true] {
        let outcome = idem
            .execute(&key, Fingerprint::of_bytes("a"), |_ctx| async {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, idem_core::WorkError<()>>(7_u32)
            })
            .await
            .unwrap();
        assert!(
            matches!(outcome, idem_core::Outcome::Completed { value: 7, replayed: r, .. } if r == replayed),
            "{outcome:?}"
        );
    }
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// How many CHECK constraints `table` has.
async fn check_constraints(store: &idem_postgres::PostgresStore, table: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM pg_constraint WHERE conrelid = '\"{table}\"'::regclass AND contype = 'c'"
    )))
    .fetch_one(store.pool())
    .await
    .unwrap()
}

/// A hand edit that commits while a claim of the same key waits on it: the claim's first
/// form did not see the row when it read, and meets it only as a conflict; its second form
/// reads it and refuses it: the claim writes nothing and answers Corrupt.
#[tokio::test]
async fn a_row_idem_never_writes_committed_under_a_waiting_claim_is_refused() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh();
    let table = table.as_str();
    let store = common::store_in(&url, table, 4).await;
    let key = Key::new("foreign", "planted-under-a-claim").unwrap();
    let mut editor = store.pool().begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{table}\" (scope, key, fingerprint, state, token, attempt, lease_until, created_at, expires_at)
         VALUES ($1, $2, decode(repeat('00', 32), 'hex'), 'paused', 1, decode(repeat('00', 16), 'hex'),
                 now() + interval '1 hour', now() - interval '2 hours', now() - interval '1 hour')"
    )))
    .bind(key.scope())
    .bind(key.key())
    .execute(&mut *editor)
    .await
    .unwrap();
    let holder = common::backend_pid(&mut editor).await;
    let claim = tokio::spawn({
        let (store, key) = (store.clone(), key.clone());
        async move {
            store
                .claim(&ClaimRequest::new(
                    key,
                    Fingerprint::of_bytes("a"),
                    Duration::from_secs(60),
                    Duration::from_secs(3600),
                ))
                .await
        }
    });
    common::wait_until_blocked_by(&store, holder).await;
    editor.commit().await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(30), claim)
        .await
        .expect("the claim answers once the edit commits")
        .unwrap();
    assert_corrupt_naming(&key, answer);
    assert!(
        row_as_stored(&store, table, &key)
            .await
            .starts_with("paused 1 "),
        "the claim wrote over the planted row"
    );
}

/// A hand edit that makes a row one idem never writes (an attempt of 15 bytes, in progress
/// under the claim's own fingerprint) while a takeover waits for its row lock: the claim's
/// second form read the row as valid, and its upsert meets the edited row only once the
/// lock is granted. The upsert's own test (`{r.valid}` in
/// claim_update.sql) refuses it: the claim writes nothing and answers Corrupt.
#[tokio::test]
async fn a_row_made_foreign_under_a_waiting_takeover_is_refused() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh();
    let table = table.as_str();
    let store = common::store_in(&url, table, 4).await;
    let request = |lease| {
        ClaimRequest::new(
            Key::new("foreign", "edited-under-a-takeover").unwrap(),
            Fingerprint::of_bytes("a"),
            lease,
            Duration::from_secs(3600),
        )
    };
    // An owner whose lease has ended: the next claim takes it over.
    let first = store.claim(&request(Duration::ZERO)).await.unwrap();
    assert!(matches!(first, ClaimOutcome::Claimed { .. }), "{first:?}");
    let key = request(Duration::ZERO).key;
    let (mut editor, holder) = common::lock_row(&store, table, key.scope(), key.key()).await;
    let claim = tokio::spawn({
        let store = store.clone();
        let request = request(Duration::from_secs(60));
        async move { store.claim(&request).await }
    });
    common::wait_until_blocked_by(&store, holder).await;
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{table}\" SET attempt = decode(repeat('ab', 15), 'hex') WHERE scope = $1 AND key = $2"
    )))
    .bind(key.scope())
    .bind(key.key())
    .execute(&mut *editor)
    .await
    .unwrap();
    editor.commit().await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(30), claim)
        .await
        .expect("the claim answers once the edit commits")
        .unwrap();
    assert_corrupt_naming(&key, answer);
    let stored = row_as_stored(&store, table, &key).await;
    assert!(
        stored.starts_with(&format!("in_progress 1 {} ", "ab".repeat(15))),
        "the claim wrote over the edited row: {stored}"
    );
}

/// `infinity` in a time column (a hand edit; idem writes only finite times) is a corrupt
/// record naming the key wherever the row is read: PostgreSQL refuses to turn it into milliseconds,
/// so the client decodes the times itself and refuses it there.
#[tokio::test]
async fn infinite_times_are_corrupt_and_name_their_key() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh();
    let table = table.as_str();
    let store = common::store_in(&url, table, 4).await;
    let admin: Arc<dyn Admin> = Arc::new(store.clone());
    // (what, state, lease_until, created_at, expires_at)
    let cases = [
        (
            "an expiry at infinity",
            "'completed'",
            "now()",
            "now()",
            "'infinity'",
        ),
        (
            "a live lease to infinity",
            "'in_progress'",
            "'infinity'",
            "now()",
            "now() - interval '1 hour'",
        ),
        (
            "a live lease created at minus infinity",
            "'in_progress'",
            "now() + interval '1 hour'",
            "'-infinity'",
            "now() + interval '1 day'",
        ),
    ];
    for (n, (what, state, lease_until, created_at, expires_at)) in cases.into_iter().enumerate() {
        let key = Key::new("foreign", format!("infinite-{n}")).unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{table}\" (scope, key, fingerprint, state, token, attempt, lease_until, created_at, expires_at, response)
             VALUES ($1, $2, decode(repeat('00', 32), 'hex'), {state}, 1, decode(repeat('00', 16), 'hex'),
                     {lease_until}, {created_at}, {expires_at}, '\\x22616222')"
        )))
        .bind(key.scope())
        .bind(key.key())
        .execute(store.pool())
        .await
        .unwrap();
        assert_foreign_record_is_refused(Arc::clone(&admin), &key, what).await;
        // The operator's listing and counts refuse it too (the stuck-work listing and the
        // oldest record in flight read the creation time), naming what they can.
        assert_corrupt_naming(
            &key,
            admin.list(&idem_core::admin::ListQuery::default()).await,
        );
        if created_at == "'-infinity'" {
            let stats = admin.stats(5).await;
            assert!(
                matches!(&stats, Err(StoreError::Corrupt { .. })),
                "{what}: stats answered {stats:?}"
            );
        }
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM \"{table}\" WHERE scope = $1 AND key = $2"
        )))
        .bind(key.scope())
        .bind(key.key())
        .execute(store.pool())
        .await
        .unwrap();
    }
}

/// A record at the last token idem gives out (2^53 - 1, hand-planted), as the state
/// machine has it: readable, so a replay and an in-flight answer are given, but no claim
/// takes it over and no operator's release passes it (no next token could fence its
/// owner): each answers Corrupt naming the key and leaves the row as it was. Once absent
/// it is replaced starting again at token 1, or purged.
#[tokio::test]
async fn a_record_at_the_last_token_is_read_but_never_taken_over() {
    let Some(url) = common::url() else { return };
    let table = Namespace::fresh();
    let table = table.as_str();
    let store = common::store_in(&url, table, 4).await;
    let fingerprint = LastTokenRecords::fingerprint();
    let plant = |key: Key, state: &'static str, lease: &'static str, expires: &'static str| {
        let store = store.clone();
        async move {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO \"{table}\" (scope, key, fingerprint, state, token, attempt, lease_until, created_at, expires_at, response, steps)
                 VALUES ($1, $2, $3, '{state}', 9007199254740991, decode(repeat('00', 16), 'hex'),
                         {lease}, now() - interval '2 hours', {expires}, $4,
                         '{{\"charge\": \"Y2hfMQ==\"}}'::jsonb)"
            )))
            .bind(key.scope())
            .bind(key.key())
            .bind(&fingerprint.as_bytes()[..])
            .bind(LastTokenRecords::RESPONSE)
            .execute(store.pool())
            .await
            .unwrap();
        }
    };
    let (ended, tomorrow) = ("now() - interval '1 hour'", "now() + interval '1 day'");
    let planted =
        LastTokenRecords::under("foreign", idem_core::record::AttemptId::from_bytes([0; 16]))
            .unwrap();
    plant(planted.completed.clone(), "completed", ended, tomorrow).await;
    let held = "now() + interval '1 hour'";
    plant(planted.held.clone(), "in_progress", held, tomorrow).await;
    plant(planted.ended.clone(), "in_progress", ended, tomorrow).await;
    plant(planted.absent.clone(), "in_progress", ended, ended).await;
    assert_the_last_token_is_never_passed(Arc::new(store.clone()), &planted).await;
    // The replacement's row holds no step.
    let stored_steps: String = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT steps::text FROM \"{table}\" WHERE scope = $1 AND key = $2"
    )))
    .bind(planted.absent.scope())
    .bind(planted.absent.key())
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(stored_steps, "{}");
    let purged = Key::new("foreign", "last-token-purged").unwrap();
    plant(purged, "completed", ended, ended).await;
    assert_eq!(
        store.purge_expired(1000).await.unwrap(),
        1,
        "the absent one is purged"
    );
}
