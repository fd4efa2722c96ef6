//! The operator's side of the SQLite store: SQL over the indexes `schema.sql` creates.

use async_trait::async_trait;
use idem_core::machine;
use idem_core::{
    Admin, Key, StoreError, Timestamp, admin::Cursor, admin::ListQuery, admin::Listed, admin::Page,
    admin::ReleaseKeyOutcome, admin::Stats, record::AttemptId, store::Operation,
};
use rusqlite::{TransactionBehavior, params};

use crate::errors::{RowError, map};
use crate::rows;
use crate::store::SqliteStore;

const LIST: &str = include_str!("../sql/admin_list.sql");
const LIST_STUCK: &str = include_str!("../sql/admin_list_stuck.sql");
const STATS: &str = include_str!("../sql/admin_stats.sql");
const TOP_SCOPES: &str = include_str!("../sql/admin_top_scopes.sql");
const DELETE_RECORD: &str = include_str!("../sql/delete_record.sql");
const DELETE_STEPS: &str = include_str!("../sql/delete_steps.sql");
const RAW_RECORD: &str = include_str!("../sql/admin_raw_record.sql");
const RAW_STEPS: &str = include_str!("../sql/admin_raw_steps.sql");

fn sql_millis(at: Timestamp) -> i64 {
    i64::try_from(at.as_unix_millis()).unwrap_or(i64::MAX)
}

#[async_trait]
impl Admin for SqliteStore {
    async fn list(&self, query: &ListQuery) -> Result<Page, StoreError> {
        let query = query.clone();
        let after = query.after.as_ref().map(Cursor::position).transpose()?;
        let now = self.now();
        self.run(Operation::List, move |connection| {
            let mut page = || -> Result<Page, RowError> {
                // One read transaction: the page and each record from one snapshot.
                let connection = connection.transaction()?;
                let size = query.page_size();
                let stuck = query
                    .stuck_for
                    .map(|d| i64::try_from(idem_core::raw::duration_millis(d)).unwrap_or(i64::MAX));
                let (after_at, after_scope, after_key) = match &after {
                    Some((at, key)) => (
                        Some(sql_millis(*at)),
                        Some(key.scope().to_owned()),
                        Some(key.key().to_owned()),
                    ),
                    None => (None, None, None),
                };
                // Stuck work has a query of its own, which the lease index answers.
                let sql = if stuck.is_some() { LIST_STUCK } else { LIST };
                let keys: Vec<(String, String)> = connection
                    .prepare_cached(sql)?
                    .query_map(
                        params![
                            sql_millis(now),
                            query.state.map(|s| s.as_str()),
                            stuck,
                            query.scope_prefix,
                            after_at,
                            after_scope,
                            after_key,
                            i64::try_from(size + 1).unwrap_or(i64::MAX),
                        ],
                        |row| Ok((row.get(0)?, row.get(1)?)),
                    )?
                    .collect::<Result<_, _>>()?;
                let mut records = Vec::with_capacity(keys.len());
                for (scope, key) in keys {
                    let key = Key::new(scope, key).map_err(|err| {
                        RowError::Store(StoreError::Corrupt {
                            key: None,
                            what: "a stored scope or key that breaks the key rules",
                            source: Some(err.into()),
                        })
                    })?;
                    if let Some(record) = rows::read(&connection, &key)? {
                        records.push(record);
                    }
                }
                let next = (records.len() > size).then(|| Cursor::after_record(&records[size - 1]));
                records.truncate(size);
                let records = records
                    .into_iter()
                    .map(|record| Listed::new(record, query.with_responses))
                    .collect();
                Ok(Page::new(records, next, now))
            };
            page().map_err(|err| err.into_store_error(Operation::List))
        })
        .await
    }

