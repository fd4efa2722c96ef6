//! A systematic explorer of fault points: every store call and every await point of the
//! work is a place where a fault can strike, and the explorer tries them, one by one and
//! in pairs, then checks the promises that must hold whatever happened.
//!
//! Each run simulates processes over one store under test. Every process (the first
//! caller, a racing duplicate, each retry) gets its own store handle and its own
//! `Idempotency` with the same settings. Each store call of a process has a number: its
//! fault point. The explorer first runs each [`Scenario`] without faults to count the
//! points it reaches, then, in [`Mode::Exhaustive`], runs it once for every [`Fault`] at
//! every point of that fault-free run, then samples pairs of faults (the second chosen
//! among the points the run with the first reached). [`Mode::Sampled`] runs a seeded
//! sample instead, for stores on real servers where every run waits in real time.
//!
//! What "exhaustive" covers, exactly: every single fault at every point of the fault-free
//! run, which are the points of the first caller and of the racing duplicate (`p1`,
//! `dup`), and of the retries only in the scenarios whose fault-free run retries by
//! itself (`retryable-then-done`, `saga-undo-retryable`). The points only a fault opens
//! (the takeover after a crash or a drop, the retry after a lost answer, the compensation
//! such a takeover finishes) are not among them: those paths are reached only by the
//! sampled pairs, whose second fault may strike any point the first fault's run reached,
//! a takeover's included. More pairs cover more of them; none promises them all.
//!
//! Faults at a store call: an error before it applies, an answer lost after it applied, a
//! hang past the store timeout (then it applies, or not), the caller dropping `execute`
//! while the call is pending (before or after it applied), a crash of the process
//! (before or after it applied: every later call of that process never reaches the store,
//! its futures are dropped, and a new process with the same settings retries once the
//! lease has run out), a partition of that process alone from this call on (its calls
//! fail for two leases, its work goes on), and a copy of the call landing again later
//! (once the process's `execute` ended, or just after the key is next granted to another
//! process). At the work's await points: a drop, a crash, a stall of two leases (its
//! heartbeats go on), a pause of the whole process for two leases (every call it starts
//! meanwhile, its heartbeats' included, leaves only once it resumes), and a partition
//! from that point on.
//!
//! After a pause or a partition, a [`Process::Racer`] retries beside the process that is
//! still alive, a quarter lease after its lease (as the store last granted or renewed it)
//! ran out: the owner that comes back must start no new step, and its writes are fenced.
//! With the waiting duplicate, three processes hold or want the key at once.
//!
//! Runs replay exactly on the memory store: each process's driver draws its backoff
//! jitter from a seed of its own (`IdempotencyBuilder::jitter_seed`), so a violation's
//! plan, printed with it, makes the same run again through [`Explorer::run_plan`]. A store
//! that answers from a thread of its own (SQLite), or a server, varies its timing between
//! runs: there a plan replays its faults, not every interleaving.
//!
//! Processes may have clocks of their own ([`Target::per_process_clocks`],
//! [`Timing::skew`]): each gets its own handle on the run's store, reading its clock, as
//! processes on machines whose clocks differ would.
//!
//! After each run the explorer retries (each retry a new process, bounded) until some
//! caller gets a result, retries once more, and checks the run's ledger, kept outside the
//! store:
//!
//! 1. A step's or the work's effect happens at most once, except where the contract says
//!    at-least-once, and then the run is counted so ([`ScenarioReport::at_least_once`]),
//!    never silently: the process that had the effect crashed, or its caller dropped
//!    `execute` while the work still ran and before the step's checkpoint was sent, or it
//!    paused after the effect, or it was partitioned from the store, after the effect and
//!    before its checkpoint (or result) was stored, and the store granted the key to the
//!    next owner only once that lease was over. Nothing is excused once the process went
//!    past the step (the step returns only once its checkpoint is stored). A lease that
//!    ran out while its owner still ran excuses nothing: every scenario runs with
//!    heartbeats, which renew it every third of a lease. The work's own effect outside any
//!    step, had by a process after a pause or a partition cost it its lease, is
//!    at-least-once: no lease check guards code outside a step (DESIGN.md §2.5); a step
//!    started after the lease was lost is never excused.
//! 2. A drop of `execute` after the work returned, or after a step's checkpoint was sent,
//!    never causes a re-run: the driver's writes survive the caller going away.
//! 3. An undo runs at most once; one interrupted while running is not run again and is
//!    listed in `Compensation::interrupted`.
//! 4. Every step that registered an undo is in exactly one of the final compensation's
//!    `undone`, `failed.step`, `pending`, `interrupted`; an undo listed as undone ran
//!    exactly once, one listed interrupted at most once, one listed pending never. The
//!    fault-free run ends with the compensation the scenario documents (every step
//!    undone for a plain saga), and an undo that answered `Unknown` is always listed
//!    interrupted. The compensation of a failure stored as a marker is read from the
//!    record.
//! 5. Every caller that got a result (Completed, Failed, Compensated, a stored failure
//!    marker) got the same one, of the scenario's kind, and the retry after replays it.
//! 6. `ctx.resumed()` is true exactly when the store's grant said takeover; fencing
//!    tokens grow; every renewal extends the lease; a late claim or renewal never holds a
//!    released key for nobody; `LeaseLost` is never the answer of a caller whose own
//!    result was stored; no answer is one a correct driver never gives; no
//!    `execute` panics; every `execute` returns within [`execute_bound`] (measured on
//!    Tokio's clock: virtual where time is paused). A hanging call outlasts the largest
//!    bound of its scenario, so a call the driver does not bound always shows.
//!
//! Stores with a process clock (memory, SQLite) run on a paused Tokio runtime with a
//! [`VirtualClock`] ([`Target::virtual_time`]): leases, heartbeats, timeouts and backoffs
//! are deterministic and instant. Stores on a server's clock ([`Target::real_time`]) run in
//! real time with short leases ([`Timing::real_time`]).
//!
//! ```
//! use idem_core::MemoryStore;
//! use idem_testkit::explore::{Explorer, Mode, Scenario, Target};
//!
//! let target = Target::virtual_time("memory", |clock| async move {
//!     Ok::<_, std::convert::Infallible>(MemoryStore::with_clock(clock))
//! });
//! let report = Explorer::new(target)
//!     .scenarios([Scenario::Plain])
//!     .mode(Mode::sampled(7, 4))
//!     .run()?;
//! // One line per scenario and the totals, then every violation with its faults.
//! println!("{report}");
//! assert_eq!(report.scenarios[0].runs, 5);
//! # Ok::<(), idem_testkit::explore::ExploreError>(())
//! ```

