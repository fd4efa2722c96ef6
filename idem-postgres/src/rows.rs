//! Decoding a row of `columns.sql` into a record, through core's validated builder.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use idem_core::{Key, Record, StoreError, Timestamp, store::Operation};
use sqlx::error::BoxDynError;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{PgRow, PgTypeInfo, PgValueFormat, PgValueRef, Postgres};
use sqlx::{Decode, Row, Type};

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

/// The record in `row`; a row it cannot read is a corrupt record naming `key`.
pub(crate) fn decode(key: &Key, row: &PgRow, operation: Operation) -> Result<Decoded, StoreError> {
    decode_fields(key, row, operation).map_err(|err| err.for_key(key))
}

fn decode_fields(key: &Key, row: &PgRow, operation: Operation) -> Result<Decoded, StoreError> {
    let column = |err| map(operation, err);
    let steps = steps(row.try_get("steps").map_err(column)?)?;
    let mut parts = Record::parts(key.clone())
        .fingerprint(&row.try_get::<Vec<u8>, _>("fingerprint").map_err(column)?)
        .state(row.try_get::<String, _>("state").map_err(column)?)
        .token(row.try_get::<i64, _>("token").map_err(column)?)
        .attempt(&row.try_get::<Vec<u8>, _>("attempt").map_err(column)?)
        .lease_until_millis(
            row.try_get::<PgTime, _>("lease_until")
                .map_err(column)?
                .unix_millis(),
        )
        .created_at_millis(
            row.try_get::<PgTime, _>("created_at")
                .map_err(column)?
                .unix_millis(),
        )
        .expires_at_millis(
            row.try_get::<PgTime, _>("expires_at")
                .map_err(column)?
                .unix_millis(),
        )
        .response(row.try_get("response").map_err(column)?);
    for (name, value) in steps {
        parts = parts.step(name, value);
    }
    Ok(Decoded {
        record: parts.build()?,
        resumed: row.try_get("resumed").map_err(column)?,
        now: millis(
            row.try_get::<PgTime, _>("read_at")
                .map_err(column)?
                .unix_millis(),
        )?,
    })
}

/// A `timestamptz` column, decoded by the client from PostgreSQL's binary form
/// (microseconds since 2000 as a big-endian `i64`): a statement computing
/// `floor(extract(epoch ...) * 1000)` for each column cost more than the rest of its
/// projection. `infinity` and `-infinity` (which idem never writes) fail to decode, so a
/// row holding one reads as corrupt.
pub(crate) struct PgTime {
    micros_since_2000: i64,
}

/// `timestamptz`'s type OID.
const TIMESTAMPTZ: Oid = Oid(1184);

/// Milliseconds from 1970-01-01 to 2000-01-01, PostgreSQL's epoch.
const POSTGRES_EPOCH_MILLIS: i64 = 946_684_800_000;

impl PgTime {
    /// Whole milliseconds since 1970, rounded down. Within timestamptz's range (4714 BC
    /// to 294276 AD) this neither overflows nor rounds otherwise.
    pub(crate) fn unix_millis(&self) -> i64 {
        self.micros_since_2000.div_euclid(1000) + POSTGRES_EPOCH_MILLIS
    }

    /// Microseconds since 1970; `None` in the last 30 years of timestamptz's range, which
    /// an `i64` of them cannot reach.
    pub(crate) fn unix_micros(&self) -> Option<i64> {
        self.micros_since_2000
            .checked_add(POSTGRES_EPOCH_MILLIS * 1000)
    }
}

impl Type<Postgres> for PgTime {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(TIMESTAMPTZ)
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        ty.oid() == Some(TIMESTAMPTZ)
    }
}

impl Decode<'_, Postgres> for PgTime {
    fn decode(value: PgValueRef<'_>) -> Result<Self, BoxDynError> {
        if value.format() != PgValueFormat::Binary {
            return Err("a timestamptz in text form".into());
        }
        let micros_since_2000 = i64::from_be_bytes(value.as_bytes()?.try_into()?);
        if micros_since_2000 == i64::MAX || micros_since_2000 == i64::MIN {
            return Err("an infinite timestamptz".into());
        }
        Ok(Self { micros_since_2000 })
    }
}

