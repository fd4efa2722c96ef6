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

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(code: std::ffi::c_int) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None)
    }

    fn mapped(code: std::ffi::c_int) -> StoreError {
        map(Operation::Claim, failure(code))
    }

    #[test]
    fn a_lock_held_too_long_is_busy() {
        for code in [rusqlite::ffi::SQLITE_BUSY, rusqlite::ffi::SQLITE_LOCKED] {
            let err = mapped(code);
            assert!(matches!(err, StoreError::Busy { .. }), "{code}: {err:?}");
            assert!(err.is_retryable());
        }
    }

    #[test]
    fn a_full_disk_or_a_failed_read_is_unavailable() {
        for code in [
            rusqlite::ffi::SQLITE_IOERR,
            rusqlite::ffi::SQLITE_FULL,
            rusqlite::ffi::SQLITE_NOMEM,
        ] {
            let err = mapped(code);
            assert!(
                matches!(err, StoreError::Unavailable { .. }),
                "{code}: {err:?}"
            );
            assert!(err.is_retryable());
        }
    }

    #[test]
    fn a_file_that_cannot_be_used_is_misconfigured() {
        for code in [
            rusqlite::ffi::SQLITE_CANTOPEN,
            rusqlite::ffi::SQLITE_PERM,
            rusqlite::ffi::SQLITE_READONLY,
            rusqlite::ffi::SQLITE_NOTADB,
            rusqlite::ffi::SQLITE_SCHEMA,
        ] {
            let err = mapped(code);
            assert!(
                matches!(err, StoreError::Misconfigured { .. }),
                "{code}: {err:?}"
            );
            assert!(!err.is_retryable());
        }
    }

    #[test]
    fn a_damaged_file_or_a_foreign_column_is_corrupt() {
        let err = mapped(rusqlite::ffi::SQLITE_CORRUPT);
        assert!(
            matches!(
                err,
                StoreError::Corrupt {
                    what: "the database file",
                    ..
                }
            ),
            "{err:?}"
        );
        let column =
            rusqlite::Error::InvalidColumnType(0, "token".to_owned(), rusqlite::types::Type::Text);
        let err = map(Operation::Get, column);
        assert!(
            matches!(
                err,
                StoreError::Corrupt {
                    what: "a column holding another type than idem writes",
                    ..
                }
            ),
            "{err:?}"
        );
        let err = map(
            Operation::Get,
            rusqlite::Error::IntegralValueOutOfRange(0, -1),
        );
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    }

    #[test]
    fn anything_else_is_a_backend_error_not_to_retry() {
        let err = mapped(rusqlite::ffi::SQLITE_CONSTRAINT);
        assert!(
            matches!(
                err,
                StoreError::Backend {
                    retryable: false,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn a_row_error_keeps_a_store_error_and_maps_a_sqlite_one() {
        let kept = RowError::Store(StoreError::InvalidCursor).into_store_error(Operation::List);
        assert!(matches!(kept, StoreError::InvalidCursor), "{kept:?}");
        let mapped =
            RowError::from(failure(rusqlite::ffi::SQLITE_BUSY)).into_store_error(Operation::List);
        assert!(matches!(mapped, StoreError::Busy { .. }), "{mapped:?}");
    }
}
