//! Backend failures. Expected outcomes (replay, in flight, mismatch, fenced) are values in
//! [`crate::store`] (`ClaimOutcome`, `WriteOutcome`, `RenewOutcome`), never errors.

use std::fmt;

use crate::record::ValuePart;

/// A boxed error from a backend's client library, kept as the source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The store operation that failed, for error messages and metrics.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum Operation {
    /// [`Store::claim`](crate::Store::claim)
    Claim,
    /// [`Store::complete`](crate::Store::complete)
    Complete,
    /// [`Store::fail`](crate::Store::fail)
    Fail,
    /// [`Store::release`](crate::Store::release)
    Release,
    /// [`Store::renew`](crate::Store::renew)
    Renew,
    /// [`Store::checkpoint`](crate::Store::checkpoint)
    Checkpoint,
    /// [`Store::get`](crate::Store::get)
    Get,
    /// [`Store::purge_expired`](crate::Store::purge_expired)
    PurgeExpired,
    /// Setting the store up (connecting, migrating, creating a table).
    Setup,
    /// [`Admin::list`](crate::Admin::list)
    List,
    /// [`Admin::stats`](crate::Admin::stats)
    Stats,
    /// [`Admin::release_key`](crate::Admin::release_key)
    ReleaseKey,
    /// [`Admin::delete`](crate::Admin::delete)
    Delete,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Claim => "claim",
            Operation::Complete => "complete",
            Operation::Fail => "fail",
            Operation::Release => "release",
            Operation::Renew => "renew",
            Operation::Checkpoint => "checkpoint",
            Operation::Get => "get",
            Operation::PurgeExpired => "purge_expired",
            Operation::Setup => "setup",
            Operation::List => "list",
            Operation::Stats => "stats",
            Operation::ReleaseKey => "release_key",
            Operation::Delete => "delete",
        })
    }
}

/// A store operation that did not produce an answer.
///
/// Whether the caller may try again is [`StoreError::is_retryable`]. A retryable error on a
/// write may still have landed: the store's operations are built so that retrying them with
/// the same lease (or the same claim request) is safe.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The backend could not be reached or dropped the connection. Retryable.
    #[error("the store was unavailable during {operation}; retry after a short backoff")]
    Unavailable {
        /// The operation that failed.
        operation: Operation,
        /// The client library's error.
        #[source]
        source: BoxError,
    },
    /// The backend refused the operation for now: a lock or serialization conflict,
    /// throttling, a busy database. Retryable.
    #[error("the store was busy or throttled during {operation}; retry after a short backoff")]
    Busy {
        /// The operation that failed.
        operation: Operation,
        /// The client library's error.
        #[source]
        source: BoxError,
    },
    /// A value does not fit in the record: alone, or beside the checkpoints already
    /// stored in it. Not retryable; nothing was written.
    ///
    /// `part` says which: [`ValuePart::Result`] for [`Store::complete`](crate::Store::complete),
    /// [`ValuePart::Failure`] for [`Store::fail`](crate::Store::fail), the step for
    /// [`Store::checkpoint`](crate::Store::checkpoint). `size` counts the bytes the value
    /// takes in the record (a step's name and value).
    #[error(
        "{part} ({size} bytes) does not fit: this store holds at most {limit} bytes per record, checkpoints included"
    )]
    TooLarge {
        /// Which value.
        part: ValuePart,
        /// Its size in bytes.
        size: usize,
        /// The most the store holds per record.
        limit: usize,
    },
    /// A stored record could not be read back (a hand-edited row, a schema from another
    /// version), or sits at the last fencing token, where no takeover or release can
    /// fence its owner (`what` says which; [`TokenAtLimit`](crate::machine::TokenAtLimit)
    /// gives "a token at its limit"). Not retryable.
    #[error("a stored record{} is corrupt ({what}); inspect it (`idem inspect`) or delete it", key.map(|key| format!(" of key #{key}")).unwrap_or_default())]
    Corrupt {
        /// What was wrong: the field that was unreadable, or the token at its limit.
        what: &'static str,
        /// The record's key, as the short hash logs carry, when the store knows it.
        key: Option<crate::key::ShortHash>,
        /// The decoding error, when there is one; at the last token, a
        /// [`TokenAtLimit`](crate::machine::TokenAtLimit), which tells that case apart
        /// without reading `what` (`Some(source)` with `source.is::<TokenAtLimit>()`).
        #[source]
        source: Option<BoxError>,
    },
    /// A listing's cursor that this store did not print (mistyped, or from another
    /// store). Not retryable; start the listing again without it.
    #[error("the cursor was not made by this store; start the listing again without it")]
    InvalidCursor,
    /// The store is set up wrongly: a missing table, bad credentials, a bad name. Not
    /// retryable until the configuration is fixed.
    #[error("the store is misconfigured for {operation}: {source}")]
    Misconfigured {
        /// The operation that failed.
        operation: Operation,
        /// The client library's error.
        #[source]
        source: BoxError,
    },
    /// Any other backend failure, with whether a retry may help.
    #[error("the store failed during {operation}: {source}")]
    Backend {
        /// The operation that failed.
        operation: Operation,
        /// Whether retrying may succeed.
        retryable: bool,
        /// The client library's error.
        #[source]
        source: BoxError,
    },
}

impl StoreError {
    /// The same error, naming `key` when it is [`StoreError::Corrupt`] without a key: for
    /// stores that learn a record is corrupt where the key is not at hand.
    ///
    /// ```
    /// use idem_core::{Key, StoreError};
    ///
    /// let key = Key::new("s", "k")?;
    /// let err = StoreError::Corrupt { what: "a state", key: None, source: None }.for_key(&key);
    /// assert!(err.to_string().contains(&key.short_hash().to_string()));
    /// # Ok::<(), idem_core::key::KeyError>(())
    /// ```
    #[must_use]
    pub fn for_key(self, key: &crate::Key) -> Self {
        match self {
            StoreError::Corrupt {
                what,
                key: None,
                source,
            } => StoreError::Corrupt {
                what,
                key: Some(key.short_hash()),
                source,
            },
            other => other,
        }
    }

    /// Whether trying the same operation again may succeed.
    ///
    /// ```
    /// use idem_core::{record::ValuePart, store::Operation, StoreError};
    ///
    /// let err = StoreError::Unavailable {
    ///     operation: Operation::Claim,
    ///     source: "connection reset".into(),
    /// };
    /// assert!(err.is_retryable());
    /// assert!(!StoreError::TooLarge { part: ValuePart::Result, size: 2, limit: 1 }.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Unavailable { .. } | StoreError::Busy { .. } => true,
            StoreError::Backend { retryable, .. } => *retryable,
            StoreError::TooLarge { .. }
            | StoreError::Corrupt { .. }
            | StoreError::InvalidCursor
            | StoreError::Misconfigured { .. } => false,
        }
    }
}
