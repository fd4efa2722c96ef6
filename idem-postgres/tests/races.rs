//! 64 tasks over a pool of 16 connections race each fresh key: the work runs once per key,
//! counted in a side-effect table, not in memory.

mod common;

use std::sync::Arc;

use idem_core::Idempotency;

const TASKS: usize = 64;
const KEYS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_per_key_execute_once() {
    let Some(url) = common::url() else { return };
    let store = common::fresh_store(&url, 16).await;
    let pool = store.pool().clone();
    sqlx_effects(&pool).await;
    let idem = Arc::new(Idempotency::new(store));
    let effects = pool.clone();

    idem_testkit::execute_races(idem, KEYS, TASKS, move |key| {
        let pool = pool.clone();
        async move {
            idem_postgres::sqlx::query("INSERT INTO race_effects (key) VALUES ($1)")
                .bind(key.key().to_owned())
                .execute(&pool)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        }
    })
    .await;
    let per_key: Vec<(String, i64)> =
        idem_postgres::sqlx::query_as("SELECT key, count(*) FROM race_effects GROUP BY key")
            .fetch_all(&effects)
            .await
            .unwrap();
    assert_eq!(per_key.len(), KEYS, "every key ran once");
    assert!(
        per_key.iter().all(|(_, n)| *n == 1),
        "a key ran twice: {per_key:?}"
    );
}

async fn sqlx_effects(pool: &idem_postgres::sqlx::PgPool) {
    idem_postgres::sqlx::raw_sql(
        "DROP TABLE IF EXISTS race_effects; CREATE TABLE race_effects (key text NOT NULL)",
    )
    .execute(pool)
    .await
    .unwrap();
}
