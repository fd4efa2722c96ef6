//! How a permanent failure is stored, so a replay can tell the work's own error from a
//! failure the driver recorded (a result too large or unserialisable).

use serde::{Deserialize, Serialize};

use super::Error;

#[derive(Serialize, Deserialize)]
#[serde(tag = "idem_failure", rename_all = "snake_case")]
pub(super) enum StoredFailure<E> {
    Work { error: E },
    ResultTooLarge { size: usize, limit: usize },
    Unserializable,
}

impl<E: Serialize> StoredFailure<E> {
    /// The bytes to store and the failure they stand for: the failure itself, or, when the
    /// work's error cannot be serialised or does not fit, a small marker saying so. The
    /// caller answers with what was stored, so the first answer and every replay agree.
    pub(super) fn encode(self, limit: usize) -> (Vec<u8>, Self) {
        let stored = match serde_json::to_vec(&self) {
            Ok(bytes) if bytes.len() <= limit => return (bytes, self),
            Ok(bytes) => StoredFailure::ResultTooLarge {
                size: bytes.len(),
                limit,
            },
            Err(_) => StoredFailure::Unserializable,
        };
        // Markers hold only numbers, so they always serialise.
        (serde_json::to_vec(&stored).unwrap_or_default(), stored)
    }
}

impl<E> StoredFailure<E> {
    pub(super) fn into_error(self, replayed: bool) -> Error<E> {
        match self {
            StoredFailure::Work { error } => Error::Failed { error, replayed },
            StoredFailure::ResultTooLarge { size, limit } => Error::ResultTooLarge {
                size,
                limit,
                replayed,
            },
            StoredFailure::Unserializable => Error::Unserializable {
                source: None,
                replayed,
            },
        }
    }
}
