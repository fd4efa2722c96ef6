//! 64 tasks over a pool of 16 connections race each fresh key: the work runs once per key,
//! counted in a side-effect table, not in memory.

mod common;

use std::sync::Arc;

use idem_core::{Error, Fingerprint, Idempotency, Key, WorkError};
use tokio::sync::Barrier;

const TASKS: usize = 64;
const KEYS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_per_key_execute_once() {
    let Some(url) = common::url() else { return };
    let store = common::fresh_store(&url, 16).await;
    let pool = store.pool().clone();
    sqlx_effects(&pool).await;
    let idem = Arc::new(Idempotency::new(store));

    for n in 0..KEYS {
        let key = Key::new("race", format!("key-{n}")).unwrap();
        let barrier = Arc::new(Barrier::new(TASKS));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (idem, key, barrier, pool) = (
                    Arc::clone(&idem),
                    key.clone(),
                    Arc::clone(&barrier),
                    pool.clone(),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    let name = key.key().to_owned();
                    idem.execute(&key, Fingerprint::of_bytes("same"), |_ctx| async move {
                        idem_postgres::sqlx::query("INSERT INTO race_effects (key) VALUES ($1)")
                            .bind(name)
                            .execute(&pool)
                            .await
                            .map_err(|e| WorkError::Retryable(e.to_string()))?;
                        Ok::<_, WorkError<String>>(())
                    })
                    .await
                })
            })
            .collect();
        let mut executed = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(done) => executed += usize::from(!done.replayed),
                Err(Error::InFlight { .. }) => {}
                Err(other) => panic!("key-{n}: unexpected {other:?}"),
            }
        }
        assert_eq!(executed, 1, "key-{n}: executions among {TASKS} tasks");
    }
    let per_key: Vec<(String, i64)> =
        idem_postgres::sqlx::query_as("SELECT key, count(*) FROM race_effects GROUP BY key")
            .fetch_all(&pool)
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
