//! Why a command did not do what it was asked, and the exit code that tells a script.

use std::process::ExitCode;

use idem_core::connect::{Location, OpenError, UrlError};
use idem_core::machine::TokenAtLimit;
use idem_core::{StoreError, key::KeyError};

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
    #[error("no store given: pass --store URL or set IDEM_STORE (see `idem --help`)")]
    NoStore,
    #[error("--{flag} (or IDEM_{}) does not apply to {backend} stores", flag.to_ascii_uppercase())]
    FlagDoesNotApply {
        flag: &'static str,
        backend: &'static str,
    },
    /// A store URL the backend refused, or no backend's: the message says which.
    #[error(transparent)]
    Url(UrlError),
    #[error(
        "{0}; scope and key follow the key rules of idem (1 to 255 bytes, no control characters)"
    )]
    Key(#[from] KeyError),
    #[error("{what}")]
    Usage { what: String },
    #[error("no {what} at {location}: check the URL, or run `idem migrate` to create one")]
    NotCreated {
        what: &'static str,
        location: String,
    },
    /// The store could not be opened: unreachable (retryable) or refused (setup).
    #[error(transparent)]
    Open(OpenError),
    #[error("the {backend} store failed: {source}{}", hint(backend, source))]
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
    /// The proxy could not start (a port taken, a route that cannot be built) or stopped.
    #[error("{0}")]
    Proxy(#[source] idem_proxy::ProxyError),
}

/// What to try next for a store error from `backend` (as `Location::backend` names it).
fn hint(backend: &str, error: &StoreError) -> &'static str {
    match error {
        StoreError::Misconfigured { .. } if backend == "DynamoDB" => {
            "; if the table does not exist yet, run `idem migrate`; otherwise check the URL, --prefix, the credentials and the IAM policy (idem-dynamodb's docs list the actions each command needs)"
        }
        StoreError::Misconfigured { .. } => {
            "; if the table or schema does not exist yet, run `idem migrate`; otherwise check the URL, --table, --prefix and the credentials"
        }
        StoreError::Corrupt {
            source: Some(source),
            ..
        } if source.is::<TokenAtLimit>() => {
            "; its fencing token is the last one (2^53 - 1), past which no takeover or release can fence its owner: `idem inspect` it, and once no worker runs it, `idem delete` it (the next request runs the work from the start, at token 1; if its steps show the effect happened, reconcile with the provider instead)"
        }
        StoreError::Corrupt { .. } => {
            "; the record was written by something other than idem, or by a newer version: `idem inspect` it, and `idem delete` it if it cannot be read"
        }
        _ if error.is_retryable() => "; the store may be down or overloaded: try again shortly",
        _ => "",
    }
}

impl From<UrlError> for Failure {
    fn from(err: UrlError) -> Self {
        match err {
            UrlError::Missing => Failure::NoStore,
            // Said as the command's flags, which are how an operator gives options.
            UrlError::OptionDoesNotApply { option, backend } => Failure::FlagDoesNotApply {
                flag: option,
                backend,
            },
            err => Failure::Url(err),
        }
    }
}

