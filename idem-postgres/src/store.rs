//! `PostgresStore`: one statement per write, times from the database clock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Key, Record, Store, StoreError, key::StepName, machine, raw::duration_millis, record::Lease,
    store::ClaimOutcome, store::ClaimRequest, store::Completion, store::Operation,
    store::RenewOutcome, store::WriteOutcome,
};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Acquire, AssertSqlSafe, PgConnection, PgPool, Postgres, Row};

use crate::errors::map;
use crate::queries::Queries;
use crate::rows;
use crate::table::{DEFAULT_TABLE, TableName, TableNameError};

/// Upper bound on rows one purge statement deletes, so a large backlog is cleared in
/// short transactions.
const PURGE_BATCH: usize = 1_000;

/// How many claim statements run at most (the first form once, then the second; each
/// second form that writes nothing is followed by one read): the second form runs when the
/// first neither read nor wrote a row (a takeover, an absent record still stored, a row
/// inserted after its snapshot), and again when the record read still calls for a write
/// (it changed once more, or was purged meanwhile), or when its lease end or expiry falls
/// within the millisecond of `now()` (SQL compares microseconds, the state machine whole
/// milliseconds) until that millisecond passes.
const CLAIM_ATTEMPTS: usize = 8;

/// Milliseconds for SQL: clamped to `MAX_DURATION`, so no interval ever leaves
/// PostgreSQL's range.
fn millis(duration: Duration) -> i64 {
    // duration_millis is at most 3.2e12: it always fits.
    i64::try_from(duration_millis(duration)).unwrap_or(i64::MAX)
}

fn token(lease: &Lease) -> i64 {
    // Tokens past i64::MAX cannot exist in the table, so such a lease is fenced anyway.
    i64::try_from(lease.token).unwrap_or(i64::MAX)
}

/// An idem [`Store`] in a PostgreSQL table, over an sqlx [`PgPool`].
///
/// - A replay, a mismatch, an in-flight answer and a fresh key's claim cost one statement,
///   one round trip: it reads a present record it will not write and answers from it
///   without writing or locking (every replay), or inserts a new row
///   (`INSERT ... ON CONFLICT DO NOTHING ... RETURNING`). A takeover or a record absent
///   but still stored takes a second, `INSERT ... ON CONFLICT ... DO UPDATE ... WHERE ...
///   RETURNING`; when that writes nothing (the record changed under the statement), one
///   more read answers.
/// - Every fenced write is one `UPDATE ... WHERE scope = $1 AND key = $2 AND token = $3
///   AND attempt = $4 AND state = 'in_progress'`.
/// - All times come from the database's `now()`, never from the client.
/// - The table is created by [`PostgresStore::migrate`]; its name is configurable.
///
/// ```no_run
/// use idem_core::Idempotency;
/// use idem_postgres::PostgresStore;
/// use sqlx::PgPool;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = PgPool::connect("postgres://app@127.0.0.1/app").await?;
/// let store = PostgresStore::builder(pool).table("billing.idem_records")?.build();
/// store.migrate().await?;
/// let idem = Idempotency::new(store);
/// # let _ = idem;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    table: TableName,
    queries: Arc<Queries>,
}

/// Settings for a [`PostgresStore`]; see [`PostgresStore::builder`].
#[derive(Debug)]
#[must_use = "call build() to get the store"]
pub struct PostgresStoreBuilder {
    pool: PgPool,
    table: TableName,
}

impl PostgresStoreBuilder {
    /// The table to use: `name` or `schema.name` (default `idem_records`). A schema that
    /// does not exist yet is created by [`PostgresStore::migrate`], which needs the
    /// `CREATE` privilege on the database only then; an existing schema needs `CREATE` on
    /// the schema alone.
    ///
    /// # Errors
    /// [`TableNameError`] unless each part is a plain identifier (ASCII letters, digits,
    /// underscores; the table part at most 40 bytes).
    pub fn table(mut self, name: &str) -> Result<Self, TableNameError> {
        self.table = TableName::parse(name)?;
        Ok(self)
    }

    /// Builds the store. Call [`PostgresStore::migrate`] before first use.
    pub fn build(self) -> PostgresStore {
        PostgresStore {
            queries: Arc::new(Queries::for_table(&self.table)),
            pool: self.pool,
            table: self.table,
        }
    }
}

impl PostgresStore {
    /// A store on the default table, `idem_records`.
    pub fn new(pool: PgPool) -> Self {
        Self::builder(pool).build()
    }

