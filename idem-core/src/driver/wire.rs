//! How results and failures become the bytes a store keeps: serde JSON for
//! [`Idempotency::execute`](super::Idempotency::execute), the bytes themselves for
//! [`Idempotency::execute_bytes`](super::Idempotency::execute_bytes).

use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::error::{CannotStore, Error, Unstorable};
use crate::record::ValuePart;
use crate::{BoxError, Compensation};

/// A permanent failure as stored: the work's own error, or a marker for a value the
/// driver could not store, so a replay can tell them apart.
pub(crate) enum StoredFailure<E> {
    Work(E),
    /// The work's error, after its steps' undos ran.
    Compensated(E, Compensation),
    Marker(Marker),
    /// A marker for a work error that could not be stored, after the steps' undos ran.
    CompensatedMarker(Marker, Compensation),
}

/// A marker's JSON, with what compensating did when there was a compensation.
fn marker_json(marker: &Marker, compensation: Option<&Compensation>) -> Result<Vec<u8>, BoxError> {
    let Some(compensation) = compensation else {
        return Ok(serde_json::to_vec(marker)?);
    };
    let mut value = serde_json::to_value(marker)?;
    if let serde_json::Value::Object(fields) = &mut value {
        fields.insert("compensation".into(), serde_json::to_value(compensation)?);
    }
    Ok(serde_json::to_vec(&value)?)
}

/// Reads what [`marker_json`] wrote.
fn marker_from_json<E>(mut value: serde_json::Value) -> Result<StoredFailure<E>, BoxError> {
    let compensation = value
        .as_object_mut()
        .and_then(|fields| fields.remove("compensation"));
    let marker = serde_json::from_value(value)?;
    Ok(match compensation {
        Some(compensation) => {
            StoredFailure::CompensatedMarker(marker, serde_json::from_value(compensation)?)
        }
        None => StoredFailure::Marker(marker),
    })
}

/// The failures the driver records itself. Markers hold only numbers and names, so they
/// always serialise.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "idem_failure", rename_all = "snake_case")]
pub(crate) enum Marker {
    /// The result, or with `failure` the work's permanent error, was too large. Records
    /// written before `failure` existed read as a result.
    ResultTooLarge {
        size: usize,
        limit: usize,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        failure: bool,
    },
    Unserializable {
        #[serde(default)]
        step: Option<String>,
        #[serde(default)]
        failure: bool,
    },
    StepTooLarge {
        step: String,
        size: usize,
        limit: usize,
    },
}

impl Marker {
    pub(crate) fn from_unstorable(unstorable: CannotStore) -> Self {
        match unstorable {
            CannotStore::ResultTooLarge { size, limit } => Marker::ResultTooLarge {
                size,
                limit,
                failure: false,
            },
            CannotStore::Unserializable { what } => Marker::Unserializable {
                failure: what == ValuePart::Failure,
                step: match what {
                    ValuePart::Step(step) => Some(step),
                    _ => None,
                },
            },
            CannotStore::StepTooLarge { step, size, limit } => {
                Marker::StepTooLarge { step, size, limit }
            }
        }
    }

    /// The error a marker stands for; `source` is the serialiser's error on the first run.
    pub(crate) fn into_error(self, replayed: bool, source: Option<BoxError>) -> Error {
        let (part, reason) = match self {
            Marker::ResultTooLarge {
                size,
                limit,
                failure,
            } => (
                if failure {
                    ValuePart::Failure
                } else {
                    ValuePart::Result
                },
                Unstorable::TooLarge { size, limit },
            ),
            Marker::StepTooLarge { step, size, limit } => {
                (ValuePart::Step(step), Unstorable::TooLarge { size, limit })
            }
            Marker::Unserializable { step, failure } => (
                match (step, failure) {
                    (Some(step), _) => ValuePart::Step(step),
                    (None, true) => ValuePart::Failure,
                    (None, false) => ValuePart::Result,
                },
                Unstorable::Unserializable,
            ),
        };
        Error::Unstorable {
            part,
            reason,
            source,
            replayed,
        }
    }
}

