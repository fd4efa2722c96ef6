//! Decoding a row of `columns.sql` into a record.

use idem_core::{AttemptId, Fingerprint, Key, Record, State, Steps, Timestamp};
use sqlx::Row;
use sqlx::postgres::PgRow;

/// A decoded row: the record, whether its last claim was a takeover, and the database's
/// `now()` when the statement ran.
pub(crate) struct Decoded {
    pub(crate) record: Record,
    pub(crate) resumed: bool,
    pub(crate) now: Timestamp,
}

/// What can go wrong decoding: sqlx failed, or the row holds what idem never writes.
pub(crate) enum DecodeError {
    Sqlx(sqlx::Error),
    Corrupt(&'static str),
}

impl From<sqlx::Error> for DecodeError {
    fn from(err: sqlx::Error) -> Self {
        DecodeError::Sqlx(err)
    }
}

pub(crate) fn millis(value: i64) -> Result<Timestamp, DecodeError> {
    u64::try_from(value)
        .map(Timestamp::from_unix_millis)
        .map_err(|_| DecodeError::Corrupt("a timestamp before 1970"))
}

pub(crate) fn decode(key: &Key, row: &PgRow) -> Result<Decoded, DecodeError> {
    let state: String = row.try_get("state")?;
    let token: i64 = row.try_get("token")?;
    let attempt: Vec<u8> = row.try_get("attempt")?;
    let fingerprint: Vec<u8> = row.try_get("fingerprint")?;
    let names: Vec<String> = row.try_get("step_names")?;
    let values: Vec<Vec<u8>> = row.try_get("step_values")?;
    if names.len() != values.len() {
        return Err(DecodeError::Corrupt(
            "steps whose names and values differ in number",
        ));
    }
    let steps: Steps = names.into_iter().zip(values).collect();
    let record = Record {
        key: key.clone(),
        fingerprint: Fingerprint::from_bytes(
            fingerprint
                .try_into()
                .map_err(|_| DecodeError::Corrupt("a fingerprint that is not 32 bytes"))?,
        ),
        state: State::parse(&state).ok_or(DecodeError::Corrupt("an unknown state"))?,
        token: u64::try_from(token).map_err(|_| DecodeError::Corrupt("a negative token"))?,
        attempt: AttemptId::from_bytes(
            attempt
                .try_into()
                .map_err(|_| DecodeError::Corrupt("an attempt id that is not 16 bytes"))?,
        ),
        lease_until: millis(row.try_get("lease_until_ms")?)?,
        created_at: millis(row.try_get("created_at_ms")?)?,
        expires_at: millis(row.try_get("expires_at_ms")?)?,
        response: row.try_get("response")?,
        steps,
    };
    Ok(Decoded {
        record,
        resumed: row.try_get("resumed")?,
        now: millis(row.try_get("now_ms")?)?,
    })
}
