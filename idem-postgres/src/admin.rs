//! The operator's side of the PostgreSQL store: SQL over the indexes the migration creates.

use std::sync::Arc;

use async_trait::async_trait;
use idem_core::{
    Admin, Key, State, StoreError, Timestamp, admin::Cursor, admin::ListQuery, admin::Listed,
    admin::Page, admin::ReleaseKeyOutcome, admin::Stats, machine, raw::MAX_TOKEN,
    raw::duration_millis, record::AttemptId, store::Operation,
};
use sqlx::{AssertSqlSafe, Row};

use crate::errors::map;
use crate::rows::{self, PgTime};
use crate::store::PostgresStore;

/// A listing's cursor here: [`Cursor::at`] the creation time in microseconds (the
/// column's precision, so no two records share a position), then the key.
fn cursor(created_us: i64, key: &Key) -> Cursor {
    Cursor::at(u64::try_from(created_us).unwrap_or_default(), key)
}

fn position(cursor: &Cursor) -> Result<(i64, Key), StoreError> {
    let (micros, key) = cursor.parts()?;
    Ok((
        i64::try_from(micros).map_err(|_| StoreError::InvalidCursor)?,
        key,
    ))
}

fn count(row: &sqlx::postgres::PgRow, column: &str) -> Result<u64, StoreError> {
    row.try_get::<i64, _>(column)
        .map(|n| n.max(0) as u64)
        .map_err(|err| map(Operation::Stats, err))
}

#[async_trait]
impl Admin for PostgresStore {
    async fn list(&self, query: &ListQuery) -> Result<Page, StoreError> {
        let size = query.page_size();
        let after = query.after.as_ref().map(position).transpose()?;
        let stuck = query
            .stuck_for
            .map(|d| i64::try_from(duration_millis(d)).unwrap_or(i64::MAX));
        let rows = sqlx::query(AssertSqlSafe(Arc::clone(&self.queries().admin_list)))
            .bind(query.state.map(State::as_str))
            .bind(stuck)
            .bind(query.scope_prefix.as_deref())
            .bind(after.as_ref().map(|(micros, _)| *micros))
            .bind(after.as_ref().map(|(_, key)| key.scope()))
            .bind(after.as_ref().map(|(_, key)| key.key()))
            .bind(i64::try_from(size + 1).unwrap_or(i64::MAX))
            .bind(query.with_responses)
            .fetch_all(self.pool())
            .await
            .map_err(|err| map(Operation::List, err))?;
        let mut listed = Vec::with_capacity(rows.len());
        let mut positions = Vec::with_capacity(rows.len());
        let mut now = Timestamp::now();
        for row in &rows {
            let scope: String = row
                .try_get("scope")
                .map_err(|err| map(Operation::List, err))?;
            let key: String = row
                .try_get("key")
                .map_err(|err| map(Operation::List, err))?;
            let key = Key::new(scope, key).map_err(|err| StoreError::Corrupt {
                key: None,
                what: "a stored scope or key that breaks the key rules",
                source: Some(err.into()),
            })?;
            let decoded = rows::decode(&key, row, Operation::List)?;
            now = decoded.now;
            let response_len: Option<i32> = row
                .try_get("response_len")
                .map_err(|err| map(Operation::List, err))?;
            let created_us = row
                .try_get::<PgTime, _>("created_at")
                .map_err(|err| map(Operation::List, err))?
                .unix_micros()
                .ok_or_else(|| StoreError::Corrupt {
                    key: Some(key.short_hash()),
                    what: "a creation time past what a cursor holds",
                    source: None,
                })?;
            let mut entry = Listed::new(decoded.record, query.with_responses);
            entry.response_len = response_len.map(|n| n.max(0) as usize);
            positions.push(created_us);
            listed.push(entry);
        }
        let next = (listed.len() > size)
            .then(|| cursor(positions[size - 1], &listed[size - 1].record.key));
        listed.truncate(size);
        Ok(Page::new(listed, next, now))
    }