    async fn stats(&self, top_scopes: usize) -> Result<Stats, StoreError> {
        let now = self.now();
        self.run(Operation::Stats, move |connection| {
            let mut count = || -> Result<Stats, rusqlite::Error> {
                // One read transaction: the totals and the top scopes from one snapshot.
                let connection = connection.transaction()?;
                let mut stats = connection.query_row(STATS, params![sql_millis(now)], |row| {
                    let n = |i| row.get::<_, i64>(i).map(|v| v.max(0) as u64);
                    let oldest: Option<i64> = row.get(7)?;
                    let mut stats = Stats::default();
                    stats.total = n(0)?;
                    stats.in_progress = n(1)?;
                    stats.completed = n(2)?;
                    stats.failed = n(3)?;
                    stats.in_progress_live = n(4)?;
                    stats.in_progress_lease_ended = n(5)?;
                    stats.absent = n(6)?;
                    stats.oldest_in_progress =
                        oldest.map(|ms| Timestamp::from_unix_millis(ms.max(0) as u64));
                    Ok(stats)
                })?;
                stats.top_scopes = connection
                    .prepare_cached(TOP_SCOPES)?
                    .query_map(
                        params![i64::try_from(top_scopes).unwrap_or(i64::MAX)],
                        |row| Ok((row.get(0)?, row.get::<_, i64>(1)?.max(0) as u64)),
                    )?
                    .collect::<Result<_, _>>()?;
                stats.now = now;
                Ok(stats)
            };
            count().map_err(|err| map(Operation::Stats, err))
        })
        .await
    }

    async fn release_key(&self, key: &Key) -> Result<ReleaseKeyOutcome, StoreError> {
        let attempt = AttemptId::random();
        self.transition(Operation::ReleaseKey, key, move |record, now| {
            machine::release_key(record, attempt, now).map_err(StoreError::from)
        })
        .await
    }

    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        let key = key.clone();
        self.run(Operation::Delete, move |connection| {
            let mut delete = || -> Result<bool, rusqlite::Error> {
                let tx = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let deleted = tx
                    .prepare_cached(DELETE_RECORD)?
                    .execute(params![key.scope(), key.key()])?;
                tx.prepare_cached(DELETE_STEPS)?
                    .execute(params![key.scope(), key.key()])?;
                tx.commit()?;
                Ok(deleted == 1)
            };
            delete().map_err(|err| map(Operation::Delete, err))
        })
        .await
    }

    async fn raw(&self, key: &Key) -> Result<Option<idem_core::admin::RawRecord>, StoreError> {
        let key = key.clone();
        self.run(Operation::Get, move |connection| {
            let mut read = || -> Result<Option<idem_core::admin::RawRecord>, rusqlite::Error> {
                // One read transaction: the record and its steps from one snapshot.
                let connection = connection.transaction()?;
                const COLUMNS: [&str; 7] = [
                    "fingerprint",
                    "state",
                    "token",
                    "attempt",
                    "lease_until",
                    "created_at",
                    "expires_at",
                ];
                let mut statement = connection.prepare_cached(RAW_RECORD)?;
                let mut rows = statement.query(params![key.scope(), key.key()])?;
                let Some(row) = rows.next()? else {
                    return Ok(None);
                };
                let mut fields = Vec::new();
                for (index, name) in COLUMNS.iter().enumerate() {
                    fields.push(((*name).to_owned(), row.get::<_, String>(index)?));
                }
                if let Some(len) = row.get::<_, Option<i64>>(7)? {
                    fields.push(("response".to_owned(), format!("{len} bytes")));
                }
                drop(rows);
                let mut steps = connection.prepare_cached(RAW_STEPS)?;
                let mut rows = steps.query(params![key.scope(), key.key()])?;
                while let Some(row) = rows.next()? {
                    let name: String = row.get(0)?;
                    let len: i64 = row.get(1)?;
                    fields.push((format!("step {name}"), format!("{len} bytes")));
                }
                Ok(Some(fields))
            };
            read().map_err(|err| map(Operation::Get, err))
        })
        .await
    }
}
