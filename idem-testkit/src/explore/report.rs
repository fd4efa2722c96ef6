//! What an exploration found: per scenario, the runs, the fault points, the runs that
//! were at-least-once by contract, and every violation with the faults that caused it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::faults::{PlacedFault, Process};

/// A broken promise, found after one run.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Broken {
    /// A step's or the work's effect happened again, and the contract does not allow it.
    Repeated {
        /// Which effect (`step \`debit\``, `the work's effect`).
        effect: String,
        /// The process that had it first.
        first: Process,
        /// The process that had it again.
        again: Process,
        /// Why the contract does not allow it here.
        why: String,
    },
    /// An undo ran twice: undos run at most once.
    UndoRepeated {
        /// The step undone.
        step: String,
        /// The process that ran it first.
        first: Process,
        /// The process that ran it again.
        again: Process,
    },
    /// A step that registered an undo is not in exactly one of the final compensation's
    /// `undone`, `failed`, `pending` and `interrupted` (or one is listed that never
    /// registered).
    CompensationIncomplete {
        /// The step.
        step: String,
        /// Where the compensation lists it (empty: missing).
        listed: Vec<&'static str>,
    },
    /// The compensation says an undo ran (`undone`) or never ran (`pending`), and the
    /// ledger says otherwise.
    CompensationUntrue {
        /// The step.
        step: String,
        /// Where the compensation lists it.
        listed: &'static str,
        /// How many times its undo's effect took place.
        ran: usize,
    },
    /// The compensation is not the one the scenario documents: its fault-free run must
    /// end with exactly that one (every step undone, for a plain saga), and some steps
    /// must be listed so whatever the faults (an undo answering `Unknown`: interrupted).
    CompensationUnexpected {
        /// What the scenario documents.
        expected: String,
        /// What the compensation said.
        got: String,
    },
    /// A step is listed in a place its undo's behaviour and the marks the store holds do
    /// not explain: for example `interrupted` although no undo of it ever started, or
    /// `pending` although nothing stopped the compensation before it.
    CompensationMisplaced {
        /// The step.
        step: String,
        /// Where the compensation lists it.
        listed: &'static str,
        /// Where it may be, given its undo and the marks that landed.
        expected: Vec<&'static str>,
    },
    /// The store answered a renewal with a lease that ends no later than the one it was
    /// asked to renew: heartbeats keep nothing alive.
    LeaseNotExtended {
        /// The process whose renewal it was.
        process: Process,
        /// The end of the lease it asked to renew (Unix milliseconds).
        held_until: u64,
        /// The end the store answered (Unix milliseconds).
        renewed_until: u64,
    },
    /// Two callers got different results.
    ResultsDiffer {
        /// The first caller with a result, and that result.
        first: (Process, String),
        /// A caller with another.
        other: (Process, String),
    },
    /// A result a caller saw was not replayed to the retry after it.
    ResultLost {
        /// The result seen first.
        seen: String,
        /// What the later retry got.
        then: String,
    },
    /// The run ended with the wrong kind of result for its scenario.
    UnexpectedResult {
        /// The kind the scenario must end with.
        expected: &'static str,
        /// What it ended with.
        got: String,
    },
    /// No caller got a result within the bounded retries.
    NoResult {
        /// The retries made.
        retries: u32,
    },
    /// Once every process had ended, tasks other than a crashed process's were still
    /// running: a compensation, a write or a heartbeat the driver spawned never stops (only
    /// under virtual time, where the explorer counts a run's tasks).
    Lingered {
        /// How many tasks.
        tasks: usize,
        /// How long the explorer waited for them.
        after: Duration,
    },
    /// A caller got an answer no correct driver gives here.
    UnexpectedAnswer {
        /// The caller.
        process: Process,
        /// The answer.
        answer: String,
    },
    /// The store granted a later owner a fencing token not above an earlier owner's.
    TokenNotGreater {
        /// The earlier owner.
        first: Process,
        /// The later owner.
        again: Process,
        /// The earlier owner's token.
        token: u64,
        /// The later owner's.
        then: u64,
    },
    /// The store granted or extended a lease for an `execute` that had released the key,
    /// or took the key over for one that had already ended: a delayed or duplicated
    /// claim or renewal holding the key for nobody, so every retry waits a lease.
    LateGrant {
        /// The process whose call landed late.
        process: Process,
        /// `"claim"` or `"renewal"`.
        call: &'static str,
        /// What it landed after.
        after: &'static str,
    },
    /// The work's context said `resumed` wrongly: it must be true exactly when the store
    /// granted its token as a takeover (`Claimed { resumed: true }`).
    Resumed {
        /// The process.
        process: Process,
        /// Its fencing token.
        token: u64,
        /// What `ctx.resumed()` said.
        resumed: bool,
    },
    /// `execute` returned later than its bound ([`execute_bound`](super::execute_bound)).
    TooSlow {
        /// The caller.
        process: Process,
        /// How long it took.
        took: Duration,
        /// Its bound.
        bound: Duration,
    },
    /// `execute` never returned (the explorer dropped it after this long).
    DidNotReturn {
        /// The caller.
        process: Process,
        /// How long the explorer waited.
        waited: Duration,
    },
    /// An `execute` task panicked.
    Panicked {
        /// The caller.
        process: Process,
        /// The panic's message.
        message: String,
    },
    /// The driver could not be built with the run's settings.
    Setup {
        /// The caller.
        process: Process,
        /// The driver's error.
        error: String,
    },
}

