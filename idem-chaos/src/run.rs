//! One chaos run: workers executing keys through the proxy while faults are injected and
//! the server is crashed and revived; then a calm final pass, and the checks.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_core::{
    Error, Fingerprint, Heartbeat, Idempotency, InFlightPolicy, Key, Outcome, Store, WorkError,
};
use serde::Serialize;

use crate::backends::{self, Backend};
use crate::ledger::{Execution, Ledger};
use crate::proxy::{FaultCounts, FaultProxy};

/// Errors of the harness itself (a server that cannot be set up, a script that failed).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a run is shaped.
#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    /// Drives every random choice: faults, keys, work times.
    pub seed: u64,
    /// Concurrent workers.
    pub workers: usize,
    /// The most distinct keys the run creates: half of all calls try a new key until
    /// then, the other half retry a key already created.
    pub keys: usize,
    /// How long faults are injected.
    pub duration: Duration,
    /// Server crashes (each followed by a restart), spread over the duration.
    pub restarts: usize,
    /// Random faults per million requests.
    pub fault_ppm: u64,
    /// The driver's lease.
    pub lease: Duration,
}

/// What a run did and what the checks found.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The backend.
    pub backend: &'static str,
    /// The settings, seed included.
    pub settings: Settings,
    /// `execute` calls made while faults were injected.
    pub operations: u64,
    /// How those calls ended, by kind.
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Up to five distinct error messages the workers met, for reading a run.
    pub error_samples: Vec<String>,
    /// Faults injected, by kind.
    pub faults: FaultCounts,
    /// Server crashes and restarts done.
    pub restarts: usize,
    /// Keys created.
    pub keys: usize,
    /// Runs of the protected work, over the whole run.
    pub executions: usize,
    /// Keys whose work ran more than once.
    pub keys_run_more_than_once: usize,
    /// Executions beyond the first per key.
    pub duplicate_executions: usize,
    /// Of those: the earlier owner's lease ended while its work ran (a takeover).
    pub duplicates_lease_lost_mid_work: usize,
    /// Of those: the earlier owner finished, but its result never reached the store
    /// (the store was down or cut off), so its lease ran out and a retry took over.
    pub duplicates_result_never_stored: usize,
    /// Two owners at once without a lost lease to explain it, or a token that did not
    /// grow: must be 0.
    pub unexplained_overlaps: usize,
    /// Keys whose clients were given two different results: must be 0.
    pub changed_results: usize,
    /// Keys whose stored result is missing or differs from what clients were given:
    /// must be 0.
    pub lost_results: usize,
    /// Keys the calm final pass had to run (left undone by the faults).
    pub completed_after_faults: usize,
    /// Keys that did not complete even in the calm final pass: must be 0.
    pub keys_without_result: usize,
    /// Seconds the whole run took.
    pub elapsed_s: f64,
}