mod check;
mod clock;
mod faults;
mod ledger;
mod report;
mod rng;
mod run;
mod scenarios;
mod target;
mod timing;

use std::fmt;
use std::sync::Arc;

use idem_core::{BoxError, key::KeyError};

pub use clock::{ProcessClock, VirtualClock};
pub use faults::{Fault, FaultPoint, PlacedFault, Process, Site};
pub use report::{Broken, Report, ScenarioReport, Violation};
pub use scenarios::Scenario;
pub use target::Target;
pub use timing::{Timing, execute_bound};

use rng::Rng;
use run::RunOutcome;
use target::{Keys, RealRunner, Runner, Time, VirtualRunner, VirtualStores};

/// The seed sampled modes use when none is given.
pub const DEFAULT_SEED: u64 = 0x1DE5_EED5;

/// Why an exploration could not run (what it found is in the [`Report`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExploreError {
    /// No Tokio runtime could be built.
    #[error("the explorer could not start a Tokio runtime")]
    Runtime(#[source] std::io::Error),
    /// The target's factory failed.
    #[error("the store of {target} could not be made")]
    Store {
        /// The target's name.
        target: String,
        /// The factory's error.
        #[source]
        source: BoxError,
    },
    /// A run's key was refused (a scenario name too long for a scope, say).
    #[error("a run's key was refused")]
    Key(#[from] KeyError),
    /// An environment variable read by [`Mode::from_env`] is not a number.
    #[error("{variable} is {value:?}, which is not a whole number")]
    BadEnv {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// [`Timing::skew`] cannot apply: the target gives every process the same store (use
    /// [`Target::per_process_clocks`]), or the skew is ten leases or more (records would
    /// look expired to one process and live to another for reasons no fault explains).
    #[error("a skew of {skew:?} cannot apply: {why}")]
    Skew {
        /// The skew asked for.
        skew: std::time::Duration,
        /// Why it cannot apply.
        why: &'static str,
    },
    /// The exploration's own thread panicked (a bug of the explorer, or a panicking
    /// store factory).
    #[error("the exploration panicked: {0}")]
    Panicked(String),
}

/// Which runs an exploration makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// Per scenario: the fault-free run, then every fault kind at every fault point it
    /// reached (the first caller's and the duplicate's: not those of a takeover only a
    /// fault opens), then `pairs` runs with two faults (the first one of
    /// those, the second drawn with `seed` among the points the run with the first
    /// reached, a takeover's included).
    Exhaustive {
        /// Runs with two faults, per scenario.
        pairs: usize,
        /// Draws the pairs.
        seed: u64,
    },
    /// Per scenario the fault-free run, then `runs` runs in all across the scenarios, in
    /// turn: one fault at a point drawn with `seed`, and half the time a second run with
    /// a second fault added.
    Sampled {
        /// Runs with faults, across all scenarios.
        runs: usize,
        /// Draws the faults.
        seed: u64,
    },
}

impl Mode {
    /// Every single fault at every point of the fault-free run, no pairs.
    pub fn exhaustive() -> Self {
        Mode::Exhaustive {
            pairs: 0,
            seed: DEFAULT_SEED,
        }
    }

    /// Every single fault at every point of the fault-free run, then `pairs` sampled
    /// pairs per scenario drawn with `seed` (the only runs that fault a takeover).
    pub fn exhaustive_with_pairs(seed: u64, pairs: usize) -> Self {
        Mode::Exhaustive { pairs, seed }
    }

    /// `runs` sampled runs drawn with `seed`.
    pub fn sampled(seed: u64, runs: usize) -> Self {
        Mode::Sampled { runs, seed }
    }

    /// [`Mode::sampled`] with the seed in `IDEM_EXPLORE_SEED` (else [`DEFAULT_SEED`]) and
    /// the count in `IDEM_EXPLORE_RUNS` (else `default_runs`): what the backends' tests
    /// use, so that a CI failure replays from its printed seed and a long run is a
    /// variable away.
    ///
    /// # Errors
    /// [`ExploreError::BadEnv`] when either is set to something other than a number.
    pub fn from_env(default_runs: usize) -> Result<Self, ExploreError> {
        let seed = env_number("IDEM_EXPLORE_SEED")?.unwrap_or(DEFAULT_SEED);
        let runs = env_number("IDEM_EXPLORE_RUNS")?
            .map_or(Ok(default_runs), usize::try_from)
            .unwrap_or(usize::MAX);
        Ok(Mode::sampled(seed, runs))
    }
}

fn env_number(variable: &'static str) -> Result<Option<u64>, ExploreError> {
    match std::env::var(variable) {
        Ok(value) if !value.trim().is_empty() => value
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| ExploreError::BadEnv { variable, value }),
        _ => Ok(None),
    }
}

