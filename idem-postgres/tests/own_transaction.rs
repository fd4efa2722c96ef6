//! Completing inside the caller's sqlx transaction, table names, and how errors are
//! classified.

mod common;

use std::time::Duration;

use idem_core::{
    Context, Fingerprint, Heartbeat, Idempotency, Key, Outcome, State, Store, StoreError,
    WorkError, store::ClaimRequest, store::WriteOutcome,
};
use idem_postgres::PostgresStore;
use idem_postgres::sqlx;

const LEASE: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Receipt {
    order: String,
    cents: u64,
}

fn receipt(order: &str) -> Receipt {
    Receipt {
        order: order.into(),
        cents: 500,
    }
}

async fn setup(url: &str) -> (PostgresStore, String) {
    let store = common::fresh_store(url, 4).await;
    // Per process and fresh: a process that gets an earlier one's id must not count that
    // one's debits.
    let ledger = format!("ledger_{}", idem_testkit::Namespace::fresh());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {ledger} (order_id text NOT NULL, cents bigint NOT NULL)"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    (store, ledger)
}

async fn debits(store: &PostgresStore, ledger: &str, order: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {ledger} WHERE order_id = $1"
    )))
    .bind(order)
    .fetch_one(store.pool())
    .await
    .unwrap()
}

/// Debits `order` in the caller's transaction.
async fn debit(tx: &mut sqlx::PgConnection, ledger: &str, order: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {ledger} VALUES ($1, 500)"
    )))
    .bind(order)
    .execute(tx)
    .await
    .unwrap();
}

/// The execution ran the work once and its record is completed, with `order`'s receipt.
async fn assert_completed_fresh(
    store: &PostgresStore,
    key: &Key,
    outcome: Outcome<Receipt, String>,
    order: &str,
) {
    assert_eq!(
        outcome,
        Outcome::Completed {
            value: receipt(order),
            replayed: false
        }
    );
    assert_eq!(
        store.get(key).await.unwrap().unwrap().state,
        State::Completed
    );
}

/// A driver with no heartbeat: nothing but the test writes to the record.
fn quiet(store: &PostgresStore) -> Idempotency<PostgresStore> {
    Idempotency::builder(store.clone())
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap()
}

/// A transaction at REPEATABLE READ; its snapshot is taken at its next statement.
async fn repeatable_read(store: &PostgresStore) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

/// What the work does in each test: debit the ledger and complete the key in one sqlx
/// transaction; `pause` runs while the transaction (and the record's row lock) is held.
async fn debit_in_one_transaction<F, Fut>(
    store: &PostgresStore,
    ledger: &str,
    ctx: &Context,
    order: &str,
    commit: bool,
    pause: F,
) -> Result<Receipt, WorkError<String>>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let receipt = receipt(order);
    let completion = ctx.prepare_completion(&receipt)?;
    let mut tx = store.pool().begin().await.unwrap();
    debit(&mut tx, ledger, order).await;
    match store.complete_in(&mut tx, &completion).await.unwrap() {
        WriteOutcome::Applied => {}
        WriteOutcome::Fenced => {
            tx.rollback().await.unwrap();
            return Err(WorkError::Retryable("another attempt owns the key".into()));
        }
    }
    pause().await;
    if commit {
        tx.commit().await.unwrap();
        Ok(receipt)
    } else {
        tx.rollback().await.unwrap();
        Err(WorkError::Retryable("rolled back".into()))
    }
}

#[tokio::test]
async fn business_rows_and_completion_commit_together() {
    let Some(url) = common::url() else { return };
    let (store, ledger) = setup(&url).await;
    let idem = Idempotency::new(store.clone());
    let key = Key::new("shop/checkout", "order-1").unwrap();
    for attempt in 0..3 {
        let outcome = idem
            .execute(&key, Fingerprint::of_bytes("500"), |ctx| {
                let (store, ledger) = (store.clone(), ledger.clone());
                async move {
                    debit_in_one_transaction(&store, &ledger, &ctx, "order-1", true, || async {})
                        .await
                }
            })
            .await
            .unwrap();
        assert_eq!(
            outcome,
            Outcome::Completed {
                value: receipt("order-1"),
                replayed: attempt > 0
            }
        );
    }
    assert_eq!(debits(&store, &ledger, "order-1").await, 1);
    let record = store.get(&key).await.unwrap().unwrap();
    assert_eq!(record.state, State::Completed);
    let stored: Receipt = serde_json::from_slice(record.response.as_deref().unwrap()).unwrap();
    assert_eq!(
        stored,
        receipt("order-1"),
        "the bytes the driver would store"
    );
}