impl Report {
    /// True when every check that must be 0 is.
    pub fn passed(&self) -> bool {
        self.unexplained_overlaps == 0
            && self.changed_results == 0
            && self.lost_results == 0
            && self.keys_without_result == 0
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn key(index: usize) -> Key {
    Key::new("chaos/payments", format!("order-{index}")).expect("valid chaos keys")
}

/// What the protected work returns: the id of the execution that produced it.
fn result_of(id: u64) -> String {
    format!("exec-{id}")
}

/// The driver's bound on one store call: a blackholed connection costs this much.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one `execute` may take before the worker gives up on it (the future is
/// dropped: its lease is kept until it runs out, as when a client disconnects).
const CALL_LIMIT: Duration = Duration::from_secs(8);

/// Runs one chaos run against `backend` at `url`.
///
/// # Errors
/// When the harness cannot set the run up; the checks' findings are in the [`Report`].
pub async fn run(backend: Backend, url: &str, settings: Settings) -> Result<Report, BoxError> {
    let started = Instant::now();
    let namespace = format!("chaos_{}_{}", settings.seed, std::process::id());
    let direct = backend.store(url, None, &namespace).await?;
    let proxy = FaultProxy::start(backends::address(url)?, settings.seed).await?;
    let proxied = backend.store(url, Some(proxy.addr()), &namespace).await?;
    let idem = Idempotency::builder(Arc::clone(&proxied))
        .lease(settings.lease)
        .retention(Duration::from_secs(3600))
        .heartbeat(Heartbeat::Auto)
        .store_timeout(STORE_TIMEOUT)
        .build()?;
    let ledger = Arc::new(Ledger::default());
    let outcomes = Arc::new(Mutex::new(BTreeMap::<&'static str, u64>::new()));
    let samples = Arc::new(Mutex::new(Vec::<String>::new()));
    let operations = Arc::new(AtomicU64::new(0));
    let deadline = tokio::time::Instant::now() + settings.duration;

    proxy.set_rate(settings.fault_ppm);
    let proxy = Arc::new(proxy);
    let restarts = Arc::new(AtomicUsize::new(0));
    let restarter = tokio::spawn(crash_and_revive(
        backend,
        Arc::clone(&proxy),
        settings.clone(),
        Arc::clone(&restarts),
    ));
    let created = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..settings.workers {
        let context = Worker {
            idem: idem.clone(),
            direct: Arc::clone(&direct),
            ledger: Arc::clone(&ledger),
            outcomes: Arc::clone(&outcomes),
            samples: Arc::clone(&samples),
            operations: Arc::clone(&operations),
            rng: fastrand::Rng::with_seed(settings.seed ^ ((worker as u64 + 1) * 0x9E37_79B9)),
            max_keys: settings.keys,
            created: Arc::clone(&created),
            lease: settings.lease,
        };
        workers.spawn(context.run_until(deadline));
    }
    while workers.join_next().await.is_some() {}
    restarter.await??;
    proxy.set_rate(0);

    // Calm: every key must complete, and what leases the faults stranded must run out.
    let calm = Idempotency::builder(Arc::clone(&proxied))
        .lease(settings.lease)
        .retention(Duration::from_secs(3600))
        .in_flight(InFlightPolicy::Wait {
            timeout: settings.lease * 3 + Duration::from_secs(10),
        })
        .store_timeout(STORE_TIMEOUT)
        .build()?;
    let before = ledger.executions().len();
    let mut keys_without_result = 0;
    let keys = created.load(Ordering::SeqCst).min(settings.keys);
    for index in 0..keys {
        let answer = tokio::time::timeout(
            CALL_LIMIT * 4,
            calm.execute(
                &key(index),
                Fingerprint::of_bytes("chaos"),
                work(&ledger, index, 0),
            ),
        )
        .await;
        match answer {
            Ok(Ok(Outcome::Completed { value, .. })) => ledger.observe(index, value),
            _ => keys_without_result += 1,
        }
    }
    let completed_after_faults = ledger.executions().len() - before;

    let mut report = Report {
        backend: backend.name(),
        operations: operations.load(Ordering::SeqCst),
        outcomes: outcomes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone(),
        error_samples: samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone(),
        faults: proxy.counts(),
        restarts: restarts.load(Ordering::SeqCst),
        keys,
        executions: ledger.executions().len(),
        keys_run_more_than_once: 0,
        duplicate_executions: 0,
        duplicates_lease_lost_mid_work: 0,
        duplicates_result_never_stored: 0,
        unexplained_overlaps: 0,
        changed_results: 0,
        lost_results: 0,
        completed_after_faults,
        keys_without_result,
        elapsed_s: 0.0,
        settings,
    };
    check(&ledger, direct.as_ref(), &mut report).await;
    report.elapsed_s = started.elapsed().as_secs_f64();
    Ok(report)
}

type WorkRun = std::pin::Pin<Box<dyn Future<Output = Result<String, WorkError<()>>> + Send>>;

/// The protected work: records itself in the ledger and returns its execution's id.
fn work(
    ledger: &Arc<Ledger>,
    index: usize,
    work_ms: u64,
) -> impl FnOnce(idem_core::Context) -> WorkRun + use<> {
    let ledger = Arc::clone(ledger);
    move |ctx| {
        Box::pin(async move {
            let lease_ms = |ctx: &idem_core::Context| ctx.lease().lease_until.as_unix_millis();
            let id = ledger.begin(index, ctx.token(), now_ms(), lease_ms(&ctx));
            tokio::time::sleep(Duration::from_millis(work_ms)).await;
            ledger.end(id, now_ms(), lease_ms(&ctx));
            Ok(result_of(id))
        })
    }
}

struct Worker {
    idem: Idempotency<Arc<dyn Store>>,
    direct: Arc<dyn Store>,
    ledger: Arc<Ledger>,
    outcomes: Arc<Mutex<BTreeMap<&'static str, u64>>>,
    samples: Arc<Mutex<Vec<String>>>,
    operations: Arc<AtomicU64>,
    rng: fastrand::Rng,
    max_keys: usize,
    created: Arc<AtomicUsize>,
    lease: Duration,
}

impl Worker {
    async fn run_until(mut self, deadline: tokio::time::Instant) {
        while tokio::time::Instant::now() < deadline {
            let index = self.pick_key();
            // Most work is quick; one run in ten outlives the lease, kept alive only by
            // the heartbeat (which the faults may starve).
            let work_ms = if self.rng.u8(0..10) == 0 {
                self.lease.as_millis() as u64 * 3 / 2
            } else {
                self.rng.u64(1..40)
            };
            self.operations.fetch_add(1, Ordering::Relaxed);
            let k = key(index);
            let call = self.idem.execute(
                &k,
                Fingerprint::of_bytes("chaos"),
                work(&self.ledger, index, work_ms),
            );
            let kind = match tokio::time::timeout(CALL_LIMIT, call).await {
                Ok(Ok(Outcome::Completed { value, replayed })) => {
                    self.ledger.observe(index, value);
                    if replayed { "replayed" } else { "executed" }
                }
                Ok(Ok(_)) => "other_outcome",
                Ok(Err(Error::InFlight { .. })) => "in_flight",
                Ok(Err(Error::LeaseLost)) => "lease_lost",
                Ok(Err(err @ Error::Store(_))) => {
                    self.sample(&err);
                    "store_error"
                }
                Ok(Err(err)) => {
                    self.sample(&err);
                    "other_error"
                }
                Err(_) => "gave_up",
            };
            if matches!(kind, "store_error" | "gave_up" | "lease_lost") {
                // The answer was lost; whatever landed in the store is what a later
                // replay must give: read it on the direct path and hold it to that.
                self.read_back(index).await;
            }
            *self
                .outcomes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(kind)
                .or_default() += 1;
            if kind == "in_flight" || kind == "store_error" {
                tokio::time::sleep(Duration::from_millis(self.rng.u64(5..50))).await;
            }
        }
    }

    fn sample(&self, err: &Error) {
        let mut text = err.to_string();
        let mut source = std::error::Error::source(err);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        if samples.len() < 5 && !samples.contains(&text) {
            samples.push(text);
        }
    }

    /// A new key half the time (until the run has made its most), else a retry of one
    /// already made.
    fn pick_key(&mut self) -> usize {
        let made = self.created.load(Ordering::SeqCst).min(self.max_keys);
        if made == 0 || (made < self.max_keys && self.rng.bool()) {
            let next = self.created.fetch_add(1, Ordering::SeqCst);
            if next < self.max_keys {
                return next;
            }
        }
        self.rng.usize(0..made.max(1))
    }

    async fn read_back(&self, index: usize) {
        let k = key(index);
        let read = tokio::time::timeout(Duration::from_secs(2), self.direct.get(&k));
        if let Ok(Ok(Some(record))) = read.await
            && record.state == idem_core::State::Completed
            && let Some(value) = record
                .response
                .as_deref()
                .and_then(|bytes| serde_json::from_slice::<String>(bytes).ok())
        {
            self.ledger.observe(index, value);
        }
    }
}

/// Crashes the server `settings.restarts` times, evenly over the run, reviving it each
/// time after a short outage.
async fn crash_and_revive(
    backend: Backend,
    proxy: Arc<FaultProxy>,
    settings: Settings,
    done: Arc<AtomicUsize>,
) -> Result<(), BoxError> {
    let start = tokio::time::Instant::now();
    for n in 1..=settings.restarts {
        let at = start
            + settings
                .duration
                .mul_f64(n as f64 / (settings.restarts + 1) as f64);
        tokio::time::sleep_until(at).await;
        backends::crash_and_revive_once(backend, &proxy).await?;
        done.fetch_add(1, Ordering::SeqCst);
    }
    Ok(())
}

/// Reads a record on the direct path, again after an error: the first call on a
/// connection that a server restart broke fails, and that is not a lost result.
async fn read_back(
    direct: &dyn Store,
    key: &idem_core::Key,
) -> Result<Option<idem_core::Record>, idem_core::StoreError> {
    let mut tries = 0;
    loop {
        match direct.get(key).await {
            Err(_) if tries < 5 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

/// Ownership intervals may touch within this much (millisecond rounding of the clocks).
const CLOCK_SLACK_MS: u64 = 5;

/// The checks: one result per key that never changed and is what the store holds, and
/// duplicate executions only where a lease really ran out.
async fn check(ledger: &Ledger, direct: &dyn Store, report: &mut Report) {
    let observed = ledger.observed();
    let mut by_key: BTreeMap<usize, Vec<Execution>> = BTreeMap::new();
    for execution in ledger.executions() {
        by_key.entry(execution.key).or_default().push(execution);
    }
    for index in 0..report.keys {
        let seen = observed.get(&index).map(Vec::as_slice).unwrap_or_default();
        if seen.windows(2).any(|pair| pair[0] != pair[1]) {
            report.changed_results += 1;
            eprintln!("key {index}: clients were given different results: {seen:?}");
        }
        let stored = match read_back(direct, &key(index)).await {
            Ok(Some(record)) if record.state == idem_core::State::Completed => record
                .response
                .as_deref()
                .and_then(|bytes| serde_json::from_slice::<String>(bytes).ok()),
            Ok(_) => None,
            Err(err) => {
                eprintln!("key {index}: the record could not be read back: {err}");
                None
            }
        };
        if let Some(first) = seen.first()
            && stored.as_ref() != Some(first)
        {
            report.lost_results += 1;
            eprintln!("key {index}: clients were given {first}, the store holds {stored:?}");
        }
        let Some(executions) = by_key.get_mut(&index) else {
            continue;
        };
        executions.sort_by_key(|execution| (execution.started_ms, execution.id));
        if executions.len() > 1 {
            report.keys_run_more_than_once += 1;
            report.duplicate_executions += executions.len() - 1;
        }
        for pair in executions.windows(2) {
            let (earlier, later) = (&pair[0], &pair[1]);
            let earlier_end = earlier.ended_ms.unwrap_or(u64::MAX);
            let lease_ran_out = later.started_ms + CLOCK_SLACK_MS >= earlier.lease_until_ms;
            if later.token <= earlier.token || !lease_ran_out {
                report.unexplained_overlaps += 1;
                eprintln!("key {index}: {later:?} began while {earlier:?} held the key");
            } else if later.started_ms < earlier_end {
                report.duplicates_lease_lost_mid_work += 1;
            } else {
                report.duplicates_result_never_stored += 1;
            }
        }
    }
}
