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
    use super::steps;

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