#[tokio::test]
async fn complete_in_takes_a_plain_connection_too() {
    let Some(url) = common::url() else { return };
    let (store, ledger) = setup(&url).await;
    let idem = Idempotency::new(store.clone());
    let key = Key::new("shop/checkout", "order-c").unwrap();
    let outcome = idem
        .execute(&key, Fingerprint::of_bytes("500"), |ctx| {
            let store = store.clone();
            async move {
                let completion = ctx.prepare_completion(&receipt("order-c"))?;
                let mut conn = store.pool().acquire().await.unwrap();
                assert_eq!(
                    store.complete_in(&mut *conn, &completion).await.unwrap(),
                    WriteOutcome::Applied
                );
                Ok::<_, WorkError<String>>(receipt("order-c"))
            }
        })
        .await
        .unwrap();
    assert_eq!(outcome.value(), Some(receipt("order-c")));
    let _ = ledger;
}

/// Under REPEATABLE READ the completion lands, and the same completion again in that
/// transaction (a retry after a lost answer) finds its own result and is Applied.
#[tokio::test]
async fn complete_in_works_under_repeatable_read() {
    let Some(url) = common::url() else { return };
    let (store, _ledger) = setup(&url).await;
    let idem = quiet(&store);
    let key = Key::new("shop/checkout", "order-rr").unwrap();
    let outcome = idem
        .execute(&key, Fingerprint::of_bytes("500"), |ctx| {
            let store = store.clone();
            async move {
                let completion = ctx.prepare_completion(&receipt("order-rr"))?;
                let mut tx = repeatable_read(&store).await;
                for attempt in ["first", "retried"] {
                    assert_eq!(
                        store.complete_in(&mut tx, &completion).await.unwrap(),
                        WriteOutcome::Applied,
                        "the {attempt} completion"
                    );
                }
                tx.commit().await.unwrap();
                Ok::<_, WorkError<String>>(receipt("order-rr"))
            }
        })
        .await
        .unwrap();
    assert_completed_fresh(&store, &key, outcome, "order-rr").await;
}

/// The pitfall `complete_in`'s docs name: a REPEATABLE READ snapshot taken before the
/// claim cannot see the lease, so the completion answers Fenced and writes nothing.
#[tokio::test]
async fn a_repeatable_read_snapshot_from_before_the_claim_is_fenced() {
    let Some(url) = common::url() else { return };
    let (store, _ledger) = setup(&url).await;
    let idem = quiet(&store);
    let key = Key::new("shop/checkout", "order-early-snapshot").unwrap();
    let mut tx = repeatable_read(&store).await;
    // The snapshot is taken here, before the claim.
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    let answered = idem
        .execute(&key, Fingerprint::of_bytes("500"), |ctx| {
            let store = store.clone();
            async move {
                let completion = ctx.prepare_completion(&receipt("order-early-snapshot"))?;
                let answer = store.complete_in(&mut tx, &completion).await.unwrap();
                // Committed, so that a completion the fence let through would show below.
                tx.commit().await.unwrap();
                Err::<Receipt, _>(WorkError::Retryable(format!("{answer:?}")))
            }
        })
        .await
        .unwrap();
    assert_eq!(answered, Outcome::Retryable("Fenced".to_owned()));
    assert_ne!(
        store.get(&key).await.unwrap().map(|record| record.state),
        Some(State::Completed),
        "nothing was stored"
    );
}

/// The other case `complete_in`'s docs name: a write to the record after a REPEATABLE READ
/// snapshot (here the lease's own renewal, as a heartbeat makes it) answers Busy; rolled
/// back and run again in a new transaction, the completion lands once.
#[tokio::test]
async fn a_renewal_after_a_repeatable_read_snapshot_is_busy_and_a_retry_lands() {
    let Some(url) = common::url() else { return };
    let (store, ledger) = setup(&url).await;
    let idem = quiet(&store);
    let key = Key::new("shop/checkout", "order-renewed").unwrap();
    let outcome = idem
        .execute(&key, Fingerprint::of_bytes("500"), |ctx| {
            let (store, ledger) = (store.clone(), ledger.clone());
            async move {
                let completion = ctx.prepare_completion(&receipt("order-renewed"))?;
                let mut tx = repeatable_read(&store).await;
                // The snapshot is taken here, after the claim, then the record is renewed.
                debit(&mut tx, &ledger, "order-renewed").await;
                let renewed = store.renew(&ctx.lease(), LEASE).await.unwrap();
                assert!(
                    matches!(renewed, idem_core::store::RenewOutcome::Renewed(_)),
                    "{renewed:?}"
                );
                let busy = store.complete_in(&mut tx, &completion).await;
                assert!(
                    matches!(busy, Err(StoreError::Busy { .. })),
                    "a row written after the snapshot: {busy:?}"
                );
                tx.rollback().await.unwrap();
                // Run again, as the docs say: a new transaction sees the renewal.
                let mut tx = repeatable_read(&store).await;
                debit(&mut tx, &ledger, "order-renewed").await;
                assert_eq!(
                    store.complete_in(&mut tx, &completion).await.unwrap(),
                    WriteOutcome::Applied
                );
                tx.commit().await.unwrap();
                Ok::<_, WorkError<String>>(receipt("order-renewed"))
            }
        })
        .await
        .unwrap();
    assert_completed_fresh(&store, &key, outcome, "order-renewed").await;
    assert_eq!(debits(&store, &ledger, "order-renewed").await, 1);
}

