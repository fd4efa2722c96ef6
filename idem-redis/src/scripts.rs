//! The Lua scripts, one per transition, each with the shared helpers in front.

use redis::Script;

macro_rules! script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("../lua/common.lua"),
            "\n",
            include_str!(concat!("../lua/", $file))
        ))
    };
}

/// Every script the store runs. `Script` sends `EVALSHA` and, on `NOSCRIPT` (a restart, a
/// failover, a `SCRIPT FLUSH`), loads the script and runs it again.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) claim: Script,
    pub(crate) complete: Script,
    pub(crate) fail: Script,
    pub(crate) release: Script,
    pub(crate) renew: Script,
    pub(crate) checkpoint: Script,
    pub(crate) get: Script,
    pub(crate) admin_release: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            claim: script!("claim.lua"),
            complete: script!("complete.lua"),
            fail: script!("fail.lua"),
            release: script!("release.lua"),
            renew: script!("renew.lua"),
            checkpoint: script!("checkpoint.lua"),
            get: script!("get.lua"),
            admin_release: script!("admin_release.lua"),
        }
    }
}
