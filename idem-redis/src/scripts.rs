//! The transitions' Lua, in the two forms a server may run it: a function in idem's Redis
//! Functions library (Redis 7 and later), and the same code as a script for servers without
//! Functions.
//!
//! Redis runs a script's whole body on every `EVALSHA`, so every script defined every shared
//! helper on every call. A library's top level runs once, when it is loaded; each `FCALL`
//! runs only its function. The library's name and its functions' carry a hash of its code,
//! so two versions of idem on one server (a rolling deploy) each call their own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::{
    Arg, Cmd, ErrorKind, FromRedisValue, RedisError, RedisResult, Script, ServerErrorKind,
};

use crate::store::Connection;

/// A function's body: the transition's files, in order, inside `register_function`. Its
/// name is `__IDEM__` plus the transition's, until the library's hash replaces `__IDEM__`.
macro_rules! function {
    ($name:literal, $($file:literal),+) => {
        concat!(
            "redis.register_function('__IDEM__", $name, "', function(KEYS, ARGV)\n",
            $(include_str!(concat!("../lua/", $file)), "\n",)+
            "end)\n"
        )
    };
}

/// The library: the shared helpers once, then one function per transition.
const LIBRARY_BODY: &str = concat!(
    include_str!("../lua/common.lua"),
    "\n",
    function!("claim", "claim_replay.lua", "claim.lua"),
    function!("complete", "complete.lua"),
    function!("fail", "fail.lua"),
    function!("release", "release.lua"),
    function!("renew", "renew.lua"),
    function!("checkpoint", "checkpoint.lua"),
    function!("get", "get.lua"),
    function!("admin_release", "admin_release.lua"),
);

macro_rules! script {
    ($file:literal) => {
        concat!(
            include_str!("../lua/common.lua"),
            "\n",
            include_str!(concat!("../lua/", $file))
        )
    };
}

/// One transition in both forms.
#[derive(Debug)]
pub(crate) struct Transition {
    /// Its function's name in the library.
    function: String,
    /// The same code as a script, with the helpers in front.
    script: Script,
    /// The script's text, for `SCRIPT LOAD`.
    code: &'static str,
}

impl Transition {
    fn new(prefix: &str, name: &str, code: &'static str) -> Self {
        Self {
            function: format!("{prefix}{name}"),
            script: Script::new(code),
            code,
        }
    }
}

