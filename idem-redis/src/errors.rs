//! redis-rs errors mapped to idem's error kinds, with the retryable flag set.

use idem_core::{Operation, StoreError};
use redis::{ErrorKind, RedisError, RetryMethod, ServerErrorKind};

pub(crate) fn map(operation: Operation, err: RedisError) -> StoreError {
    if err.code() == Some("IDEM_CORRUPT") {
        // A script found a field idem did not write (common.lua, `corrupt`).
        return StoreError::Corrupt {
            what: "a field of the record's hash that idem did not write",
            key: None,
            source: Some(err.into()),
        };
    }
    match err.kind() {
        ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig
        | ErrorKind::Server(ServerErrorKind::NoPerm) => StoreError::Misconfigured {
            operation,
            source: err.into(),
        },
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown,
        ) => StoreError::Busy {
            operation,
            source: err.into(),
        },
        // A reply that does not parse was cut short or garbled on the way (the chaos runs
        // cut connections mid-answer): the command may or may not have run, and every
        // idem command is safe to repeat. Stored data is decoded by idem itself, and a
        // record that does not decode is `Corrupt` there, not here.
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound | ErrorKind::Parse => {
            StoreError::Unavailable {
                operation,
                source: err.into(),
            }
        }
        ErrorKind::UnexpectedReturnType => StoreError::Corrupt {
            key: None,
            what: "a reply from a script",
            source: Some(err.into()),
        },
        _ => {
            let retryable = !matches!(err.retry_method(), RetryMethod::NoRetry);
            StoreError::Backend {
                operation,
                retryable,
                source: err.into(),
            }
        }
    }
}

/// A reply of a shape the scripts never produce.
pub(crate) fn unexpected(what: &'static str) -> StoreError {
    StoreError::Corrupt {
        what,
        key: None,
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_cut_short_is_retryable_not_corrupt() {
        let cut = RedisError::from(redis::ParsingError::from("Unexpected end of input"));
        assert_eq!(cut.kind(), ErrorKind::Parse);
        let mapped = map(Operation::Complete, cut);
        assert!(
            matches!(mapped, StoreError::Unavailable { .. }) && mapped.is_retryable(),
            "{mapped:?}"
        );
    }
}
