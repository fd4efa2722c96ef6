//! Reading and writing one record (and its steps) inside a transaction.

use idem_core::machine::Transition;
use idem_core::{Key, Record, StoreError, Timestamp};
use rusqlite::{Connection, OptionalExtension, params};

use crate::errors::RowError;

const SELECT_RECORD: &str = include_str!("../sql/select_record.sql");
const SELECT_STEPS: &str = include_str!("../sql/select_steps.sql");
const UPSERT_RECORD: &str = include_str!("../sql/upsert_record.sql");
const DELETE_STEPS: &str = include_str!("../sql/delete_steps.sql");
const INSERT_STEP: &str = include_str!("../sql/insert_step.sql");

/// Runs one transition of the state machine on `conn`, which must already be inside a
/// transaction that holds the write lock (`BEGIN IMMEDIATE`).
pub(crate) fn apply<O>(
    conn: &Connection,
    key: &Key,
    now: Timestamp,
    step: impl FnOnce(Option<&Record>, Timestamp) -> Result<Transition<O>, StoreError>,
) -> Result<O, RowError> {
    let existing = read(conn, key)?;
    let Transition { outcome, write } = step(existing.as_ref(), now)?;
    if let Some(record) = write {
        self::write(conn, &record, existing.as_ref())?;
    }
    Ok(outcome)
}

fn sql_millis(at: Timestamp) -> i64 {
    i64::try_from(at.as_unix_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn read(conn: &Connection, key: &Key) -> Result<Option<Record>, RowError> {
    let row = conn
        .prepare_cached(SELECT_RECORD)?
        .query_row(params![key.scope(), key.key()], |row| {
            Ok((
                row.get::<_, Vec<u8>>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, i64>(2)?,
                row.get::<_, Vec<u8>>(3)?,
                row.get::<_, i64>(4)?,
                row.get::<_, i64>(5)?,
                row.get::<_, i64>(6)?,
                row.get::<_, Option<Vec<u8>>>(7)?,
            ))
        })
        .optional()?;
    let Some((fingerprint, state, token, attempt, lease_until, created_at, expires_at, response)) =
        row
    else {
        return Ok(None);
    };
    let mut parts = Record::parts(key.clone())
        .fingerprint(&fingerprint)
        .state(state)
        .token(token)
        .attempt(&attempt)
        .lease_until_millis(lease_until)
        .created_at_millis(created_at)
        .expires_at_millis(expires_at)
        .response(response);
    let mut statement = conn.prepare_cached(SELECT_STEPS)?;
    let mut rows = statement.query(params![key.scope(), key.key()])?;
    while let Some(row) = rows.next()? {
        parts = parts.step(row.get::<_, String>(0)?, row.get(1)?);
    }
    Ok(Some(parts.build()?))
}

fn write(conn: &Connection, record: &Record, existing: Option<&Record>) -> Result<(), RowError> {
    let key = &record.key;
    conn.prepare_cached(UPSERT_RECORD)?.execute(params![
        key.scope(),
        key.key(),
        record.fingerprint.as_bytes(),
        record.state.as_str(),
        i64::try_from(record.token).map_err(|_| StoreError::Corrupt {
            key: None,
            what: "a token past i64",
            source: None,
        })?,
        record.attempt.as_bytes(),
        sql_millis(record.lease_until),
        sql_millis(record.created_at),
        sql_millis(record.expires_at),
        record.response,
    ])?;
    if existing.map(|old| &old.steps) != Some(&record.steps) {
        conn.prepare_cached(DELETE_STEPS)?
            .execute(params![key.scope(), key.key()])?;
        let mut insert = conn.prepare_cached(INSERT_STEP)?;
        for (step, value) in &record.steps {
            insert.execute(params![key.scope(), key.key(), step, value])?;
        }
    }
    Ok(())
}
