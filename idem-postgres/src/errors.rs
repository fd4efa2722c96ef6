//! sqlx errors mapped to idem's error kinds, with the retryable flag set.

use idem_core::{StoreError, store::Operation};

/// SQLSTATE classes and codes a retry can get past.
fn retryable_code(code: &str) -> bool {
    matches!(
        code,
        "40001" // serialization_failure
            | "40P01" // deadlock_detected
            | "55P03" // lock_not_available
            | "57P01" // admin_shutdown
            | "57P02" // crash_shutdown
            | "57P03" // cannot_connect_now
            | "57014" // query_canceled (statement timeout)
    ) || code.starts_with("08") // connection exceptions
        || code.starts_with("53") // insufficient resources
}

pub(crate) fn map(operation: Operation, err: sqlx::Error) -> StoreError {
    match &err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => StoreError::Unavailable {
            operation,
            source: err.into(),
        },
        sqlx::Error::Configuration(_) => StoreError::Misconfigured {
            operation,
            source: err.into(),
        },
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => StoreError::Corrupt {
            key: None,
            what: "a column of the record",
            source: Some(err.into()),
        },
        sqlx::Error::Database(db) => {
            let code = db.code().map(|code| code.into_owned()).unwrap_or_default();
            if code == "40001" || code == "40P01" || code == "55P03" {
                StoreError::Busy {
                    operation,
                    source: err.into(),
                }
            } else if retryable_code(&code) {
                StoreError::Unavailable {
                    operation,
                    source: err.into(),
                }
            } else if code.starts_with("22") {
                // A data exception in idem's own statements: a stored value they cannot
                // work on (a token at bigint's end, say), written by something other than
                // idem.
                StoreError::Corrupt {
                    key: None,
                    what: "a stored value idem's statements cannot work on",
                    source: Some(err.into()),
                }
            } else if ["42P01", "42703", "3F000", "42501"].contains(&code.as_ref())
                || code.starts_with("28")
            {
                // Undefined table, column or schema (migrate() not run), no privilege on
                // them, or bad credentials.
                StoreError::Misconfigured {
                    operation,
                    source: err.into(),
                }
            } else {
                StoreError::Backend {
                    operation,
                    retryable: false,
                    source: err.into(),
                }
            }
        }
        _ => StoreError::Backend {
            operation,
            retryable: false,
            source: err.into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_loss_is_retryable_and_config_is_not() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(map(Operation::Claim, io).is_retryable());
        assert!(map(Operation::Claim, sqlx::Error::PoolTimedOut).is_retryable());
        let config = sqlx::Error::Configuration("bad url".into());
        assert!(!map(Operation::Setup, config).is_retryable());
        assert!(retryable_code("40001") && retryable_code("08006") && retryable_code("53300"));
        assert!(!retryable_code("23505") && !retryable_code("42P01"));
    }

    /// A server error with only its SQLSTATE, as sqlx hands one over.
    #[derive(Debug)]
    struct ServerError(&'static str);

    impl std::fmt::Display for ServerError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "server error {}", self.0)
        }
    }

    impl std::error::Error for ServerError {}

    impl sqlx::error::DatabaseError for ServerError {
        fn message(&self) -> &str {
            "server error"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn kind(err: sqlx::Error) -> &'static str {
        match map(Operation::Claim, err) {
            StoreError::Unavailable { .. } => "unavailable",
            StoreError::Busy { .. } => "busy",
            StoreError::Misconfigured { .. } => "misconfigured",
            StoreError::Corrupt { .. } => "corrupt",
            StoreError::Backend {
                retryable: false, ..
            } => "backend",
            other => panic!("an unexpected kind: {other:?}"),
        }
    }

    fn server(code: &'static str) -> &'static str {
        kind(sqlx::Error::Database(Box::new(ServerError(code))))
    }

    #[test]
    fn every_client_side_error_has_its_kind() {
        let io = || std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(kind(sqlx::Error::Io(io())), "unavailable");
        assert_eq!(kind(sqlx::Error::Tls(Box::new(io()))), "unavailable");
        assert_eq!(kind(sqlx::Error::PoolTimedOut), "unavailable");
        assert_eq!(kind(sqlx::Error::PoolClosed), "unavailable");
        assert_eq!(kind(sqlx::Error::WorkerCrashed), "unavailable");
        assert_eq!(kind(sqlx::Error::Protocol("cut".into())), "unavailable");
        assert_eq!(
            kind(sqlx::Error::Configuration("bad url".into())),
            "misconfigured"
        );
        assert_eq!(kind(sqlx::Error::Decode(Box::new(io()))), "corrupt");
        assert_eq!(
            kind(sqlx::Error::ColumnDecode {
                index: "token".into(),
                source: Box::new(io()),
            }),
            "corrupt"
        );
        assert_eq!(kind(sqlx::Error::RowNotFound), "backend");
    }

    #[test]
    fn every_server_code_has_its_kind() {
        // A conflict with another transaction: busy, worth retrying.
        for code in ["40001", "40P01", "55P03"] {
            assert_eq!(server(code), "busy", "{code}");
        }
        // The server going away or out of room: unavailable, worth retrying.
        for code in [
            "57P01", "57P02", "57P03", "57014", "08006", "08000", "53300", "53100",
        ] {
            assert_eq!(server(code), "unavailable", "{code}");
        }
        // A stored value idem's statements cannot work on.
        for code in ["22P02", "22003"] {
            assert_eq!(server(code), "corrupt", "{code}");
        }
        // No table, column, schema or privilege, or bad credentials: migrate or fix the
        // URL; a retry would not help.
        for code in ["42P01", "42703", "3F000", "42501", "28P01", "28000"] {
            assert_eq!(server(code), "misconfigured", "{code}");
        }
        // Anything else is the backend's, not retried.
        for code in ["23505", "XX000", "42601"] {
            assert_eq!(server(code), "backend", "{code}");
        }
    }
}
