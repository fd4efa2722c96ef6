//! Decoding a row of `columns.sql` into a record, through core's validated builder.

use idem_core::{Key, Record, StoreError, Timestamp, store::Operation};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::errors::map;

/// A decoded row: the record, whether its last claim was a takeover, and the database's
/// `now()` when the statement ran.
pub(crate) struct Decoded {
    pub(crate) record: Record,
    pub(crate) resumed: bool,
    pub(crate) now: Timestamp,
}

pub(crate) fn millis(value: i64) -> Result<Timestamp, StoreError> {
    u64::try_from(value)
        .map(Timestamp::from_unix_millis)
        .map_err(|_| StoreError::Corrupt {
            key: None,
            what: "a time before 1970",
            source: None,
        })
}

pub(crate) fn decode(key: &Key, row: &PgRow, operation: Operation) -> Result<Decoded, StoreError> {
    let column = |err| map(operation, err);
    let names: Vec<String> = row.try_get("step_names").map_err(column)?;
    let values: Vec<Vec<u8>> = row.try_get("step_values").map_err(column)?;
    if names.len() != values.len() {
        return Err(StoreError::Corrupt {
            key: None,
            what: "steps whose names and values differ in number",
            source: None,
        });
    }
    let mut parts = Record::parts(key.clone())
        .fingerprint(&row.try_get::<Vec<u8>, _>("fingerprint").map_err(column)?)
        .state(row.try_get::<String, _>("state").map_err(column)?)
        .token(row.try_get::<i64, _>("token").map_err(column)?)
        .attempt(&row.try_get::<Vec<u8>, _>("attempt").map_err(column)?)
        .lease_until_millis(row.try_get::<i64, _>("lease_until_ms").map_err(column)?)
        .created_at_millis(row.try_get::<i64, _>("created_at_ms").map_err(column)?)
        .expires_at_millis(row.try_get::<i64, _>("expires_at_ms").map_err(column)?)
        .response(row.try_get("response").map_err(column)?);
    for (name, value) in names.into_iter().zip(values) {
        parts = parts.step(name, value);
    }
    Ok(Decoded {
        record: parts.build()?,
        resumed: row.try_get("resumed").map_err(column)?,
        now: millis(row.try_get("now_ms").map_err(column)?)?,
    })
}