    /// Starts a builder over `pool`.
    pub fn builder(pool: PgPool) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            pool,
            table: TableName::parse(DEFAULT_TABLE).unwrap_or_else(|_| unreachable!("valid")),
        }
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub(crate) fn queries(&self) -> &Queries {
        &self.queries
    }

    #[cfg(test)]
    pub(crate) fn table(&self) -> &TableName {
        &self.table
    }

    /// Creates the table and its indexes when missing (the DDL is in the crate docs), and
    /// the schema of a schema-qualified table (`billing.idem_records`) too. Idempotent,
    /// and safe to run from many processes at once: it holds a transaction advisory lock
    /// while it runs.
    ///
    /// # Errors
    /// A [`StoreError`] when the database refuses (missing privileges, say).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let setup = |err| map(Operation::Setup, err);
        let mut tx = self.pool.begin().await.map_err(setup)?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('idem.migrate'))")
            .execute(&mut *tx)
            .await
            .map_err(setup)?;
        if let (Some(create_schema), Some(schema)) =
            (&self.queries.create_schema, self.table.schema_name())
        {
            let exists: bool = sqlx::query_scalar(crate::queries::SCHEMA_EXISTS)
                .bind(schema)
                .fetch_one(&mut *tx)
                .await
                .map_err(setup)?;
            if !exists {
                sqlx::raw_sql(AssertSqlSafe(create_schema.to_string()))
                    .execute(&mut *tx)
                    .await
                    .map_err(setup)?;
            }
        }
        sqlx::raw_sql(AssertSqlSafe(self.queries.migrate.to_string()))
            .execute(&mut *tx)
            .await
            .map_err(setup)?;
        tx.commit().await.map_err(setup)
    }

    /// Marks the key completed inside the caller's own transaction, so that business rows
    /// written in the same transaction and the key's completion commit together, or
    /// neither does.
    ///
    /// - `conn` is whatever sqlx users hold: `&mut Transaction<'_, Postgres>` (the usual
    ///   case), `&mut PgConnection`, or anything else that implements [`Acquire`].
    /// - `completion` comes from `Context::prepare_completion` (idem-core's driver)
    ///   inside the work: the bytes are exactly those the driver stores, and once the
    ///   transaction commits the driver answers with exactly that value (a heartbeat that
    ///   meanwhile finds the record completed does not turn it into a lost lease, and one
    ///   that waits for the row lock this transaction holds does not stall the work).
    /// - Same rules as [`Store::complete`]: fenced by the lease; `Fenced` changes nothing,
    ///   and the caller should roll back.
    /// - If the transaction rolls back, the record stays in progress under the lease and is
    ///   claimable again once the lease is released or expires.
    /// - Begin the transaction inside the work, after the claim. Under REPEATABLE READ or
    ///   SERIALIZABLE its snapshot is taken at its first statement: one taken before the
    ///   claim cannot see the lease, and the completion answers `Fenced`; a write to the
    ///   record after the snapshot (a heartbeat's renewal, say) makes it answer
    ///   [`StoreError::Busy`], PostgreSQL's serialization failure: roll back and retry.
    ///   Calling `complete_in` first in such a transaction keeps that window small.
    ///
    /// ```no_run
    /// use idem_core::{Fingerprint, Idempotency, Key, WorkError, store::WriteOutcome};
    /// use idem_postgres::PostgresStore;
    ///
    /// # async fn pay(idem: Idempotency<PostgresStore>) -> Result<(), Box<dyn std::error::Error>> {
    /// let key = Key::new("shop/checkout", "order-7")?;
    /// let store = idem.store().clone();
    /// let outcome = idem
    ///     .execute(&key, Fingerprint::of_bytes("amount=500"), |ctx| async move {
    ///         let receipt = serde_json::json!({"paid": 500});
    ///         let completion = ctx.prepare_completion(&receipt)?;
    ///         let retry = |e: sqlx::Error| WorkError::Retryable(e.to_string());
    ///         let mut tx = store.pool().begin().await.map_err(retry)?;
    ///         sqlx::query("INSERT INTO ledger (order_id, cents) VALUES ($1, $2)")
    ///             .bind("order-7")
    ///             .bind(500_i64)
    ///             .execute(&mut *tx)
    ///             .await
    ///             .map_err(retry)?;
    ///         match store.complete_in(&mut tx, &completion).await {
    ///             // The debit and the completion land together.
    ///             Ok(WriteOutcome::Applied) => tx.commit().await.map_err(|e| WorkError::Unknown(e.to_string()))?,
    ///             // Another attempt owns the key: the transaction rolls back when dropped.
    ///             _ => return Err(WorkError::Retryable("lost the key".to_string())),
    ///         }
    ///         Ok(receipt)
    ///     })
    ///     .await?;
    /// # let _ = outcome;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// A [`StoreError`] when the database fails; roll the transaction back then.
    pub async fn complete_in<'c, A>(
        &self,
        conn: A,
        completion: &Completion,
    ) -> Result<WriteOutcome, StoreError>
    where
        A: Acquire<'c, Database = Postgres>,
    {
        let lease = completion.lease();
        let mut conn = conn
            .acquire()
            .await
            .map_err(|err| map(Operation::Complete, err).for_key(&lease.key))?;
        let applied = self
            .finish_on(
                &mut conn,
                Operation::Complete,
                lease,
                completion.bytes(),
                "completed",
            )
            .await?;
        if applied {
            completion.written();
            Ok(WriteOutcome::Applied)
        } else {
            Ok(WriteOutcome::Fenced)
        }
    }

    fn fenced<'q>(&self, sql: &Arc<str>, lease: &'q Lease) -> Query<'q, Postgres, PgArguments> {
        sqlx::query(AssertSqlSafe(Arc::clone(sql)))
            .bind(lease.key.scope())
            .bind(lease.key.key())
            .bind(token(lease))
            .bind(&lease.attempt.as_bytes()[..])
    }

    /// Writes the result on `conn`, then, when that wrote nothing, reads whether this owner
    /// already stored it: two statements, so that the usual case is one plain update.
    async fn finish_on(
        &self,
        conn: &mut PgConnection,
        operation: Operation,
        lease: &Lease,
        response: &[u8],
        state: &'static str,
    ) -> Result<bool, StoreError> {
        let failed = |err| map(operation, err).for_key(&lease.key);
        let wrote = self
            .fenced(&self.queries.finish, lease)
            .bind(response)
            .bind(state)
            .bind(millis(lease.retention))
            .fetch_optional(&mut *conn)
            .await
            .map_err(failed)?
            .is_some();
        if wrote {
            return Ok(true);
        }
        match self
            .fenced(&self.queries.finished, lease)
            .bind(state)
            .fetch_optional(&mut *conn)
            .await
            .map_err(failed)?
        {
            Some(row) => row.try_get("applied").map_err(failed),
            None => Ok(false),
        }
    }

    async fn finish(
        &self,
        operation: Operation,
        lease: &Lease,
        response: &[u8],
        state: &'static str,
    ) -> Result<WriteOutcome, StoreError> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|err| map(operation, err).for_key(&lease.key))?;
        let applied = self
            .finish_on(&mut conn, operation, lease, response, state)
            .await?;
        Ok(if applied {
            WriteOutcome::Applied
        } else {
            WriteOutcome::Fenced
        })
    }

    async fn fenced_update(
        &self,
        operation: Operation,
        lease: &Lease,
        query: Query<'_, Postgres, PgArguments>,
    ) -> Result<WriteOutcome, StoreError> {
        let done = query
            .execute(&self.pool)
            .await
            .map_err(|err| map(operation, err).for_key(&lease.key))?;
        Ok(if done.rows_affected() == 1 {
            WriteOutcome::Applied
        } else {
            WriteOutcome::Fenced
        })
    }

    /// A claim whose statement wrote (a takeover, or an absent record claimed afresh) and
    /// committed before its row proved undecodable (a record written by something other
    /// than idem): ends that lease at once, so that no live lease that nobody holds stands
    /// on the record (operators' listings would show it as work in flight). Only the lease
    /// ends: the record stays present, and the next claim meets the same error. Best
    /// effort: if this fails too, the lease runs out by itself.
    async fn end_undecodable_claim(&self, request: &ClaimRequest, row: &PgRow) {
        let Ok(token) = row.try_get::<i64, _>("token") else {
            return;
        };
        let _ = sqlx::query(AssertSqlSafe(Arc::clone(&self.queries.end_lease)))
            .bind(request.key.scope())
            .bind(request.key.key())
            .bind(token)
            .bind(&request.attempt.as_bytes()[..])
            .execute(&self.pool)
            .await;
    }

    async fn select(&self, key: &Key, operation: Operation) -> Result<Option<PgRow>, StoreError> {
        sqlx::query(AssertSqlSafe(Arc::clone(&self.queries.select)))
            .bind(key.scope())
            .bind(key.key())
            .fetch_optional(&self.pool)
            .await
            .map_err(|err| map(operation, err).for_key(key))
    }
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.table)
            .field("pool_size", &self.pool.size())
            .finish()
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let key = &request.key;
        for round in 0..CLAIM_ATTEMPTS {
            // The first form writes only a new row, and PostgreSQL sets it up for less
            // (claim.sql); every later turn runs the second, which may write over a row.
            let first = round == 0;
            let statement = if first {
                &self.queries.claim
            } else {
                &self.queries.claim_update
            };
            let row = sqlx::query(AssertSqlSafe(Arc::clone(statement)))
                .bind(key.scope())
                .bind(key.key())
                .bind(&request.fingerprint.as_bytes()[..])
                .bind(&request.attempt.as_bytes()[..])
                .bind(millis(request.lease))
                .bind(millis(request.retention))
                .fetch_optional(&self.pool)
                .await
                .map_err(|err| map(Operation::Claim, err).for_key(key))?;
            // No row from the first form: a row is there that it may not write (absent, or
            // an ended lease to take over), or one inserted after its snapshot: the second
            // form decides. No row from the second: the record changed under it (a
            // concurrent transaction inserted or wrote it after the statement's snapshot
            // was taken, and the upsert's condition refused the committed row). One more
            // read sees it.
            let (claimed, row) = match row {
                Some(row) => {
                    let claimed: bool = row
                        .try_get("claimed")
                        .map_err(|err| map(Operation::Claim, err).for_key(key))?;
                    (claimed, row)
                }
                None if first => continue,
                None => match self.select(key, Operation::Claim).await? {
                    Some(row) => (false, row),
                    None => continue, // purged meanwhile: claim again
                },
            };
            let decoded = match rows::decode(key, &row, Operation::Claim) {
                Ok(decoded) => decoded,
                Err(err) => {
                    if claimed {
                        self.end_undecodable_claim(request, &row).await;
                    }
                    return Err(err);
                }
            };
            if claimed {
                return Ok(ClaimOutcome::claimed(
                    machine::lease_of(&decoded.record, request.retention),
                    decoded.resumed,
                    decoded.record.steps,
                ));
            }
            // The record as it is: the state machine answers for it. claim.sql never takes
            // over a present row at the last token (no next token could fence its owner)
            // and returns it instead: the machine refuses the takeover. An absent one is
            // replaced by the statement's second form from token 1.
            let answer = machine::claim(Some(&decoded.record), request, decoded.now)
                .map_err(|refusal| StoreError::from(refusal).for_key(key))?;
            if answer.write.is_none() {
                return Ok(answer.outcome);
            }
            // Otherwise a write was due (the first form writes no takeover, or the row
            // changed since it was read): the next turn runs the second form.
        }
        Err(StoreError::Busy {
            operation: Operation::Claim,
            source: "the record kept changing under concurrent claims; retry".into(),
        })
    }

    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.finish(Operation::Complete, lease, response, "completed")
            .await
    }

    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.finish(Operation::Fail, lease, response, "failed")
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        let query = self.fenced(&self.queries.release, lease);
        self.fenced_update(Operation::Release, lease, query).await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        let row = self
            .fenced(&self.queries.renew, lease)
            .bind(millis(extend))
            .bind(millis(lease.retention))
            .fetch_optional(&self.pool)
            .await
            .map_err(|err| map(Operation::Renew, err).for_key(&lease.key))?;
        let Some(row) = row else {
            return Ok(RenewOutcome::Fenced);
        };
        let lease_until: i64 = row
            .try_get("lease_until_ms")
            .map_err(|err| map(Operation::Renew, err).for_key(&lease.key))?;
        let lease_until = rows::millis(lease_until).map_err(|err| err.for_key(&lease.key))?;
        Ok(RenewOutcome::Renewed(
            lease.clone().with_lease_until(lease_until),
        ))
    }

    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        let query = self
            .fenced(&self.queries.checkpoint, lease)
            .bind(step.as_str())
            .bind(value)
            .bind(millis(lease.retention));
        self.fenced_update(Operation::Checkpoint, lease, query)
            .await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let Some(row) = self.select(key, Operation::Get).await? else {
            return Ok(None);
        };
        let decoded = rows::decode(key, &row, Operation::Get)?;
        Ok(machine::visible(Some(&decoded.record), decoded.now).cloned())
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let mut purged = 0;
        while purged < limit {
            let batch = (limit - purged).min(PURGE_BATCH);
            let done = sqlx::query(AssertSqlSafe(Arc::clone(&self.queries.purge)))
                .bind(i64::try_from(batch).unwrap_or(i64::MAX))
                .execute(&self.pool)
                .await
                .map_err(|err| map(Operation::PurgeExpired, err))?;
            let deleted = usize::try_from(done.rows_affected()).unwrap_or(usize::MAX);
            purged += deleted;
            if deleted < batch {
                break;
            }
        }
        Ok(purged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn debug_names_the_table_and_the_pool_never_the_password() {
        // A lazy pool: nothing connects, so no server is needed.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://app:s3cret@127.0.0.1:1/app")
            .expect("a valid URL");
        let store = PostgresStore::builder(pool)
            .table("billing.idem")
            .expect("a valid name")
            .build();
        let shown = format!("{store:?}");
        assert_eq!(
            shown,
            r#"PostgresStore { table: "billing"."idem", pool_size: 0 }"#
        );
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
