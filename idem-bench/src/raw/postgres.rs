//! Raw baseline for PostgreSQL: `INSERT ... ON CONFLICT` (returning the existing row, so a
//! replay is one statement) and, for a fresh key, one `UPDATE`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::{PgPool, Row};

use super::{PlainLoop, plain_loops};

use crate::target::{BoxError, Done, RESPONSE, Target};

pub(crate) struct RawPostgres {
    pool: PgPool,
    claim: String,
    complete: String,
}

impl RawPostgres {
    pub(crate) async fn new(pool: PgPool, table: &str) -> Result<Self, BoxError> {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {table};
             CREATE TABLE {table} (k text PRIMARY KEY, state text NOT NULL, response bytea)"
        )))
        .execute(&pool)
        .await?;
        Ok(Self {
            pool,
            claim: format!(
                "INSERT INTO {table} AS r (k, state) VALUES ($1, 'p')
                 ON CONFLICT (k) DO UPDATE SET k = r.k
                 RETURNING r.state, (xmax = 0) AS inserted"
            ),
            complete: format!("UPDATE {table} SET state = 'c', response = $2 WHERE k = $1"),
        })
    }
}

#[async_trait]
impl Target for RawPostgres {
    async fn execute(&self, key: &str) -> Result<Done, BoxError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(self.claim.clone()))
            .bind(key)
            .fetch_one(&self.pool)
            .await?;
        let state: String = row.try_get("state")?;
        let inserted: bool = row.try_get("inserted")?;
        if state == "c" {
            return Ok(Done::Replayed);
        }
        if !inserted {
            return Ok(Done::Busy);
        }
        sqlx::query(sqlx::AssertSqlSafe(self.complete.clone()))
            .bind(key)
            .bind(RESPONSE)
            .execute(&self.pool)
            .await?;
        Ok(Done::Executed)
    }
}

#[async_trait]
impl PlainLoop for RawPostgres {
    async fn replays(
        &self,
        clients: usize,
        duration: Duration,
        pool: Arc<Vec<String>>,
    ) -> Result<u64, BoxError> {
        let (connections, claim) = (self.pool.clone(), Arc::new(self.claim.clone()));
        plain_loops(clients, duration, move |client, op| {
            let (connections, claim, pool) =
                (connections.clone(), Arc::clone(&claim), Arc::clone(&pool));
            async move {
                let key = &pool[(client * 7919 + op as usize) % pool.len()];
                let (state, _inserted): (String, bool) =
                    sqlx::query_as(sqlx::AssertSqlSafe(claim.as_str()))
                        .bind(key)
                        .fetch_one(&connections)
                        .await?;
                if state == "c" {
                    Ok(())
                } else {
                    Err("the plain loop met a key that was not completed".into())
                }
            }
        })
        .await
    }
}
