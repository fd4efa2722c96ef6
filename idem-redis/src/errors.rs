//! redis-rs errors mapped to idem's error kinds, with the retryable flag set.

use idem_core::{StoreError, store::Operation};
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
    if err.code() == Some("IDEM_TOKEN_LIMIT") {
        // A takeover or release of a record at the last token (common.lua).
        return StoreError::from(idem_core::machine::TokenAtLimit);
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
        // Server states that pass (out of memory until eviction or a purge frees some, a
        // long script, too few replicas in sync, a failing snapshot) refuse the command
        // before it runs: a short wait and the same call succeed. As a permanent error, a
        // moment's OOM would end a completion and strand the key until its lease expires.
        ErrorKind::Extension if err.code().is_some_and(is_transient) => StoreError::Unavailable {
            operation,
            source: err.into(),
        },
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

/// Error codes of server states that pass, which redis-rs does not classify itself.
fn is_transient(code: &str) -> bool {
    matches!(code, "OOM" | "BUSY" | "NOREPLICAS" | "MISCONF")
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

    /// The error a server's reply `-<line>` becomes, parsed as redis-rs parses replies.
    fn server_error(line: &str) -> RedisError {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(err)) => err.into(),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    /// A server state that passes: the write did not run, and trying again soon is safe.
    fn assert_transient(line: &str) {
        let mapped = map(Operation::Complete, server_error(line));
        assert!(
            matches!(mapped, StoreError::Unavailable { .. }) && mapped.is_retryable(),
            "{line}: {mapped:?}"
        );
    }

    #[test]
    fn the_last_token_is_a_corrupt_record_never_retried() {
        let mapped = map(
            Operation::Claim,
            server_error(
                "IDEM_TOKEN_LIMIT the token is at its limit script: 1a2b, on @user_script:9.",
            ),
        );
        assert!(
            matches!(mapped, StoreError::Corrupt { key: None, .. }) && !mapped.is_retryable(),
            "{mapped:?}"
        );
        assert!(mapped.to_string().contains("limit"), "{mapped}");
    }

    #[test]
    fn out_of_memory_is_retryable() {
        assert_transient(
            "OOM command not allowed when used memory > 'maxmemory'. script: 1a2b, on @user_script:9.",
        );
    }

    #[test]
    fn a_busy_script_is_retryable() {
        assert_transient(
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
        );
    }

    #[test]
    fn too_few_replicas_is_retryable() {
        assert_transient("NOREPLICAS Not enough good replicas to write.");
    }

    #[test]
    fn a_failing_snapshot_is_retryable() {
        assert_transient(
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
        );
    }

    /// A server state the client library knows: retryable already, as `Busy`.
    fn assert_busy(line: &str) {
        let mapped = map(Operation::Claim, server_error(line));
        assert!(
            matches!(mapped, StoreError::Busy { .. }) && mapped.is_retryable(),
            "{line}: {mapped:?}"
        );
    }

    #[test]
    fn credentials_and_permissions_are_misconfiguration() {
        for err in [
            server_error("NOPERM User app has no permissions to run the 'evalsha' command"),
            // What redis-rs makes of a refused AUTH when it connects.
            RedisError::from((ErrorKind::AuthenticationFailed, "invalid password")),
            RedisError::from((ErrorKind::InvalidClientConfig, "a bad URL")),
        ] {
            let mapped = map(Operation::Claim, err);
            assert!(
                matches!(mapped, StoreError::Misconfigured { .. }) && !mapped.is_retryable(),
                "{mapped:?}"
            );
        }
    }

    #[test]
    fn a_reply_of_another_type_is_corrupt() {
        let err = RedisError::from((ErrorKind::UnexpectedReturnType, "not an array"));
        let mapped = map(Operation::Claim, err);
        assert!(
            matches!(mapped, StoreError::Corrupt { .. }) && !mapped.is_retryable(),
            "{mapped:?}"
        );
    }

    #[test]
    fn loading_is_retryable() {
        assert_busy("LOADING Redis is loading the dataset in memory");
    }

    #[test]
    fn try_again_is_retryable() {
        assert_busy("TRYAGAIN Multiple keys request during rehashing of slot");
    }

    #[test]
    fn a_master_down_is_retryable() {
        assert_busy(
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        );
    }

    #[test]
    fn a_cluster_down_is_retryable() {
        assert_busy("CLUSTERDOWN The cluster is down");
    }

    #[test]
    fn other_server_errors_stay_permanent() {
        let mapped = map(
            Operation::Claim,
            server_error("WRONGTYPE Operation against a key holding the wrong kind of value"),
        );
        assert!(!mapped.is_retryable(), "{mapped:?}");
    }

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