#[tokio::test]
async fn a_rollback_leaves_the_key_claimable_again() {
    let Some(url) = common::url() else { return };
    let (store, ledger) = setup(&url).await;
    let idem = Idempotency::new(store.clone());
    let key = Key::new("shop/checkout", "order-2").unwrap();
    let outcome = idem
        .execute(&key, Fingerprint::of_bytes("500"), |ctx| {
            let (store, ledger) = (store.clone(), ledger.clone());
            async move {
                debit_in_one_transaction(&store, &ledger, &ctx, "order-2", false, || async {}).await
            }
        })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Retryable("rolled back".into()));
    assert_eq!(
        debits(&store, &ledger, "order-2").await,
        0,
        "the business row rolled back"
    );
    // The completion rolled back too, and the release (no step was checkpointed) forgot
    // the key: nothing is left of the first try.
    assert_eq!(
        store.get(&key).await.unwrap(),
        None,
        "so did the completion"
    );
    let outcome = idem
        .execute(&key, Fingerprint::of_bytes("500"), |ctx| {
            let (store, ledger) = (store.clone(), ledger.clone());
            async move {
                assert!(
                    !ctx.resumed(),
                    "released and forgotten: the retry runs afresh"
                );
                debit_in_one_transaction(&store, &ledger, &ctx, "order-2", true, || async {}).await
            }
        })
        .await
        .unwrap();
    assert_eq!(outcome.value(), Some(receipt("order-2")));
    assert_eq!(debits(&store, &ledger, "order-2").await, 1);
}

#[tokio::test]
async fn a_stale_owner_cannot_complete_in_its_transaction() {
    let Some(url) = common::url() else { return };
    let (store, ledger) = setup(&url).await;
    let idem = Idempotency::new(store.clone());
    let key = Key::new("shop/checkout", "order-3").unwrap();
    let outcome = idem
        .execute(&key, Fingerprint::of_bytes("500"), |ctx| {
            let (store, ledger, key) = (store.clone(), ledger.clone(), key.clone());
            async move {
                // Meanwhile the lease ends and another attempt takes the key over.
                assert_eq!(
                    store.release(&ctx.lease()).await.unwrap(),
                    WriteOutcome::Applied
                );
                let takeover = ClaimRequest::new(key, Fingerprint::of_bytes("500"), LEASE, DAY);
                let _ = store.claim(&takeover).await.unwrap();
                debit_in_one_transaction(&store, &ledger, &ctx, "order-3", true, || async {}).await
            }
        })
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Retryable("another attempt owns the key".into())
    );
    assert_eq!(
        debits(&store, &ledger, "order-3").await,
        0,
        "the fenced debit was rolled back"
    );
}

/// A heartbeat that ticks between `complete_in` and `COMMIT` waits for the row
/// lock the work's transaction holds. It must neither stall the work (a deadlock: before,
/// the work was not polled while the renewal waited) nor turn the committed result into a
/// lost lease.
#[tokio::test]
async fn a_heartbeat_inside_the_transaction_neither_deadlocks_nor_loses_the_result() {
    let Some(url) = common::url() else { return };
    let (store, ledger) = setup(&url).await;
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(5))
        .heartbeat(Heartbeat::Every(Duration::from_millis(20)))
        .build()
        .unwrap();
    let key = Key::new("shop/checkout", "order-5").unwrap();
    let execution = idem.execute(&key, Fingerprint::of_bytes("500"), |ctx| {
        let (store, ledger) = (store.clone(), ledger.clone());
        async move {
            debit_in_one_transaction(&store, &ledger, &ctx, "order-5", true, || {
                // Several beats fall inside the open transaction.
                tokio::time::sleep(Duration::from_millis(150))
            })
            .await
        }
    });
    let outcome = tokio::time::timeout(Duration::from_secs(20), execution)
        .await
        .expect("deadlock: a heartbeat waited for the work's row lock while the work waited for it")
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            value: receipt("order-5"),
            replayed: false
        },
        "the result committed in the work's transaction is the answer"
    );
    assert_eq!(debits(&store, &ledger, "order-5").await, 1);
}

