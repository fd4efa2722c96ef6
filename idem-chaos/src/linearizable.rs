//! `idem-chaos linearizable`: idem-testkit's linearizability checker on the durable
//! servers, with the fault proxy in front and the server crashed and revived while the
//! clients call.
//!
//! Every answer that comes back must be explained by the state machine; an answer that
//! was lost (a cut, a refusal, a blackhole, a crash) may have taken effect or not.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem_core::Store;
use idem_testkit::linearizability::{self, CheckError, Checker, Workload};
use serde::Serialize;

use crate::backends::{self, Backend};
use crate::proxy::{FaultCounts, FaultProxy};
use crate::run::BoxError;

/// How a run is shaped.
#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    /// Drives the workload's choices and the proxy's faults.
    pub seed: u64,
    /// Calls in all.
    pub operations: usize,
    /// Concurrent clients.
    pub clients: usize,
    /// Keys they share.
    pub keys: usize,
    /// Random faults per million requests.
    pub fault_ppm: u64,
    /// Server crashes, each followed by a restart.
    pub restarts: usize,
    /// Time between the start and the first crash, and between crashes.
    pub crash_every: Duration,
}

/// What a run did and what the checker found.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The backend.
    pub backend: &'static str,
    /// The settings, seed included.
    pub settings: Settings,
    /// Calls made.
    pub operations: usize,
    /// Of those, the ones whose answer was lost.
    pub lost: usize,
    /// Faults the proxy injected.
    pub faults: FaultCounts,
    /// Crashes and restarts done while the clients called.
    pub restarts: usize,
    /// States the checker's searches visited, in all.
    pub states: u64,
    /// The most states one key's search visited.
    pub longest_search: u64,
    /// Seconds the calls took.
    pub record_s: f64,
    /// Seconds the check took.
    pub check_s: f64,
    /// The smallest unexplained history, when there is one.
    pub unexplained: Option<String>,
}

impl Report {
    /// True when every answer was explained.
    pub fn passed(&self) -> bool {
        self.unexplained.is_none() && (self.settings.restarts == 0 || self.restarts > 0)
    }
}

/// The longest a call may take before its answer counts as lost.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// How long after its client gave up a lost call may still land: the proxy holds a
/// request at most [`MAX_DELAY`](crate::proxy::MAX_DELAY) and a blackholed request never
/// reaches the server, but a server that took the request may still be working on it
/// (an fsync, a lock wait, a pause of DynamoDB Local's JVM) when the client gives up.
const LOST_GRACE: Duration = Duration::from_secs(1);