/// One way of turning values and failures into stored bytes and back.
pub(crate) trait Wire: Send + Sync + 'static {
    type Value;
    type Failure;

    /// The value given up: a wire whose value is its bytes moves them instead of copying.
    fn encode_value(value: Self::Value) -> Result<Vec<u8>, BoxError>;
    fn decode_value(bytes: &[u8]) -> Result<Self::Value, BoxError>;
    /// [`Wire::decode_value`] of bytes given up: a wire whose value is its bytes moves
    /// them instead of copying.
    fn decode_value_owned(bytes: Vec<u8>) -> Result<Self::Value, BoxError> {
        Self::decode_value(&bytes)
    }
    fn encode_failure(failure: &StoredFailure<Self::Failure>) -> Result<Vec<u8>, BoxError>;
    fn decode_failure(bytes: &[u8]) -> Result<StoredFailure<Self::Failure>, BoxError>;
    /// A stored failure's plain bytes with what compensating did added, working on the
    /// bytes alone (the compensation runs in a task of its own, without the error's type).
    fn with_compensation(plain: &[u8], compensation: &Compensation) -> Result<Vec<u8>, BoxError>;
    /// A marker's plain bytes, with what compensating did when there was a compensation.
    fn marker(marker: &Marker, compensation: Option<&Compensation>) -> Vec<u8>;
    /// Whether the Context's serde helpers match this encoding.
    const SERDE: bool;
}

/// serde JSON: what `execute` stores.
pub(crate) struct Json<T, E>(PhantomData<fn() -> (T, E)>);

impl<T, E> Wire for Json<T, E>
where
    T: Serialize + DeserializeOwned + 'static,
    E: Serialize + DeserializeOwned + 'static,
{
    type Value = T;
    type Failure = E;
    const SERDE: bool = true;

    fn encode_value(value: T) -> Result<Vec<u8>, BoxError> {
        Ok(serde_json::to_vec(&value)?)
    }

    fn decode_value(bytes: &[u8]) -> Result<T, BoxError> {
        Ok(from_json(bytes)?)
    }

    fn encode_failure(failure: &StoredFailure<E>) -> Result<Vec<u8>, BoxError> {
        Ok(match failure {
            StoredFailure::Work(error) => serde_json::to_vec(&Borrowed::Work {
                error,
                compensation: None,
            })?,
            StoredFailure::Compensated(error, compensation) => {
                serde_json::to_vec(&Borrowed::Work {
                    error,
                    compensation: Some(compensation),
                })?
            }
            StoredFailure::Marker(marker) => marker_json(marker, None)?,
            StoredFailure::CompensatedMarker(marker, compensation) => {
                marker_json(marker, Some(compensation))?
            }
        })
    }

    fn decode_failure(bytes: &[u8]) -> Result<StoredFailure<E>, BoxError> {
        let mut value: serde_json::Value = from_json(bytes)?;
        if value
            .get("idem_failure")
            .and_then(serde_json::Value::as_str)
            == Some("work")
        {
            let error = value
                .get_mut("error")
                .map(serde_json::Value::take)
                .ok_or("a stored work failure without its error")?;
            let error = serde_json::from_value(error)?;
            return Ok(match value.get_mut("compensation") {
                Some(compensation) => {
                    StoredFailure::Compensated(error, serde_json::from_value(compensation.take())?)
                }
                None => StoredFailure::Work(error),
            });
        }
        marker_from_json(value)
    }

    fn with_compensation(plain: &[u8], compensation: &Compensation) -> Result<Vec<u8>, BoxError> {
        json_with_compensation(plain, compensation)
    }

    fn marker(marker: &Marker, compensation: Option<&Compensation>) -> Vec<u8> {
        // Markers hold only numbers and names: they always serialise.
        marker_json(marker, compensation).unwrap_or_default()
    }
}

/// A JSON failure (the work's, or a marker) with `compensation` set.
fn json_with_compensation(plain: &[u8], compensation: &Compensation) -> Result<Vec<u8>, BoxError> {
    let mut value: serde_json::Value = from_json(plain)?;
    let serde_json::Value::Object(fields) = &mut value else {
        return Err("a stored failure that is not a JSON object".into());
    };
    fields.insert("compensation".into(), serde_json::to_value(compensation)?);
    Ok(serde_json::to_vec(&value)?)
}

