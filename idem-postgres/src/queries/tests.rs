//! The statements that find a record by its key reach it through the primary key, however
//! stale the table's statistics. The stuck-work index holds every in-progress row and no
//! key column: a lookup by key through it reads every record in flight, so a planner that
//! believes it nearly empty (statistics gathered while nothing was in flight) would make
//! each completion cost as much as all the work in flight.

use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, Connection, Row};

use crate::PostgresStore;

/// Each statement that finds a row by key: its name, its `PREPARE` text and the arguments
/// of an `EXECUTE` (an owner's key, token and attempt, then its own).
fn lookups(queries: &super::Queries) -> Vec<(&'static str, String, String)> {
    let owner = "'s', 'p7', 1, '\\x00000000000000000000000000000000'::bytea";
    [
        (
            "finish",
            "(text, text, bigint, bytea, bytea, text, bigint)",
            &queries.finish,
            ", '\\x7b7d'::bytea, 'completed', 600000",
        ),
        (
            "finished",
            "(text, text, bigint, bytea, text)",
            &queries.finished,
            ", 'completed'",
        ),
        (
            "checkpoint",
            "(text, text, bigint, bytea, text, bytea, bigint)",
            &queries.checkpoint,
            ", 'debit', '\\x01'::bytea, 600000",
        ),
        (
            "release",
            "(text, text, bigint, bytea)",
            &queries.release,
            "",
        ),
        (
            "end_lease",
            "(text, text, bigint, bytea)",
            &queries.end_lease,
            "",
        ),
        (
            "renew",
            "(text, text, bigint, bytea, bigint, bigint)",
            &queries.renew,
            ", 30000, 600000",
        ),
    ]
    .into_iter()
    .map(|(name, types, sql, rest)| (name, format!("{types} AS {sql}"), format!("{owner}{rest}")))
    .collect()
}

#[tokio::test]
async fn lookups_by_key_use_the_primary_key_when_statistics_saw_nothing_in_flight() {
    let Some(url) = idem_testkit::service_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("connect to the test PostgreSQL");
    let store = PostgresStore::builder(pool.clone())
        .table(idem_testkit::Namespace::fresh().as_str())
        .expect("a valid table name")
        .build();
    let table = store.table().qualified().to_owned();
    let stuck_index = store.table().index("in_progress_lease");
    let primary_key = format!("{}_pkey", table.trim_matches('"'));
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
        .execute(&pool)
        .await
        .expect("drop a stale table");
    store.migrate().await.expect("migrate");

    // Statistics of a table where every record is finished; then records in flight that
    // the statistics never saw (autovacuum off, so that it does not analyze them first and
    // hide a plan that would scan them).
    let rows = |prefix: &str, state: &str, count: u32| {
        format!(
            "INSERT INTO {table} (scope, key, fingerprint, state, token, attempt, lease_until, \
             created_at, expires_at) \
             SELECT 's', '{prefix}' || i, decode(repeat('ab', 32), 'hex'), '{state}', 1, \
             decode(repeat('00', 16), 'hex'), now() + interval '1 hour', now(), \
             now() + interval '1 day' FROM generate_series(1, {count}) AS i"
        )
    };
    let mut connection = pool.acquire().await.expect("a connection");
    for statement in [
        format!("ALTER TABLE {table} SET (autovacuum_enabled = off)"),
        rows("c", "completed", 5_000),
        format!("ANALYZE {table}"),
        rows("p", "in_progress", 2_000),
    ] {
        sqlx::raw_sql(AssertSqlSafe(statement))
            .execute(&mut *connection)
            .await
            .expect("seed the table");
    }

    for (name, head, arguments) in lookups(store.queries()) {
        for mode in ["force_generic_plan", "force_custom_plan"] {
            let mut transaction = connection.begin().await.expect("begin");
            for statement in [
                format!("SET LOCAL plan_cache_mode = {mode}"),
                format!("PREPARE lookup {head}"),
            ] {
                sqlx::raw_sql(AssertSqlSafe(statement))
                    .execute(&mut *transaction)
                    .await
                    .unwrap_or_else(|err| panic!("{name}: {err}"));
            }
            let plan: Vec<String> = sqlx::raw_sql(AssertSqlSafe(format!(
                "EXPLAIN (COSTS OFF) EXECUTE lookup({arguments})"
            )))
            .fetch_all(&mut *transaction)
            .await
            .unwrap_or_else(|err| panic!("{name}: {err}"))
            .iter()
            .map(|row| row.get::<String, _>(0))
            .collect();
            let plan = plan.join("\n");
            assert!(
                plan.contains(&primary_key) && !plan.contains(stuck_index.trim_matches('"')),
                "{name} ({mode}) must find its row by the primary key:\n{plan}"
            );
            // A prepared statement outlives the transaction that made it.
            transaction.rollback().await.expect("roll back");
            sqlx::raw_sql("DEALLOCATE lookup")
                .execute(&mut *connection)
                .await
                .expect("deallocate");
        }
    }
}
