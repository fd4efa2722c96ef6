//! redis-rs errors mapped to idem's error kinds, with the retryable flag set.

use idem_core::{Operation, StoreError};
use redis::{ErrorKind, RedisError, RetryMethod, ServerErrorKind};

pub(crate) fn map(operation: Operation, err: RedisError) -> StoreError {
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
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => StoreError::Unavailable {
            operation,
            source: err.into(),
        },
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => StoreError::Corrupt {
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
    StoreError::Corrupt { what, source: None }
}