/// The body of a store crate's explorer test: a seeded sample ([`Mode::from_env`], with
/// `default_runs` unless `IDEM_EXPLORE_RUNS` says otherwise) over every scenario, its
/// report printed, and a panic with the whole report (seed, faults, what broke) when a
/// promise broke.
///
/// ```no_run
/// use std::convert::Infallible;
/// use idem_core::MemoryStore;
/// use idem_testkit::explore::{Target, assert_sample_passes};
///
/// // tests/explore.rs of a store crate; a server-backed store uses Target::real_time.
/// #[test]
/// fn sampled_faults_break_nothing() {
///     assert_sample_passes(
///         Target::virtual_time("memory", |clock| async move {
///             Ok::<_, Infallible>(MemoryStore::with_clock(clock))
///         }),
///         48,
///     );
/// }
/// # fn main() {}
/// ```
///
/// # Panics
/// When `IDEM_EXPLORE_SEED` or `IDEM_EXPLORE_RUNS` is not a number, when the exploration
/// cannot run (the store cannot be made), and when it found a violation.
pub fn assert_sample_passes(target: Target, default_runs: usize) -> Report {
    let mode =
        Mode::from_env(default_runs).expect("IDEM_EXPLORE_SEED and IDEM_EXPLORE_RUNS are numbers");
    let report = Explorer::new(target)
        .mode(mode)
        .run()
        .expect("the exploration runs");
    println!("{mode:?}\n{report}");
    assert!(report.passed(), "{mode:?}\n{report}");
    report
}

