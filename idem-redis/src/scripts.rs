//! The transitions' Lua, in the two forms a server may run it: a function in idem's Redis
//! Functions library (Redis 7 and later), and the same code as a script for servers without
//! Functions.
//!
//! Redis runs a script's whole body on every `EVALSHA`, so every script defined every shared
//! helper on every call. A library's top level runs once, when it is loaded; each `FCALL`
//! runs only its function. The library's name and its functions' carry a hash of its code,
//! so two versions of idem on one server (a rolling deploy) each call their own.

use std::sync::atomic::{AtomicBool, Ordering};

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
    /// Set once the server showed it runs no functions for this client (a server before
    /// 7.0, an ACL that allows scripts only): scripts from then on.
    scripts_only: AtomicBool,
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
            scripts_only: AtomicBool::new(false),
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
    /// had it) and calls again; runs the script instead on a server without functions.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        connection: &Connection,
        transition: &Transition,
        call: &Cmd,
    ) -> RedisResult<T> {
        if !self.scripts_only.load(Ordering::Relaxed) {
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
            if !functions_refused(&err) {
                return Err(err);
            }
            self.scripts_only.store(true, Ordering::Relaxed);
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
}

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
/// or an ACL that refuses `FCALL` or `FUNCTION LOAD`.
fn functions_refused(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        || (err.code() == Some("ERR")
            && err
                .detail()
                .is_some_and(|d| d.starts_with("unknown command")))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // A server with functions but not this library: load it, do not fall back.
        let missing = server_error("ERR Function not found");
        assert!(function_missing(&missing) && !functions_refused(&missing));
        // Anything else is the call's own error.
        for line in [
            "IDEM_CORRUPT token",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "ERR Error running script (call to f_1): @user_function: 12: bad argument",
        ] {
            let err = server_error(line);
            assert!(
                !function_missing(&err) && !functions_refused(&err),
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
