//! Decoding a row of `columns.sql` into a record, through core's validated builder.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
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
    let steps = steps(row.try_get("steps").map_err(column)?).map_err(|err| err.for_key(key))?;
    let mut parts = Record::parts(key.clone())
        .fingerprint(&row.try_get::<Vec<u8>, _>("fingerprint").map_err(column)?)
        .state(row.try_get::<String, _>("state").map_err(column)?)
        .token(row.try_get::<i64, _>("token").map_err(column)?)
        .attempt(&row.try_get::<Vec<u8>, _>("attempt").map_err(column)?)
        .lease_until_millis(row.try_get::<i64, _>("lease_until_ms").map_err(column)?)
        .created_at_millis(row.try_get::<i64, _>("created_at_ms").map_err(column)?)
        .expires_at_millis(row.try_get::<i64, _>("expires_at_ms").map_err(column)?)
        .response(row.try_get("response").map_err(column)?);
    for (name, value) in steps {
        parts = parts.step(name, value);
    }
    Ok(Decoded {
        record: parts.build()?,
        resumed: row.try_get("resumed").map_err(column)?,
        now: millis(row.try_get("now_ms").map_err(column)?)?,
    })
}

/// The steps column as `checkpoint.sql` writes it: a JSON object of step names to the
/// base64 of their values, which PostgreSQL's `encode` breaks into lines of 76 characters.
/// `None` when the statement left the steps out.
fn steps(text: Option<String>) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    let corrupt = |what, source: Box<dyn std::error::Error + Send + Sync>| StoreError::Corrupt {
        key: None,
        what,
        source: Some(source),
    };
    let encoded: BTreeMap<String, String> = serde_json::from_str(&text)
        .map_err(|err| corrupt("steps that are not an object of texts", err.into()))?;
    encoded
        .into_iter()
        .map(|(name, value)| {
            let mut value = value.into_bytes();
            value.retain(|byte| !byte.is_ascii_whitespace());
            STANDARD
                .decode(&value)
                .map(|value| (name, value))
                .map_err(|err| corrupt("a step value that is not base64", err.into()))
        })
        .collect()
}