/// Explores a target's fault points; see the [module docs](self).
#[derive(Clone, Debug)]
#[must_use = "call run() to explore"]
pub struct Explorer {
    target: Target,
    timing: Timing,
    scenarios: Vec<Scenario>,
    mode: Mode,
    progress: bool,
}

impl Explorer {
    /// Every scenario in [`Mode::exhaustive`], with the timing that fits the target's
    /// clock ([`Timing::virtual_time`] or [`Timing::real_time`]).
    pub fn new(target: Target) -> Self {
        let timing = if target.is_virtual() {
            Timing::virtual_time()
        } else {
            Timing::real_time()
        };
        Self {
            target,
            timing,
            scenarios: Scenario::all(),
            mode: Mode::exhaustive(),
            progress: false,
        }
    }

    /// The driver's timing and the faults' lengths.
    pub fn timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// The scenarios to explore (default: [`Scenario::all`]).
    pub fn scenarios(mut self, scenarios: impl IntoIterator<Item = Scenario>) -> Self {
        self.scenarios = scenarios.into_iter().collect();
        self
    }

    /// Which runs to make (default: [`Mode::exhaustive`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Prints each scenario's summary line to stderr as it finishes (for long runs).
    pub fn progress(mut self, progress: bool) -> Self {
        self.progress = progress;
        self
    }

    /// Explores, on a thread of its own (with runtimes of its own), so it may be called
    /// from anywhere; it blocks the caller until done.
    ///
    /// # Errors
    /// [`ExploreError`] when the exploration cannot run; what it found, violations
    /// included, is in the [`Report`].
    pub fn run(&self) -> Result<Report, ExploreError> {
        let explorer = self.clone();
        std::thread::Builder::new()
            .name("idem-explore".into())
            .spawn(move || explorer.run_here())
            .map_err(ExploreError::Runtime)?
            .join()
            .map_err(|panic| ExploreError::Panicked(panic_text(panic.as_ref())))?
    }

    /// Makes one run of `scenario` with exactly `faults` (a violation's, to look at it
    /// again), on a thread of its own as [`Explorer::run`] does.
    ///
    /// ```
    /// use idem_core::{MemoryStore, store::Operation};
    /// use idem_testkit::explore::{Explorer, Fault, FaultPoint, PlacedFault, Process, Scenario, Site, Target};
    ///
    /// let target = Target::virtual_time("memory", |clock| async move {
    ///     Ok::<_, std::convert::Infallible>(MemoryStore::with_clock(clock))
    /// });
    /// let crash = PlacedFault {
    ///     point: FaultPoint {
    ///         process: Process::First,
    ///         site: Site::Point { name: "after-effect".into(), occurrence: 0 },
    ///     },
    ///     fault: Fault::CrashAtPoint,
    /// };
    /// let run = Explorer::new(target).run_plan(Scenario::Plain, vec![crash])?;
    /// // The work's effect happened before the crash, and again in the takeover: allowed.
    /// assert_eq!(run.at_least_once.len(), 1, "{run}");
    /// # Ok::<(), idem_testkit::explore::ExploreError>(())
    /// ```
    ///
    /// # Errors
    /// As [`Explorer::run`].
    pub fn run_plan(
        &self,
        scenario: Scenario,
        faults: Vec<PlacedFault>,
    ) -> Result<RunReport, ExploreError> {
        let explorer = self.clone();
        let plan = faults.clone();
        let outcome = std::thread::Builder::new()
            .name("idem-explore".into())
            .spawn(move || explorer.with_runner(|runner| runner.run(scenario, plan)))
            .map_err(ExploreError::Runtime)?
            .join()
            .map_err(|panic| ExploreError::Panicked(panic_text(panic.as_ref())))??;
        let scenario = scenario.name();
        Ok(RunReport {
            violations: outcome
                .verdict
                .broken
                .iter()
                .map(|broken| Violation {
                    scenario: scenario.clone(),
                    faults: faults.clone(),
                    broken: broken.clone(),
                    story: outcome.story.clone(),
                })
                .collect(),
            scenario,
            faults,
            at_least_once: outcome.verdict.at_least_once,
            story: outcome.story,
            trace: outcome.trace,
        })
    }