/// Every transition, and which form the server takes.
#[derive(Debug)]
pub(crate) struct Scripts {
    /// `FUNCTION LOAD REPLACE` text: the header names the library after its hash.
    library: String,
    /// Until when (milliseconds after `created`) to send scripts without trying functions:
    /// 0 while functions work. Set when the server showed it runs no functions for this
    /// client (a server before 7.0, an ACL that allows scripts only), and tried again
    /// [`RETRY_FUNCTIONS_AFTER`] later, so an upgraded server or a widened ACL is found.
    scripts_until: AtomicU64,
    created: Instant,
    pub(crate) claim: Transition,
    pub(crate) complete: Transition,
    pub(crate) fail: Transition,
    pub(crate) release: Transition,
    pub(crate) renew: Transition,
    pub(crate) checkpoint: Transition,
    pub(crate) get: Transition,
    pub(crate) admin_release: Transition,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        // The SHA-1 of the library's code (as `EVALSHA` names a script), shortened: enough
        // to tell idem's versions apart on one server.
        let whole = Script::new(LIBRARY_BODY);
        let hash = &whole.get_hash()[..16];
        let prefix = format!("idem_{hash}_");
        let library = format!(
            "#!lua name=idem_{hash}\n{}",
            LIBRARY_BODY.replace("'__IDEM__", &format!("'{prefix}"))
        );
        // The claim's replay path runs before the helpers are defined, so a replay as a
        // script does not pay for defining them.
        const CLAIM_SCRIPT: &str = concat!(
            include_str!("../lua/claim_replay.lua"),
            "\n",
            include_str!("../lua/common.lua"),
            "\n",
            include_str!("../lua/claim.lua")
        );
        Self {
            library,
            scripts_until: AtomicU64::new(0),
            created: Instant::now(),
            claim: Transition::new(&prefix, "claim", CLAIM_SCRIPT),
            complete: Transition::new(&prefix, "complete", script!("complete.lua")),
            fail: Transition::new(&prefix, "fail", script!("fail.lua")),
            release: Transition::new(&prefix, "release", script!("release.lua")),
            renew: Transition::new(&prefix, "renew", script!("renew.lua")),
            checkpoint: Transition::new(&prefix, "checkpoint", script!("checkpoint.lua")),
            get: Transition::new(&prefix, "get", script!("get.lua")),
            admin_release: Transition::new(&prefix, "admin_release", script!("admin_release.lua")),
        }
    }

    /// A call of `transition` on `key`, to which the caller adds the arguments.
    pub(crate) fn call(&self, transition: &Transition, key: &[u8]) -> Cmd {
        let mut call = redis::cmd("FCALL");
        call.arg(&transition.function).arg(1).arg(key);
        call
    }

    /// Runs `call` (from [`Scripts::call`]) as a function; loads the library where it is
    /// missing (a new server, a restart without persistence, a failover to a node that never
    /// had it) and calls again; runs the script instead on a server without functions, and
    /// for this call where the server refuses a function it would run a script (below).
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        connection: &Connection,
        transition: &Transition,
        call: &Cmd,
    ) -> RedisResult<T> {
        if self.functions_allowed() {
            // Loaded at most twice per call: a flush between the load and the call (an
            // operator's, another test's) is met once more, and a loop is never endless.
            let mut loads = 0;
            let err = loop {
                match connection.query(call).await {
                    Ok(value) => return Ok(value),
                    Err(err) if function_missing(&err) && loads < 2 => {
                        loads += 1;
                        // Built only here: the library is thousands of bytes to copy.
                        let mut load = redis::cmd("FUNCTION");
                        load.arg("LOAD").arg("REPLACE").arg(&self.library);
                        if let Err(err) = connection.query::<redis::Value>(&load).await {
                            break err;
                        }
                    }
                    Err(err) => break err,
                }
            };
            if functions_refused(&err) {
                let retry_at = self.created.elapsed() + RETRY_FUNCTIONS_AFTER;
                self.scripts_until.store(
                    u64::try_from(retry_at.as_millis()).unwrap_or(u64::MAX),
                    Ordering::Relaxed,
                );
            } else if !refused_before_running(&err) {
                return Err(err);
            }
        }
        let eval = as_script(transition, call);
        match connection.query(&eval).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let load = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(transition.code)
                    .clone();
                let _: String = connection.query(&load).await?;
                connection.query(&eval).await
            }
            other => other,
        }
    }

    fn functions_allowed(&self) -> bool {
        let until = self.scripts_until.load(Ordering::Relaxed);
        until == 0 || self.created.elapsed().as_millis() >= u128::from(until)
    }
}

/// How long a store that found functions refused sends scripts before it tries again.
const RETRY_FUNCTIONS_AFTER: Duration = Duration::from_secs(60);

/// The same call as `EVALSHA`: the function's name becomes the script's hash.
fn as_script(transition: &Transition, call: &Cmd) -> Cmd {
    let mut eval = redis::cmd("EVALSHA");
    eval.arg(transition.script.get_hash());
    for arg in call.args_iter().skip(2) {
        if let Arg::Simple(bytes) = arg {
            eval.arg(bytes);
        }
    }
    eval
}