/// Reserved words are valid table names; they used to pass validation and then
/// break `migrate()` with a syntax error.
#[tokio::test]
async fn reserved_words_work_as_table_names() {
    let Some(url) = common::url() else { return };
    for table in ["order", "user", "public.select"] {
        let store = common::store_in(&url, table, 2).await;
        let idem = Idempotency::new(store.clone());
        let key = Key::new("shop/checkout", "order-1").unwrap();
        for attempt in 0..2 {
            let outcome = idem
                .execute(&key, Fingerprint::of_bytes("500"), |_ctx| async {
                    Ok::<_, WorkError<()>>(table.to_string())
                })
                .await
                .unwrap();
            assert_eq!(outcome.replayed(), attempt > 0, "{table}");
        }
        assert_eq!(store.purge_expired(10).await.unwrap(), 0, "{table}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP TABLE {}",
            table
                .split('.')
                .map(|p| format!("\"{p}\""))
                .collect::<Vec<_>>()
                .join(".")
        )))
        .execute(store.pool())
        .await
        .unwrap();
    }
}

/// A table in a schema that does not exist yet: migrate creates the schema, then the
/// table (it used to fail with SQLSTATE 3F000, invalid schema name).
#[tokio::test]
async fn migrate_creates_a_missing_schema() {
    let Some(url) = common::url() else { return };
    let schema = format!("idem_schema_{}", idem_testkit::Namespace::fresh());
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let store = PostgresStore::builder(pool.clone())
        .table(&format!("{schema}.records"))
        .unwrap()
        .build();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let idem = Idempotency::new(store.clone());
    let key = Key::new("shop/checkout", "order-1").unwrap();
    for attempt in 0..2 {
        let outcome = idem
            .execute(&key, Fingerprint::of_bytes("500"), |_ctx| async {
                Ok::<_, WorkError<()>>("stored in its own schema".to_string())
            })
            .await
            .unwrap();
        assert_eq!(outcome.replayed(), attempt > 0);
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA \"{schema}\" CASCADE"
    )))
    .execute(&pool)
    .await
    .unwrap();
}

/// A role granted `CREATE` on its own schema only (not on the database) migrates a table
/// in that schema: the schema is created only when missing, since `CREATE SCHEMA IF NOT
/// EXISTS` asks for the database privilege even when the schema exists.
#[tokio::test]
async fn migrate_into_an_existing_schema_needs_no_database_privilege() {
    let Some(url) = common::url() else { return };
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    let id = std::process::id();
    let (role, schema) = (format!("idem_role_{id}"), format!("idem_granted_{id}"));
    for statement in [
        format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"),
        format!("DROP ROLE IF EXISTS \"{role}\""),
        format!("CREATE ROLE \"{role}\" LOGIN"),
        format!("CREATE SCHEMA \"{schema}\""),
        format!("GRANT USAGE, CREATE ON SCHEMA \"{schema}\" TO \"{role}\""),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&admin)
            .await
            .unwrap();
    }
    let mut as_role: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    as_role = as_role.username(&role);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(as_role)
        .await
        .unwrap();
    let store = PostgresStore::builder(pool.clone())
        .table(&format!("{schema}.records"))
        .unwrap()
        .build();
    let migrated = store.migrate().await;
    pool.close().await;
    for statement in [
        format!("DROP SCHEMA \"{schema}\" CASCADE"),
        format!("DROP ROLE \"{role}\""),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&admin)
            .await
            .unwrap();
    }
    migrated.unwrap();
}

#[tokio::test]
async fn a_missing_table_is_a_configuration_error() {
    let Some(url) = common::url() else { return };
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let store = PostgresStore::builder(pool)
        .table("never_migrated")
        .unwrap()
        .build();
    let request = ClaimRequest::new(
        Key::new("s", "k").unwrap(),
        Fingerprint::of_bytes("x"),
        LEASE,
        DAY,
    );
    let err = store.claim(&request).await.unwrap_err();
    assert!(matches!(err, StoreError::Misconfigured { .. }), "{err:?}");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error() {
    // Port 1 on loopback: nothing listens, the connection is refused at once.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy("postgres://postgres@127.0.0.1:1/postgres")
        .unwrap();
    let store = PostgresStore::new(pool);
    let request = ClaimRequest::new(
        Key::new("s", "k").unwrap(),
        Fingerprint::of_bytes("x"),
        LEASE,
        DAY,
    );
    let err = store.claim(&request).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
}