    fn run_here(&self) -> Result<Report, ExploreError> {
        self.with_runner(|runner| self.explore(runner))
    }

    fn with_runner<T>(
        &self,
        go: impl FnOnce(&mut dyn Runner) -> Result<T, ExploreError>,
    ) -> Result<T, ExploreError> {
        let skew = self.timing.skew;
        if !skew.is_zero() && !matches!(self.target.time, Time::PerProcess(_)) {
            return Err(ExploreError::Skew {
                skew,
                why: "the target's processes share one store on one clock; use \
                      Target::per_process_clocks",
            });
        }
        if skew >= self.timing.lease * 10 {
            return Err(ExploreError::Skew {
                skew,
                why: "it is ten leases or more",
            });
        }
        let keys = Keys::new();
        match &self.target.time {
            Time::Virtual(factory) => go(&mut VirtualRunner {
                factory: VirtualStores::One(Arc::clone(factory)),
                target: self.target.name.clone(),
                timing: self.timing,
                keys,
            }),
            Time::PerProcess(shared) => go(&mut VirtualRunner {
                factory: VirtualStores::PerProcess(Arc::clone(shared)),
                target: self.target.name.clone(),
                timing: self.timing,
                keys,
            }),
            Time::Real(factory) => {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(ExploreError::Runtime)?;
                let store = runtime
                    .block_on(factory())
                    .map_err(|source| ExploreError::Store {
                        target: self.target.name.clone(),
                        source,
                    })?;
                go(&mut RealRunner {
                    runtime,
                    store,
                    timing: self.timing,
                    keys,
                })
            }
        }
    }

    fn explore(&self, runner: &mut dyn Runner) -> Result<Report, ExploreError> {
        let mut report = Report {
            target: self.target.name.clone(),
            scenarios: Vec::new(),
        };
        match self.mode {
            Mode::Exhaustive { pairs, seed } => {
                let mut rng = Rng::new(seed);
                for &scenario in &self.scenarios {
                    let (mut found, points) = clean_run(runner, scenario)?;
                    let mut singles = Vec::new();
                    for point in &points {
                        for &fault in Fault::for_site(&point.site) {
                            let plan = vec![PlacedFault {
                                point: point.clone(),
                                fault,
                            }];
                            let outcome = runner.run(scenario, plan.clone())?;
                            record(&mut found, &outcome, &plan);
                            singles.push((plan, outcome.trace));
                        }
                    }
                    for _ in 0..pairs {
                        let Some(plan) = pair(&mut rng, &singles) else {
                            break;
                        };
                        let outcome = runner.run(scenario, plan.clone())?;
                        record(&mut found, &outcome, &plan);
                    }
                    self.finish(&mut report, found);
                }
            }
            Mode::Sampled { runs, seed } => {
                let mut rng = Rng::new(seed);
                let mut scenarios = Vec::new();
                for &scenario in &self.scenarios {
                    scenarios.push((scenario, clean_run(runner, scenario)?));
                }
                let mut made = 0;
                let mut turn = 0;
                while made < runs && scenarios.iter().any(|(_, (_, points))| !points.is_empty()) {
                    let count = scenarios.len();
                    let (scenario, (found, points)) = &mut scenarios[turn % count];
                    turn += 1;
                    let Some(point) = rng.pick(points).cloned() else {
                        continue;
                    };
                    let fault = rng
                        .pick(Fault::for_site(&point.site))
                        .copied()
                        .unwrap_or(Fault::ErrorBefore);
                    let plan = vec![PlacedFault { point, fault }];
                    let outcome = runner.run(*scenario, plan.clone())?;
                    record(found, &outcome, &plan);
                    made += 1;
                    if made < runs && rng.below(2) == 1 {
                        let singles = [(plan, outcome.trace)];
                        if let Some(plan) = pair(&mut rng, &singles) {
                            let outcome = runner.run(*scenario, plan.clone())?;
                            record(found, &outcome, &plan);
                            made += 1;
                        }
                    }
                }
                for (_, (found, _)) in scenarios {
                    self.finish(&mut report, found);
                }
            }
        }
        Ok(report)
    }