    async fn stats(&self, top_scopes: usize) -> Result<Stats, StoreError> {
        let get = |err| map(Operation::Stats, err);
        // One statement: every figure from one snapshot.
        let rows = sqlx::query(AssertSqlSafe(Arc::clone(&self.queries().admin_stats)))
            .bind(i64::try_from(top_scopes).unwrap_or(i64::MAX))
            .fetch_all(self.pool())
            .await
            .map_err(get)?;
        let Some(row) = rows.first() else {
            return Err(StoreError::Corrupt {
                key: None,
                what: "a stats query that answered no row",
                source: None,
            });
        };
        let mut stats = Stats::default();
        stats.total = count(row, "total")?;
        stats.in_progress = count(row, "in_progress")?;
        stats.completed = count(row, "completed")?;
        stats.failed = count(row, "failed")?;
        stats.in_progress_live = count(row, "live")?;
        stats.in_progress_lease_ended = count(row, "lease_ended")?;
        stats.absent = count(row, "absent")?;
        stats.oldest_in_progress = row
            .try_get::<Option<PgTime>, _>("oldest")
            .map_err(get)?
            .map(|time| rows::millis(time.unix_millis()))
            .transpose()?;
        stats.now = rows::millis(
            row.try_get::<PgTime, _>("read_at")
                .map_err(get)?
                .unix_millis(),
        )?;
        for row in &rows {
            let scope: Option<String> = row.try_get("scope").map_err(get)?;
            let records: Option<i64> = row.try_get("records").map_err(get)?;
            if let (Some(scope), Some(records)) = (scope, records) {
                stats.top_scopes.push((scope, records.max(0) as u64));
            }
        }
        Ok(stats)
    }

    async fn release_key(&self, key: &Key) -> Result<ReleaseKeyOutcome, StoreError> {
        let failed = |err| map(Operation::ReleaseKey, err).for_key(key);
        let attempt = AttemptId::random();
        let Some(row) = sqlx::query(AssertSqlSafe(Arc::clone(&self.queries().admin_release)))
            .bind(key.scope())
            .bind(key.key())
            .bind(&attempt.as_bytes()[..])
            .fetch_optional(self.pool())
            .await
            .map_err(failed)?
        else {
            return Ok(ReleaseKeyOutcome::NotFound);
        };
        let token: i64 = row.try_get("token").map_err(failed)?;
        let state: String = row.try_get("state").map_err(failed)?;
        let released: bool = row.try_get("released").map_err(failed)?;
        let present: bool = row.try_get("present").map_err(failed)?;
        let valid: bool = row.try_get("valid").map_err(failed)?;
        if released {
            return Ok(ReleaseKeyOutcome::Released {
                token: u64::try_from(token).unwrap_or_default(),
            });
        }
        // A row idem did not write is never released, finished or absent to an operator:
        // `get` and claims refuse it too.
        if !valid {
            return Err(StoreError::Corrupt {
                key: Some(key.short_hash()),
                what: "a record idem did not write",
                source: None,
            });
        }
        // Not released: the row was written back as it was, so `present` is what it was.
        let state = State::parse(&state).ok_or_else(|| StoreError::Corrupt {
            key: Some(key.short_hash()),
            what: "an unknown state",
            source: None,
        })?;
        Ok(match (present, state) {
            (true, State::InProgress) if u64::try_from(token).is_ok_and(|t| t >= MAX_TOKEN) => {
                return Err(StoreError::from(machine::TokenAtLimit).for_key(key));
            }
            (true, State::InProgress) => {
                return Err(StoreError::Corrupt {
                    key: Some(key.short_hash()),
                    what: "a present in-progress record the release left alone",
                    source: None,
                });
            }
            (true, state) => ReleaseKeyOutcome::Finished(state),
            (false, _) => ReleaseKeyOutcome::NotFound,
        })
    }

    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        let done = sqlx::query(AssertSqlSafe(Arc::clone(&self.queries().admin_delete)))
            .bind(key.scope())
            .bind(key.key())
            .execute(self.pool())
            .await
            .map_err(|err| map(Operation::Delete, err).for_key(key))?;
        Ok(done.rows_affected() == 1)
    }

    async fn raw(&self, key: &Key) -> Result<Option<idem_core::admin::RawRecord>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.queries().admin_raw)))
            .bind(key.scope())
            .bind(key.key())
            .fetch_optional(self.pool())
            .await
            .map_err(|err| map(Operation::Get, err).for_key(key))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let read = |err| map(Operation::Get, err).for_key(key);
        let fields: String = row.try_get("fields").map_err(read)?;
        let response_len: Option<i32> = row.try_get("response_len").map_err(read)?;
        let fields: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&fields).unwrap_or_default();
        let mut raw: idem_core::admin::RawRecord = fields
            .into_iter()
            .map(|(name, value)| match value {
                serde_json::Value::String(text) => (name, text),
                other => (name, other.to_string()),
            })
            .collect();
        if let Some(len) = response_len {
            raw.push(("response".to_owned(), format!("{len} bytes")));
        }
        Ok(Some(raw))
    }
}
