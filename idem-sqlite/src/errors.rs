//! rusqlite errors mapped to idem's error kinds, with the retryable flag set.

use idem_core::{StoreError, store::Operation};
use rusqlite::ErrorCode;

pub(crate) fn map(operation: Operation, err: rusqlite::Error) -> StoreError {
    // A column holding another type than idem writes (SQLite keeps any value in any
    // column): a row something else wrote.
    if matches!(
        err,
        rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
    ) {
        return StoreError::Corrupt {
            key: None,
            what: "a column holding another type than idem writes",
            source: Some(err.into()),
        };
    }
    let code = match &err {
        rusqlite::Error::SqliteFailure(failure, _) => Some(failure.code),
        _ => None,
    };
    match code {
        // Another connection or process holds the write lock beyond busy_timeout.
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Busy {
            operation,
            source: err.into(),
        },
        Some(ErrorCode::SystemIoFailure | ErrorCode::DiskFull | ErrorCode::OutOfMemory) => {
            StoreError::Unavailable {
                operation,
                source: err.into(),
            }
        }
        Some(
            ErrorCode::CannotOpen
            | ErrorCode::PermissionDenied
            | ErrorCode::ReadOnly
            | ErrorCode::NotADatabase
            | ErrorCode::SchemaChanged,
        ) => StoreError::Misconfigured {
            operation,
            source: err.into(),
        },
        Some(ErrorCode::DatabaseCorrupt) => StoreError::Corrupt {
            key: None,
            what: "the database file",
            source: Some(err.into()),
        },
        _ => StoreError::Backend {
            operation,
            retryable: false,
            source: err.into(),
        },
    }
}

/// An error from reading a row: either SQLite failed or the row holds what idem never
/// writes (already a [`StoreError::Corrupt`]).
#[derive(Debug)]
pub(crate) enum RowError {
    Sqlite(rusqlite::Error),
    Store(StoreError),
}

impl From<rusqlite::Error> for RowError {
    fn from(err: rusqlite::Error) -> Self {
        RowError::Sqlite(err)
    }
}

impl From<StoreError> for RowError {
    fn from(err: StoreError) -> Self {
        RowError::Store(err)
    }
}

impl RowError {
    pub(crate) fn into_store_error(self, operation: Operation) -> StoreError {
        match self {
            RowError::Sqlite(err) => map(operation, err),
            RowError::Store(err) => err,
        }
    }
}