    fn finish(&self, report: &mut Report, found: ScenarioReport) {
        if self.progress {
            let single = Report {
                target: report.target.clone(),
                scenarios: vec![found.clone()],
            };
            if let Some(line) = single.summary().lines().next() {
                eprintln!("{line}");
            }
        }
        report.scenarios.push(found);
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

/// One run, in full: what [`Explorer::run_plan`] answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunReport {
    /// The scenario.
    pub scenario: String,
    /// The run's faults.
    pub faults: Vec<PlacedFault>,
    /// Every fault point the run reached, in order (the final check's left out).
    pub trace: Vec<FaultPoint>,
    /// Each effect that happened again as the contract allows, and why.
    pub at_least_once: Vec<String>,
    /// What broke.
    pub violations: Vec<Violation>,
    /// How each process's `execute` ended.
    pub story: String,
}

impl fmt::Display for RunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "[{}] {}", self.scenario, self.story)?;
        for fault in &self.faults {
            writeln!(f, "  fault: {fault}")?;
        }
        for again in &self.at_least_once {
            writeln!(f, "  at-least-once by contract: {again}")?;
        }
        for violation in &self.violations {
            writeln!(f, "  broke: {}", violation.broken)?;
        }
        let trace: Vec<String> = self.trace.iter().map(ToString::to_string).collect();
        write!(f, "  trace: {}", trace.join(", "))
    }
}

/// The fault-free run of `scenario`, which finds its fault points.
fn clean_run(
    runner: &mut dyn Runner,
    scenario: Scenario,
) -> Result<(ScenarioReport, Vec<FaultPoint>), ExploreError> {
    let outcome = runner.run(scenario, Vec::new())?;
    let mut found = ScenarioReport {
        scenario: scenario.name(),
        fault_points: outcome.trace.len(),
        ..ScenarioReport::default()
    };
    record(&mut found, &outcome, &[]);
    Ok((found, outcome.trace))
}

fn record(found: &mut ScenarioReport, outcome: &RunOutcome, plan: &[PlacedFault]) {
    found.runs += 1;
    if !outcome.verdict.at_least_once.is_empty() {
        found.at_least_once += 1;
    }
    for broken in &outcome.verdict.broken {
        found.violations.push(Violation {
            scenario: found.scenario.clone(),
            faults: plan.to_vec(),
            broken: broken.clone(),
            story: outcome.story.clone(),
        });
    }
}

/// Two faults: a single fault's plan, and one more at a point its run reached.
fn pair(
    rng: &mut Rng,
    singles: &[(Vec<PlacedFault>, Vec<FaultPoint>)],
) -> Option<Vec<PlacedFault>> {
    let (plan, trace) = rng.pick(singles)?;
    let first = plan.first()?;
    let others: Vec<&FaultPoint> = trace
        .iter()
        .filter(|point| !point.same_place(&first.point))
        .collect();
    let point = (*rng.pick(&others)?).clone();
    let fault = *rng.pick(Fault::for_site(&point.site))?;
    Some(vec![first.clone(), PlacedFault { point, fault }])
}