/// The steps column as `checkpoint.sql` writes it: a JSON object of step names to the
/// base64 of their values, which PostgreSQL's `encode` breaks into lines of 76 characters.
/// `None` when the statement left the steps out.
fn steps(text: Option<String>) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    // serde_json's message can quote the value it refused, whole: keep only its kind.
    let encoded: BTreeMap<String, String> =
        serde_json::from_str(&text).map_err(|_| StoreError::Corrupt {
            key: None,
            what: "steps that are not an object of texts",
            source: None,
        })?;
    encoded
        .into_iter()
        .map(|(name, value)| {
            let mut value = value.into_bytes();
            // The whitespace PostgreSQL's decode skips, and no other.
            value.retain(|byte| !matches!(byte, b' ' | b'\t' | b'\n' | b'\r'));
            STANDARD
                .decode(&value)
                .map(|value| (name, value))
                .map_err(|err| StoreError::Corrupt {
                    key: None,
                    what: "a step value that is not base64",
                    source: Some(err.into()),
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{PgTime, steps};

    /// The client's milliseconds equal what the statements computed before,
    /// `floor(extract(epoch ...) * 1000)`, on either side of both epochs and of a
    /// millisecond, and at the ends of timestamptz's range (exactly, where PostgreSQL's
    /// own arithmetic rounds); infinities do not decode.
    #[tokio::test]
    async fn times_decode_as_the_server_floors_them() {
        let Some(url) = idem_testkit::service_url("IDEM_TEST_POSTGRES_URL") else {
            return;
        };
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
            .await
            .expect("connect to the test PostgreSQL");
        let times = [
            "1970-01-01 00:00:00+00",
            "1969-12-31 23:59:59.999999+00",
            "1969-12-31 23:59:59.9995+00",
            "2000-01-01 00:00:00+00",
            "1999-12-31 23:59:59.999001+00",
            "2000-01-01 00:00:00.000999+00",
            "2026-12-07 10:00:00.123999+00",
            "4714-11-24 00:00:00+00 BC",
        ];
        for time in times {
            let (decoded, floored): (PgTime, i64) = sqlx::query_as(
                "SELECT $1::timestamptz, floor(extract(epoch FROM $1::timestamptz) * 1000)::bigint",
            )
            .bind(time)
            .fetch_one(&mut conn)
            .await
            .expect("both forms of the time");
            assert_eq!(decoded.unix_millis(), floored, "{time}");
        }
        // The last instant timestamptz holds. PostgreSQL's own extract rounds there (it
        // divides as numeric past the top of its fast path); the decoded value is exact.
        let (last,): (PgTime,) =
            sqlx::query_as("SELECT '294276-12-31 23:59:59.999999+00'::timestamptz")
                .fetch_one(&mut conn)
                .await
                .expect("the last instant");
        assert_eq!(last.unix_millis(), 9_224_318_015_999_999);
        assert_eq!(
            last.unix_micros(),
            None,
            "past an i64 of microseconds since 1970"
        );
        for infinite in ["infinity", "-infinity"] {
            let decoded = sqlx::query_scalar::<_, PgTime>("SELECT $1::timestamptz")
                .bind(infinite)
                .fetch_one(&mut conn)
                .await;
            assert!(
                matches!(decoded, Err(sqlx::Error::ColumnDecode { .. })),
                "{infinite} decoded"
            );
        }
    }

    fn decoded(text: &str) -> Vec<(String, Vec<u8>)> {
        steps(Some(text.to_owned())).expect("decodable steps")
    }

    fn refused(text: &str) -> &'static str {
        match steps(Some(text.to_owned())) {
            Err(idem_core::StoreError::Corrupt { what, .. }) => what,
            other => panic!("{text}: expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn steps_decode_as_checkpoint_sql_writes_them() {
        assert!(steps(None).unwrap().is_empty(), "no column, no steps");
        assert!(decoded("{}").is_empty());
        // encode() breaks its base64 into lines of 76 characters.
        let every_byte: Vec<u8> = (0..=255).collect();
        let wrapped =
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &every_byte)
                .as_bytes()
                .chunks(76)
                .map(|line| std::str::from_utf8(line).unwrap())
                .collect::<Vec<_>>()
                .join("\\n");
        let text = format!(r#"{{"b": "{wrapped}", "a": "", "\u00e9": " AQ\r\n\tI= "}}"#);
        assert_eq!(
            decoded(&text),
            vec![
                ("a".to_owned(), vec![]),
                ("b".to_owned(), every_byte),
                ("\u{e9}".to_owned(), vec![1, 2]),
            ]
        );
    }

    #[test]
    fn steps_that_are_not_texts_of_base64_are_corrupt() {
        for text in [
            "[1, 2]",
            "null",
            r#""a secret value""#,
            r#"{"a": 7}"#,
            r#"{"a": null}"#,
        ] {
            assert_eq!(
                refused(text),
                "steps that are not an object of texts",
                "{text}"
            );
        }
        // A form feed is not whitespace to PostgreSQL's decode either.
        for text in [r#"{"a": "!!!"}"#, r#"{"a": "AQ\fI="}"#, r#"{"a": "AQ="}"#] {
            assert_eq!(refused(text), "a step value that is not base64", "{text}");
        }
    }

    #[test]
    fn a_refused_value_is_not_quoted_in_the_error() {
        let err = steps(Some(r#""a secret value""#.to_owned())).unwrap_err();
        let mut chain = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(next) = source {
            chain.push_str(&next.to_string());
            source = next.source();
        }
        assert!(!chain.contains("secret"), "{chain}");
    }
}