impl Broken {
    /// A short name for the kind of violation, for grouping.
    pub fn kind(&self) -> &'static str {
        match self {
            Broken::Repeated { .. } => "effect repeated",
            Broken::UndoRepeated { .. } => "undo repeated",
            Broken::CompensationIncomplete { .. } => "compensation incomplete",
            Broken::CompensationUntrue { .. } => "compensation untrue",
            Broken::CompensationUnexpected { .. } => "compensation unexpected",
            Broken::CompensationMisplaced { .. } => "compensation misplaced",
            Broken::LeaseNotExtended { .. } => "lease not extended",
            Broken::ResultsDiffer { .. } => "results differ",
            Broken::ResultLost { .. } => "result lost",
            Broken::UnexpectedResult { .. } => "unexpected result",
            Broken::NoResult { .. } => "no result",
            Broken::Lingered { .. } => "task lingers",
            Broken::UnexpectedAnswer { .. } => "unexpected answer",
            Broken::TokenNotGreater { .. } => "token not greater",
            Broken::LateGrant { .. } => "late grant",
            Broken::Resumed { .. } => "resumed wrong",
            Broken::TooSlow { .. } => "over the bound",
            Broken::DidNotReturn { .. } => "never returned",
            Broken::Panicked { .. } => "panicked",
            Broken::Setup { .. } => "setup",
        }
    }
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Broken::Repeated {
                effect,
                first,
                again,
                why,
            } => write!(f, "{effect} ran in {first}, then again in {again}: {why}"),
            Broken::UndoRepeated { step, first, again } => write!(
                f,
                "the undo of `{step}` ran in {first}, then again in {again}: undos run at most once"
            ),
            Broken::CompensationIncomplete { step, listed } if listed.is_empty() => write!(
                f,
                "step `{step}` registered an undo, and the compensation lists it nowhere"
            ),
            Broken::CompensationIncomplete { step, listed } => write!(
                f,
                "the compensation lists step `{step}` under {}, where it must be under exactly one of undone, failed, pending, interrupted (and only if it registered an undo)",
                listed.join(" and ")
            ),
            Broken::CompensationUntrue { step, listed, ran } => write!(
                f,
                "the compensation lists `{step}` as {listed}, but its undo ran {ran} times"
            ),
            Broken::CompensationUnexpected { expected, got } => {
                write!(f, "the compensation must be {expected}, it is {got}")
            }
            Broken::CompensationMisplaced {
                step,
                listed,
                expected,
            } => write!(
                f,
                "the compensation lists `{step}` as {listed}; its undo and the marks the store holds allow only {}",
                expected.join(" or ")
            ),
            Broken::LeaseNotExtended {
                process,
                held_until,
                renewed_until,
            } => write!(
                f,
                "{process} renewed a lease ending at {held_until} ms and the store answered one ending at {renewed_until} ms: a renewal must extend it"
            ),
            Broken::ResultsDiffer { first, other } => write!(
                f,
                "{} got {}, {} got {}",
                first.0, first.1, other.0, other.1
            ),
            Broken::ResultLost { seen, then } => {
                write!(f, "a caller saw {seen}, the retry after got {then}")
            }
            Broken::UnexpectedResult { expected, got } => {
                write!(f, "the scenario must end {expected}, it ended {got}")
            }
            Broken::NoResult { retries } => {
                write!(f, "no caller got a result, after {retries} retries")
            }
            Broken::Lingered { tasks, after } => write!(
                f,
                "{tasks} task(s) the processes left behind still ran {} ms after every process had ended",
                after.as_millis()
            ),
            Broken::UnexpectedAnswer { process, answer } => {
                write!(
                    f,
                    "{process} got an answer no correct driver gives here: {answer}"
                )
            }
            Broken::LateGrant {
                process,
                call,
                after,
            } => write!(
                f,
                "a {call} of {process} landed after {after} and the store granted it: the key \
                 is held for nobody"
            ),
            Broken::TokenNotGreater {
                first,
                again,
                token,
                then,
            } => write!(
                f,
                "{first} held token {token}, then the store granted {again} token {then}: tokens must grow"
            ),
            Broken::Resumed {
                process,
                token,
                resumed,
            } => write!(
                f,
                "{process} holds token {token} and ctx.resumed() is {resumed}: the store's grant of \
                 that token says {}",
                !resumed
            ),
            Broken::TooSlow {
                process,
                took,
                bound,
            } => write!(
                f,
                "{process}'s execute took {took:?}, over its bound of {bound:?}"
            ),
            Broken::DidNotReturn { process, waited } => {
                write!(f, "{process}'s execute had not returned after {waited:?}")
            }
            Broken::Panicked { process, message } => {
                write!(f, "{process}'s execute panicked: {message}")
            }
            Broken::Setup { process, error } => {
                write!(f, "{process}'s driver could not be built: {error}")
            }
        }
    }
}