/// Runs the workload against `backend` at `url` through the fault proxy, crashing the
/// server as `settings` says, and checks the history.
///
/// # Errors
/// When the run cannot be set up; the checker's findings are in the [`Report`].
pub async fn run(backend: Backend, url: &str, settings: Settings) -> Result<Report, BoxError> {
    let namespace = format!("linearizable_{}_{}", settings.seed, std::process::id());
    // Set up (schema, table) on the direct path, then every call goes through the proxy.
    drop(backend.checked_store(url, None, &namespace).await?);
    let proxy = FaultProxy::start(backends::address(url)?, settings.seed).await?;
    let stores: Vec<Arc<dyn Store>> = vec![
        backend
            .checked_store(url, Some(proxy.addr()), &namespace)
            .await?,
        backend
            .checked_store(url, Some(proxy.addr()), &namespace)
            .await?,
    ];
    proxy.set_rate(settings.fault_ppm);
    let proxy = Arc::new(proxy);
    let restarts = Arc::new(AtomicUsize::new(0));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let crasher = tokio::spawn(crash_and_revive(
        backend,
        Arc::clone(&proxy),
        (settings.restarts, settings.crash_every),
        stopped,
        Arc::clone(&restarts),
    ));
    let workload = Workload::default()
        .seed(settings.seed)
        .operations(settings.operations)
        .clients(settings.clients)
        .keys(settings.keys)
        .call_timeout(CALL_TIMEOUT);
    let started = Instant::now();
    let history = linearizability::record_on(&stores, &workload).await;
    let record_s = started.elapsed().as_secs_f64();
    // A crash still to come would find no client: the run ends here (a crash under way
    // ends with its revival first).
    let _ = stop.send(true);
    proxy.set_rate(0);
    crasher.await??;
    let started = Instant::now();
    let recorded = history.clone();
    let checked = tokio::task::spawn_blocking(move || {
        let checker = Checker::default().lost_grace(LOST_GRACE);
        // DynamoDB's conditions compare with a clock the client read before sending;
        // PostgreSQL's `now()` is read when a statement starts, before it waits for a
        // row lock, and a takeover compares it again after the wait.
        let checker = if matches!(backend, Backend::DynamoDb | Backend::Postgres) {
            checker.moments_in_any_order()
        } else {
            checker
        };
        let checked = checker.check(&history);
        (history.operations.len(), history.lost(), checked)
    })
    .await?;
    let check_s = started.elapsed().as_secs_f64();
    let (operations, lost, checked) = checked;
    let mut report = Report {
        backend: backend.name(),
        settings,
        operations,
        lost,
        faults: proxy.counts(),
        restarts: restarts.load(Ordering::SeqCst),
        states: 0,
        longest_search: 0,
        record_s,
        check_s,
        unexplained: None,
    };
    match checked {
        Ok(checked) => {
            report.states = checked.states;
            report.longest_search = checked.longest_search;
        }
        Err(CheckError::Unexplained(mut counterexample)) => {
            counterexample.seed = Some(report.settings.seed);
            let shown_from = counterexample.operations.first().map(|o| o.invoked);
            let said = counterexample.to_string();
            let key = counterexample.key.clone();
            report.unexplained = Some(with_whole_history(
                said,
                &recorded,
                &key,
                shown_from,
                backend,
                report.settings.seed,
            ));
        }
        Err(err @ CheckError::TooLong { .. }) => {
            let CheckError::TooLong { scope, key, .. } = &err else {
                unreachable!("matched above")
            };
            let key = idem_core::Key::new(scope.clone(), key.clone());
            let said = err.to_string();
            report.unexplained = Some(match key {
                Ok(key) => {
                    with_whole_history(said, &recorded, &key, None, backend, report.settings.seed)
                }
                Err(_) => said,
            });
        }
        Err(other) => report.unexplained = Some(other.to_string()),
    }
    Ok(report)
}

/// `said` followed by where the key's whole history was written (or why it could not
/// be): every call on it under `target/linearizable-unexplained/`, named as a
/// counterexample names them, so that the calls around what the checker could not
/// explain or decide can be read (the lost ones above all). `shown_from`: when the
/// counterexample's times start, to line the two up.
fn with_whole_history(
    said: String,
    history: &linearizability::History,
    key: &idem_core::Key,
    shown_from: Option<idem_core::Timestamp>,
    backend: Backend,
    seed: u64,
) -> String {
    match write_whole_history(&said, history, key, shown_from, backend, seed) {
        Ok(path) => format!("{said}\n  the key's whole history: {}", path.display()),
        Err(err) => format!("{said}\n  the key's whole history could not be written: {err}"),
    }
}

fn write_whole_history(
    said: &str,
    history: &linearizability::History,
    key: &idem_core::Key,
    shown_from: Option<idem_core::Timestamp>,
    backend: Backend,
    seed: u64,
) -> std::io::Result<std::path::PathBuf> {
    let operations = history
        .by_key()
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, operations)| operations)
        .unwrap_or_default();
    let offset = match (operations.first(), shown_from) {
        (Some(first), Some(shown)) => format!(
            " (the counterexample's +0ms is {:+}ms here)",
            i128::from(shown.as_unix_millis()) - i128::from(first.invoked.as_unix_millis())
        ),
        _ => String::new(),
    };
    let dir = std::path::Path::new("target").join("linearizable-unexplained");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{}-seed{seed}-{}.txt", backend.name(), key.key()));
    let whole = linearizability::History { operations };
    let text = format!(
        "{said}\n\nEvery call on the key ({} lost), times from its first call{offset}:\n{whole}",
        whole.lost()
    );
    std::fs::write(&path, text)?;
    Ok(path)
}

/// Crashes the server `restarts` times, `every` apart, reviving it after a short outage,
/// until `stop` turns true.
async fn crash_and_revive(
    backend: Backend,
    proxy: Arc<FaultProxy>,
    (restarts, every): (usize, Duration),
    mut stop: tokio::sync::watch::Receiver<bool>,
    done: Arc<AtomicUsize>,
) -> Result<(), BoxError> {
    for _ in 0..restarts {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|stop| *stop) => return Ok(()),
        }
        backends::crash_and_revive_once(backend, &proxy).await?;
        done.fetch_add(1, Ordering::SeqCst);
    }
    Ok(())
}
