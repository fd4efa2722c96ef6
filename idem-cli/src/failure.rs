//! Why a command did not do what it was asked, and the exit code that tells a script.

use std::process::ExitCode;

use idem_core::{StoreError, key::KeyError};

use crate::target::{Target, TargetError};

/// The exit codes `idem --help` documents.
pub(crate) mod code {
    pub(crate) const RETRYABLE: u8 = 1;
    pub(crate) const USAGE: u8 = 2;
    pub(crate) const NOT_FOUND: u8 = 3;
    pub(crate) const REFUSED: u8 = 4;
    pub(crate) const NOT_CONFIRMED: u8 = 5;
    pub(crate) const SETUP: u8 = 6;
}

/// A command that did not do what it was asked. The message says what to do next.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(
        "{0}; scope and key follow the key rules of idem (1 to 255 bytes, no control characters)"
    )]
    Key(#[from] KeyError),
    #[error("{what}")]
    Usage { what: String },
    #[error("no SQLite database at {path}: check the path, or run `idem migrate` to create one")]
    NoDatabase { path: String },
    #[error("could not reach the {target}: {source}; check the URL and that the server is up")]
    Unreachable {
        target: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(
        "the {target} refused the connection: {source}; check the credentials, the database name and the permissions"
    )]
    Rejected {
        target: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the {backend} store failed: {source}{}", hint(source))]
    Store {
        backend: &'static str,
        #[source]
        source: StoreError,
    },
    #[error("{what}")]
    NotFound { what: String },
    #[error("{what}")]
    Refused { what: String },
    #[error("{what}")]
    NotConfirmed { what: String },
    #[error("could not write the output: {0}")]
    Output(#[from] std::io::Error),
}

/// What to try next for a store error.
fn hint(error: &StoreError) -> &'static str {
    match error {
        StoreError::Misconfigured { .. } => {
            "; if the table or schema does not exist yet, run `idem migrate`; otherwise check the URL, --table, --prefix and the credentials"
        }
        StoreError::Corrupt { .. } => {
            "; the record was written by something other than idem, or by a newer version: `idem inspect` it, and `idem delete` it if it cannot be read"
        }
        _ if error.is_retryable() => "; the store may be down or overloaded: try again shortly",
        _ => "",
    }
}

impl Failure {
    /// A store error from `target`.
    pub(crate) fn store(target: &Target) -> impl FnOnce(StoreError) -> Failure + '_ {
        move |source| Failure::Store {
            backend: target.backend(),
            source,
        }
    }

    /// The exit code a script sees.
    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Failure::Target(_) | Failure::Key(_) | Failure::Usage { .. } => code::USAGE,
            Failure::NoDatabase { .. } | Failure::Rejected { .. } => code::SETUP,
            Failure::Unreachable { .. } => code::RETRYABLE,
            Failure::Store { source, .. } if source.is_retryable() => code::RETRYABLE,
            Failure::Store { .. } => code::SETUP,
            Failure::NotFound { .. } => code::NOT_FOUND,
            Failure::Refused { .. } => code::REFUSED,
            Failure::NotConfirmed { .. } => code::NOT_CONFIRMED,
            // A closed pipe (`idem list | head`) or a full disk: nothing a retry of the
            // store would fix, and nothing about the store either.
            Failure::Output(_) => code::RETRYABLE,
        })
    }
}

#[cfg(test)]
mod tests {
    use idem_core::store::Operation;

    use super::*;

    #[test]
    fn store_errors_say_what_to_do_and_exit_by_kind() {
        let missing = Failure::Store {
            backend: "PostgreSQL",
            source: StoreError::Misconfigured {
                operation: Operation::Stats,
                source: "relation \"idem_records\" does not exist".into(),
            },
        };
        assert!(missing.to_string().contains("idem migrate"), "{missing}");
        assert_eq!(missing.exit_code(), ExitCode::from(code::SETUP));
        let down = Failure::Store {
            backend: "Redis",
            source: StoreError::Unavailable {
                operation: Operation::List,
                source: "connection refused".into(),
            },
        };
        assert!(down.to_string().contains("try again"), "{down}");
        assert_eq!(down.exit_code(), ExitCode::from(code::RETRYABLE));
    }
}
