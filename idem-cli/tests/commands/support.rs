//! What the tests share: a store the binary is pointed at (and the same store through
//! the library), one run of the binary, and runs without a store.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Admin, Fingerprint, Key, record::Lease, store::ClaimOutcome, store::ClaimRequest,
    store::WriteOutcome,
};
use serde_json::Value;
use tokio::runtime::Runtime;

pub(crate) const LONG: Duration = Duration::from_secs(3600);

/// A store the binary is pointed at, and the same store opened through the library.
pub(crate) struct Backend {
    pub(crate) runtime: Runtime,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(&'static str, String)>,
    pub(crate) store: Arc<dyn Admin>,
    /// Whether `idem purge` deletes (false: the store deletes expired records itself).
    pub(crate) purges: bool,
}

impl Backend {
    /// Runs `idem ARGS` against this store, with no terminal on stdin.
    pub(crate) fn idem(&self, args: &[&str]) -> Run {
        let output = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(args)
            .args(&self.args)
            .env_remove("IDEM_STORE")
            .env_remove("IDEM_TABLE")
            .env_remove("IDEM_PREFIX")
            .env_remove("IDEM_LOG_HASH_SECRET")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .output()
            .expect("run the idem binary");
        Run {
            code: output.status.code().expect("exited, not killed"),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Runs the command, which must succeed.
    pub(crate) fn ok(&self, args: &[&str]) -> Run {
        let run = self.idem(args);
        assert_eq!(run.code, 0, "idem {args:?}: {run:?}");
        run
    }

    pub(crate) fn block<T>(&self, future: impl Future<Output = T>) -> T {
        self.runtime.block_on(future)
    }

    pub(crate) fn claim(
        &self,
        scope: &str,
        key: &str,
        lease: Duration,
        retention: Duration,
    ) -> Lease {
        let request = ClaimRequest::new(
            Key::new(scope, key).unwrap(),
            Fingerprint::of_bytes(key),
            lease,
            retention,
        );
        match self.block(self.store.claim(&request)).unwrap() {
            ClaimOutcome::Claimed { lease, .. } => lease,
            other => panic!("{scope}/{key}: {other:?}"),
        }
    }

    pub(crate) fn completed(&self, scope: &str, key: &str, retention: Duration, response: &str) {
        let lease = self.claim(scope, key, LONG, retention);
        let done = self.block(self.store.complete(&lease, response.as_bytes()));
        assert_eq!(done.unwrap(), WriteOutcome::Applied);
    }

    pub(crate) fn failed(&self, scope: &str, key: &str) {
        let lease = self.claim(scope, key, LONG, LONG);
        let done = self.block(self.store.fail(&lease, b"declined"));
        assert_eq!(done.unwrap(), WriteOutcome::Applied);
    }

    pub(crate) fn get(&self, scope: &str, key: &str) -> Option<idem_core::Record> {
        self.block(self.store.get(&Key::new(scope, key).unwrap()))
            .unwrap()
    }

    /// Five records: two completed and one stuck in `acct_1/charge`, one failed in
    /// `acct_2/refund`, one in progress with a live lease in `acct_3/charge`.
    pub(crate) fn seed(&self) {
        self.completed("acct_1/charge", "secret-a", LONG, "{\"paid\":1}");
        self.completed("acct_1/charge", "secret-b", LONG, "{\"paid\":2}");
        self.claim(
            "acct_1/charge",
            "secret-stuck",
            Duration::from_millis(1),
            LONG,
        );
        self.failed("acct_2/refund", "secret-f");
        self.claim("acct_3/charge", "secret-live", LONG, LONG);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What one run of the binary did.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|err| panic!("{err}: {self:?}"))
    }
}

/// Runs the binary with no store flags from a backend.
pub(crate) fn bare(args: &[&str]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_STORE")
        .env_remove("IDEM_TABLE")
        .env_remove("IDEM_PREFIX")
        .env_remove("IDEM_LOG_HASH_SECRET")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .stdin(Stdio::null())
        .output()
        .expect("run the idem binary");
    Run {
        code: output.status.code().expect("exited"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}