/// `ERR Function not found`: the server runs functions but lacks the library.
fn function_missing(err: &RedisError) -> bool {
    err.code() == Some("ERR")
        && err
            .detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// A server that runs no functions for this client: no such command (before Redis 7.0),
/// or an ACL that refuses `FCALL` or `FUNCTION LOAD` (not one that refuses a key: a
/// script would be refused that key too).
fn functions_refused(err: &RedisError) -> bool {
    let detail = err.detail().unwrap_or("");
    (err.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        && (detail.contains("'fcall'") || detail.contains("'function")))
        || (err.code() == Some("ERR") && detail.starts_with("unknown command"))
}

/// A refusal of the whole function before it runs: Redis refuses a function that may write
/// when it is out of memory (`noeviction`), cannot persist or lacks replicas, even if this
/// call would only read (a replay), and refuses `FUNCTION LOAD` when out of memory. A
/// script is refused only at its first write, so the same call as a script still answers
/// a replay, a mismatch or an in-flight key, and a write meets the same refusal there.
fn refused_before_running(err: &RedisError) -> bool {
    matches!(err.code(), Some("OOM" | "MISCONF" | "NOREPLICAS"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_are_tried_again_once_a_refusal_has_aged() {
        let scripts = Scripts::new();
        assert!(scripts.functions_allowed(), "allowed until refused");
        // Refused until an hour after the store was made.
        scripts.scripts_until.store(3_600_000, Ordering::Relaxed);
        assert!(!scripts.functions_allowed(), "refused for now");
        // Refused until a millisecond after it was made: over by now.
        scripts.scripts_until.store(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(2));
        assert!(scripts.functions_allowed(), "tried again");
    }

    #[test]
    fn the_library_names_itself_and_every_function_after_its_hash() {
        let scripts = Scripts::new();
        let header = scripts.library.lines().next().unwrap();
        let name = header.strip_prefix("#!lua name=").unwrap();
        assert!(
            name.starts_with("idem_") && name.len() == "idem_".len() + 16,
            "{header}"
        );
        assert!(!scripts.library.contains("__IDEM__"));
        let transitions = [
            &scripts.claim,
            &scripts.complete,
            &scripts.fail,
            &scripts.release,
            &scripts.renew,
            &scripts.checkpoint,
            &scripts.get,
            &scripts.admin_release,
        ];
        assert_eq!(
            scripts.library.matches("redis.register_function(").count(),
            transitions.len()
        );
        for transition in transitions {
            assert!(transition.function.starts_with(&format!("{name}_")));
            let registered = format!("redis.register_function('{}',", transition.function);
            assert!(scripts.library.contains(&registered), "{registered}");
        }
    }

    fn server_error(line: &str) -> RedisError {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(err)) => err.into(),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn servers_without_functions_are_told_apart_from_a_missing_library() {
        // Redis 6: no such command.
        let old = server_error(
            "ERR unknown command 'FCALL', with args beginning with: 'idem_x_claim' '1' ",
        );
        assert!(functions_refused(&old) && !function_missing(&old));
        // An ACL that allows scripts only.
        let acl = server_error("NOPERM User scripts has no permissions to run the 'fcall' command");
        assert!(functions_refused(&acl) && !function_missing(&acl));
        let load = server_error(
            "NOPERM User scripts has no permissions to run the 'function|load' command",
        );
        assert!(functions_refused(&load));
        // An ACL that refuses the key: a script would be refused it as well.
        let key = server_error("NOPERM No permissions to access a key");
        assert!(!functions_refused(&key));
        // Refused whole before running: this one call goes as a script.
        for line in [
            "OOM command not allowed when used memory > 'maxmemory'.",
            "NOREPLICAS Not enough good replicas to write.",
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
        ] {
            let err = server_error(line);
            assert!(
                refused_before_running(&err) && !functions_refused(&err),
                "{line}"
            );
        }
        // A server with functions but not this library: load it, do not fall back.
        let missing = server_error("ERR Function not found");
        assert!(function_missing(&missing) && !functions_refused(&missing));
        // Anything else is the call's own error.
        for line in [
            "IDEM_CORRUPT token",
            "ERR Error running script (call to f_1): @user_function: 12: bad argument",
        ] {
            let err = server_error(line);
            assert!(
                !function_missing(&err)
                    && !functions_refused(&err)
                    && !refused_before_running(&err),
                "{line}"
            );
        }
    }

    #[test]
    fn a_call_becomes_the_same_script_call() {
        let scripts = Scripts::new();
        let mut call = scripts.call(&scripts.complete, b"idem:{k}");
        call.arg(7).arg(&b"attempt"[..]);
        let eval = as_script(&scripts.complete, &call);
        let args: Vec<Vec<u8>> = eval
            .args_iter()
            .map(|arg| match arg {
                Arg::Simple(bytes) => bytes.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        let expected: Vec<&[u8]> = vec![
            b"EVALSHA",
            scripts.complete.script.get_hash().as_bytes(),
            b"1",
            b"idem:{k}",
            b"7",
            b"attempt",
        ];
        assert_eq!(args, expected);
    }
}