impl Failure {
    /// A store error from `target`.
    pub(crate) fn store(target: &dyn Location) -> impl FnOnce(StoreError) -> Failure + '_ {
        move |source| Failure::Store {
            backend: target.backend(),
            source,
        }
    }

    /// Why `target` could not be opened or migrated, with the command's advice.
    pub(crate) fn open(target: &dyn Location) -> impl FnOnce(OpenError) -> Failure + '_ {
        move |err| match err {
            OpenError::NotFound { what, location } => Failure::NotCreated { what, location },
            // A region or credentials to give, as a flag would be.
            OpenError::MissingSetting { what } => Failure::Usage { what: what.into() },
            OpenError::Store(source) => Failure::store(target)(source),
            err => Failure::Open(err),
        }
    }

    /// The exit code a script sees.
    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Failure::NoStore
            | Failure::FlagDoesNotApply { .. }
            | Failure::Url(_)
            | Failure::Key(_)
            | Failure::Usage { .. } => code::USAGE,
            Failure::NotCreated { .. } => code::SETUP,
            Failure::Open(OpenError::Rejected { .. }) => code::SETUP,
            Failure::Open(err) if err.is_retryable() => code::RETRYABLE,
            Failure::Open(_) => code::SETUP,
            Failure::Store { source, .. } if source.is_retryable() => code::RETRYABLE,
            Failure::Store { .. } => code::SETUP,
            Failure::NotFound { .. } => code::NOT_FOUND,
            Failure::Refused { .. } => code::REFUSED,
            Failure::NotConfirmed { .. } => code::NOT_CONFIRMED,
            // A closed pipe (`idem list | head`) or a full disk: nothing a retry of the
            // store would fix, and nothing about the store either.
            Failure::Output(_) => code::RETRYABLE,
            // A taken port or a listener's failure may pass; a route that cannot be
            // built will not.
            Failure::Proxy(
                idem_proxy::ProxyError::Route(_)
                | idem_proxy::ProxyError::Upstream(_)
                | idem_proxy::ProxyError::Loop { .. },
            ) => code::USAGE,
            Failure::Proxy(_) => code::RETRYABLE,
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
        assert!(!missing.to_string().contains("IAM"), "{missing}");
        // On DynamoDB a refused action is misconfigured too: the policy is named.
        let denied = Failure::Store {
            backend: "DynamoDB",
            source: StoreError::Misconfigured {
                operation: Operation::Claim,
                source: "AccessDeniedException".into(),
            },
        };
        assert!(denied.to_string().contains("IAM policy"), "{denied}");
        let down = Failure::Store {
            backend: "Redis",
            source: StoreError::Unavailable {
                operation: Operation::List,
                source: "connection refused".into(),
            },
        };
        assert!(down.to_string().contains("try again"), "{down}");
        assert_eq!(down.exit_code(), ExitCode::from(code::RETRYABLE));
        // A release refused at the last token: the operator learns why, and what to do.
        let at_limit = Failure::Store {
            backend: "SQLite",
            source: StoreError::from(idem_core::machine::TokenAtLimit),
        };
        let said = at_limit.to_string();
        assert!(said.contains("a token at its limit"), "{said}");
        assert!(said.contains("the last one (2^53 - 1)"), "{said}");
        assert!(said.contains("once no worker runs it"), "{said}");
        assert!(
            said.contains("reconcile with the provider instead"),
            "{said}"
        );
        assert!(!said.contains("something other than idem"), "{said}");
        assert_eq!(at_limit.exit_code(), ExitCode::from(code::SETUP));
        // Any other corrupt record keeps the hint for a record idem cannot read.
        let unreadable = Failure::Store {
            backend: "SQLite",
            source: StoreError::Corrupt {
                what: "a state",
                key: None,
                source: None,
            },
        };
        let said = unreadable.to_string();
        assert!(said.contains("something other than idem"), "{said}");
        assert!(!said.contains("2^53"), "{said}");
    }

    #[test]
    fn open_errors_say_what_to_do_and_exit_by_kind() {
        let target = crate::target::parse(Some("sqlite:///x.db"), None, None).unwrap();
        let open = |err| Failure::open(&*target)(err);
        let missing = open(OpenError::NotFound {
            what: "SQLite database",
            location: "/x.db".into(),
        });
        assert!(
            missing.to_string().contains("run `idem migrate`"),
            "{missing}"
        );
        assert_eq!(missing.exit_code(), ExitCode::from(code::SETUP));
        let settings = open(OpenError::MissingSetting {
            what: "no AWS region",
        });
        assert_eq!(settings.exit_code(), ExitCode::from(code::USAGE));
        let down = open(OpenError::Unreachable {
            location: target.to_string(),
            source: "connection refused".into(),
        });
        assert!(down.to_string().contains("could not reach"), "{down}");
        assert_eq!(down.exit_code(), ExitCode::from(code::RETRYABLE));
        let refused = open(OpenError::Rejected {
            location: target.to_string(),
            source: "password authentication failed".into(),
        });
        assert_eq!(refused.exit_code(), ExitCode::from(code::SETUP));
        let store = open(OpenError::Store(StoreError::Misconfigured {
            operation: Operation::Setup,
            source: "no such table".into(),
        }));
        assert!(
            store.to_string().starts_with("the SQLite store failed"),
            "{store}"
        );
        assert_eq!(store.exit_code(), ExitCode::from(code::SETUP));
    }

    #[test]
    fn url_errors_are_usage_errors_in_the_commands_terms() {
        let none = Failure::from(crate::target::parse(None, None, None).unwrap_err());
        assert!(none.to_string().contains("--store"), "{none}");
        let flag = Failure::from(
            crate::target::parse(Some("sqlite:///x.db"), None, Some("p")).unwrap_err(),
        );
        assert_eq!(
            flag.to_string(),
            "--prefix (or IDEM_PREFIX) does not apply to SQLite stores"
        );
        let bad = Failure::from(crate::target::parse(Some("sqlite://"), None, None).unwrap_err());
        assert!(bad.to_string().contains("needs a file path"), "{bad}");
        for failure in [none, flag, bad] {
            assert_eq!(failure.exit_code(), ExitCode::from(code::USAGE));
        }
    }
}