/// A work failure as `execute` stores it, borrowed.
#[derive(Serialize)]
#[serde(tag = "idem_failure", rename_all = "snake_case")]
enum Borrowed<'a, E> {
    Work {
        error: &'a E,
        #[serde(skip_serializing_if = "Option::is_none")]
        compensation: Option<&'a Compensation>,
    },
}

/// The bytes themselves: what `execute_bytes` stores. A failure is one tag byte (0 for the
/// work's own bytes, 1 for a driver marker in JSON, 2 for the work's bytes after a
/// compensation) and its payload (for 2: the compensation's JSON length as 4 bytes, the
/// JSON, then the work's bytes).
pub(crate) struct Raw;

const RAW_WORK: u8 = 0;
const RAW_MARKER: u8 = 1;
const RAW_COMPENSATED: u8 = 2;

impl Wire for Raw {
    type Value = Vec<u8>;
    type Failure = Vec<u8>;
    const SERDE: bool = false;

    fn decode_value(bytes: &[u8]) -> Result<Vec<u8>, BoxError> {
        Ok(bytes.to_vec())
    }

    fn encode_value(value: Vec<u8>) -> Result<Vec<u8>, BoxError> {
        Ok(value)
    }

    fn decode_value_owned(bytes: Vec<u8>) -> Result<Vec<u8>, BoxError> {
        Ok(bytes)
    }

    fn encode_failure(failure: &StoredFailure<Vec<u8>>) -> Result<Vec<u8>, BoxError> {
        Ok(match failure {
            StoredFailure::Work(error) => {
                let mut out = Vec::with_capacity(error.len() + 1);
                out.push(RAW_WORK);
                out.extend_from_slice(error);
                out
            }
            StoredFailure::Compensated(error, compensation) => {
                let json = serde_json::to_vec(compensation)?;
                let len = u32::try_from(json.len())?;
                let mut out = Vec::with_capacity(5 + json.len() + error.len());
                out.push(RAW_COMPENSATED);
                out.extend_from_slice(&len.to_be_bytes());
                out.extend_from_slice(&json);
                out.extend_from_slice(error);
                out
            }
            StoredFailure::Marker(marker) => {
                let mut out = vec![RAW_MARKER];
                out.extend_from_slice(&marker_json(marker, None)?);
                out
            }
            StoredFailure::CompensatedMarker(marker, compensation) => {
                let mut out = vec![RAW_MARKER];
                out.extend_from_slice(&marker_json(marker, Some(compensation))?);
                out
            }
        })
    }

    fn decode_failure(bytes: &[u8]) -> Result<StoredFailure<Vec<u8>>, BoxError> {
        match bytes.split_first() {
            Some((&RAW_WORK, error)) => Ok(StoredFailure::Work(error.to_vec())),
            Some((&RAW_MARKER, marker)) => marker_from_json(from_json(marker)?),
            Some((&RAW_COMPENSATED, rest)) => {
                let (len, rest) = rest
                    .split_first_chunk::<4>()
                    .ok_or("a compensated failure without its length")?;
                let len = u32::from_be_bytes(*len) as usize;
                if rest.len() < len {
                    return Err("a compensated failure shorter than its length".into());
                }
                let (json, error) = rest.split_at(len);
                Ok(StoredFailure::Compensated(error.to_vec(), from_json(json)?))
            }
            _ => Err("a stored failure without a known tag byte".into()),
        }
    }

    fn with_compensation(plain: &[u8], compensation: &Compensation) -> Result<Vec<u8>, BoxError> {
        match Self::decode_failure(plain)? {
            StoredFailure::Work(error) | StoredFailure::Compensated(error, _) => {
                Self::encode_failure(&StoredFailure::Compensated(error, compensation.clone()))
            }
            StoredFailure::Marker(_) | StoredFailure::CompensatedMarker(..) => {
                let mut out = vec![RAW_MARKER];
                out.extend_from_slice(&json_with_compensation(&plain[1..], compensation)?);
                Ok(out)
            }
        }
    }

    fn marker(marker: &Marker, compensation: Option<&Compensation>) -> Vec<u8> {
        let mut out = vec![RAW_MARKER];
        out.extend_from_slice(&marker_json(marker, compensation).unwrap_or_default());
        out
    }
}