/// One violation: the scenario, the faults of its run, what broke, and how each caller
/// of the run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The scenario.
    pub scenario: String,
    /// The faults of the run (none: the fault-free run).
    pub faults: Vec<PlacedFault>,
    /// What broke.
    pub broken: Broken,
    /// How each process's `execute` ended, in order.
    pub story: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let faults = if self.faults.is_empty() {
            "no fault".to_owned()
        } else {
            self.faults
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" + ")
        };
        write!(
            f,
            "[{}] {faults}\n    broke: {}\n    ends: {}",
            self.scenario, self.broken, self.story
        )
    }
}

/// What the runs of one scenario found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScenarioReport {
    /// The scenario.
    pub scenario: String,
    /// Runs made (the fault-free one included).
    pub runs: usize,
    /// Fault points the fault-free run reached: the points
    /// [`Mode::Exhaustive`](super::Mode::Exhaustive) faults one by one (not those of a
    /// takeover only a fault opens).
    pub fault_points: usize,
    /// Runs where an effect happened more than once as the contract allows (a crash, or
    /// a drop mid-work before the step's checkpoint was sent, after the effect and before
    /// its checkpoint or result was stored), classified so, never silently.
    pub at_least_once: usize,
    /// Every violation found.
    pub violations: Vec<Violation>,
}

/// What an exploration found: one [`ScenarioReport`] per scenario.
///
/// Its `Display` is one summary line per scenario and one for the totals, then every
/// violation (the first 20 of each scenario), each with its faults, what broke and how
/// each caller ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The store explored (`memory`, `postgres` ...).
    pub target: String,
    /// The scenarios, in the order they ran.
    pub scenarios: Vec<ScenarioReport>,
}

impl Report {
    /// Runs made.
    pub fn runs(&self) -> usize {
        self.scenarios.iter().map(|s| s.runs).sum()
    }

    /// Fault points of the fault-free runs.
    pub fn fault_points(&self) -> usize {
        self.scenarios.iter().map(|s| s.fault_points).sum()
    }

    /// Runs classified at-least-once by contract.
    pub fn at_least_once(&self) -> usize {
        self.scenarios.iter().map(|s| s.at_least_once).sum()
    }

    /// Every violation.
    pub fn violations(&self) -> impl Iterator<Item = &Violation> {
        self.scenarios.iter().flat_map(|s| s.violations.iter())
    }

    /// True when no run broke anything.
    pub fn passed(&self) -> bool {
        self.violations().next().is_none()
    }

    /// Violations counted by [`Broken::kind`].
    pub fn by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut kinds = BTreeMap::new();
        for violation in self.violations() {
            *kinds.entry(violation.broken.kind()).or_default() += 1;
        }
        kinds
    }

    /// One line per scenario, then the totals.
    pub fn summary(&self) -> String {
        let mut text = String::new();
        for s in &self.scenarios {
            text.push_str(&format!(
                "explore {}: {}: {} runs, {} fault points, {} violations, {} at-least-once by contract\n",
                self.target,
                s.scenario,
                s.runs,
                s.fault_points,
                s.violations.len(),
                s.at_least_once
            ));
        }
        text.push_str(&format!(
            "explore {}: {} runs, {} fault points, {} violations, {} at-least-once by contract",
            self.target,
            self.runs(),
            self.fault_points(),
            self.violations().count(),
            self.at_least_once()
        ));
        let kinds = self.by_kind();
        if !kinds.is_empty() {
            let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
            text.push_str(&format!(" ({})", kinds.join(", ")));
        }
        text
    }
}

/// How many violations of one scenario `Display` prints.
const SHOWN: usize = 20;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.summary())?;
        for s in &self.scenarios {
            for violation in s.violations.iter().take(SHOWN) {
                writeln!(f, "  {violation}")?;
            }
            if s.violations.len() > SHOWN {
                writeln!(
                    f,
                    "  [{}] ... and {} more",
                    s.scenario,
                    s.violations.len() - SHOWN
                )?;
            }
        }
        Ok(())
    }
}