/// A value read from stored JSON. The bytes are checked as UTF-8 once and read as text,
/// which spares serde_json its check of every string in them (as `from_slice` makes);
/// bytes that are not UTF-8 go to `from_slice`, whose error says where.
pub(crate) fn from_json<T: DeserializeOwned>(bytes: &[u8]) -> serde_json::Result<T> {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<W: Wire>(failure: StoredFailure<W::Failure>) -> StoredFailure<W::Failure> {
        W::decode_failure(&W::encode_failure(&failure).unwrap()).unwrap()
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct Receipt {
        charge: String,
    }

    /// Stored JSON reads as it did through `from_slice`: text, escapes and numbers alike,
    /// bytes that are not UTF-8 in a field the type ignores, and the same refusals.
    #[test]
    fn stored_json_reads_as_from_slice_reads_it() {
        let readable: [&[u8]; 4] = [
            br#"{"charge":"ch_1"}"#,
            br#"{"charge":"\u00e9\n\"q\"","n":1.5e300}"#,
            b"{\"charge\":\"\xc3\xa9\"}",
            b"{\"charge\":\"c\",\"ignored\":\"\xff\xfe\"}",
        ];
        for bytes in readable {
            let slice: Receipt = serde_json::from_slice(bytes).unwrap();
            assert_eq!(from_json::<Receipt>(bytes).unwrap(), slice);
        }
        let refused: [&[u8]; 4] = [
            b"{\"charge\":\"\xff\"}",
            b"\xef\xbb\xbf{\"charge\":\"c\"}",
            br#"{"charge":1}"#,
            b"",
        ];
        for bytes in refused {
            let slice = serde_json::from_slice::<Receipt>(bytes).unwrap_err();
            let ours = from_json::<Receipt>(bytes).unwrap_err();
            assert_eq!(ours.to_string(), slice.to_string(), "{bytes:?}");
        }
    }

    /// Markers stored before they said whether the failure or the result was too large
    /// read as the result's; a result's marker is written as it always was.
    #[test]
    fn too_large_markers_read_as_they_were_written() {
        let old: Marker =
            serde_json::from_str(r#"{"idem_failure":"result_too_large","size":3,"limit":2}"#)
                .unwrap();
        assert!(matches!(
            old.clone().into_error(true, None),
            Error::Unstorable {
                part: ValuePart::Result,
                ..
            }
        ));
        assert_eq!(
            serde_json::to_string(&old).unwrap(),
            r#"{"idem_failure":"result_too_large","size":3,"limit":2}"#
        );
        let failure = Marker::ResultTooLarge {
            size: 3,
            limit: 2,
            failure: true,
        };
        let json = serde_json::to_string(&failure).unwrap();
        assert_eq!(serde_json::from_str::<Marker>(&json).unwrap(), failure);
        assert!(matches!(
            failure.into_error(false, None),
            Error::Unstorable {
                part: ValuePart::Failure,
                ..
            }
        ));
    }

    #[test]
    fn json_failures_keep_their_kind() {
        type W = Json<String, String>;
        let marker = Marker::StepTooLarge {
            step: "charge".into(),
            size: 9,
            limit: 8,
        };
        assert!(matches!(
            round_trip::<W>(StoredFailure::Work("declined".into())),
            StoredFailure::Work(e) if e == "declined"
        ));
        assert!(matches!(
            round_trip::<W>(StoredFailure::Marker(marker.clone())),
            StoredFailure::Marker(m) if m == marker
        ));
        let compensation = Compensation {
            undone: vec!["reserve".into()],
            failed: None,
            pending: Vec::new(),
            interrupted: Vec::new(),
        };
        assert!(matches!(
            round_trip::<W>(StoredFailure::Compensated("no courier".into(), compensation.clone())),
            StoredFailure::Compensated(e, c) if e == "no courier" && c == compensation
        ));
        let compensated = round_trip::<W>(StoredFailure::CompensatedMarker(
            marker.clone(),
            compensation.clone(),
        ));
        assert!(matches!(
            compensated,
            StoredFailure::CompensatedMarker(m, c) if m == marker && c == compensation
        ));
        // The format earlier versions wrote still reads.
        let old = br#"{"idem_failure":"result_too_large","size":2,"limit":1}"#;
        assert!(matches!(
            W::decode_failure(old).unwrap(),
            StoredFailure::Marker(Marker::ResultTooLarge {
                size: 2,
                limit: 1,
                failure: false
            })
        ));
        let old = br#"{"idem_failure":"unserializable"}"#;
        assert!(matches!(
            W::decode_failure(old).unwrap(),
            StoredFailure::Marker(Marker::Unserializable {
                step: None,
                failure: false
            })
        ));
    }

    #[test]
    fn compensation_is_added_to_the_bytes_alone() {
        let compensation = Compensation {
            undone: vec!["a".into()],
            failed: None,
            pending: Vec::new(),
            interrupted: vec!["b".into()],
        };
        let marker = Marker::ResultTooLarge {
            size: 3,
            limit: 2,
            failure: true,
        };
        type W = Json<String, String>;
        let work = W::encode_failure(&StoredFailure::Work("no".into())).unwrap();
        assert!(matches!(
            W::decode_failure(&W::with_compensation(&work, &compensation).unwrap()).unwrap(),
            StoredFailure::Compensated(e, c) if e == "no" && c == compensation
        ));
        let marked = W::marker(&marker, None);
        assert!(matches!(
            W::decode_failure(&W::with_compensation(&marked, &compensation).unwrap()).unwrap(),
            StoredFailure::CompensatedMarker(m, c) if m == marker && c == compensation
        ));
        let all: Vec<u8> = (0..=255).collect();
        let work = Raw::encode_failure(&StoredFailure::Work(all.clone())).unwrap();
        assert!(matches!(
            Raw::decode_failure(&Raw::with_compensation(&work, &compensation).unwrap()).unwrap(),
            StoredFailure::Compensated(e, c) if e == all && c == compensation
        ));
        let marked = Raw::marker(&marker, None);
        assert!(matches!(
            Raw::decode_failure(&Raw::with_compensation(&marked, &compensation).unwrap()).unwrap(),
            StoredFailure::CompensatedMarker(m, c) if m == marker && c == compensation
        ));
        assert!(W::with_compensation(b"[1]", &compensation).is_err());
        assert!(Raw::with_compensation(b"", &compensation).is_err());
    }

    #[test]
    fn raw_failures_keep_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        assert!(matches!(
            round_trip::<Raw>(StoredFailure::Work(all.clone())),
            StoredFailure::Work(e) if e == all
        ));
        assert!(matches!(
            round_trip::<Raw>(StoredFailure::Marker(Marker::ResultTooLarge {
                failure: true,
                size: 3,
                limit: 2
            })),
            StoredFailure::Marker(Marker::ResultTooLarge {
                size: 3,
                limit: 2,
                failure: true
            })
        ));
        let compensation = Compensation {
            undone: vec!["b".into(), "a".into()],
            failed: None,
            pending: Vec::new(),
            interrupted: Vec::new(),
        };
        assert!(matches!(
            round_trip::<Raw>(StoredFailure::Compensated(all.clone(), compensation.clone())),
            StoredFailure::Compensated(e, c) if e == all && c == compensation
        ));
        let marker = Marker::ResultTooLarge {
            size: 3,
            limit: 2,
            failure: true,
        };
        assert!(matches!(
            round_trip::<Raw>(StoredFailure::CompensatedMarker(marker.clone(), compensation.clone())),
            StoredFailure::CompensatedMarker(m, c) if m == marker && c == compensation
        ));
        // A work's failure of no bytes: the compensation's JSON ends the record.
        assert!(matches!(
            round_trip::<Raw>(StoredFailure::Compensated(Vec::new(), compensation.clone())),
            StoredFailure::Compensated(e, c) if e.is_empty() && c == compensation
        ));
        assert!(Raw::decode_failure(b"\x02\x00\x00\x00\x09{}").is_err());
        assert!(Raw::decode_failure(b"\x02\x00").is_err());
        assert!(Raw::decode_failure(b"").is_err());
        assert!(Raw::decode_failure(b"\x07x").is_err());
    }
}
