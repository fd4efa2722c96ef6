//! The linearizability checker: many clients call one store at once, and every answer
//! must be explained by the state machine ([`idem_core::machine`]) applied one call at a
//! time, in an order that respects real time.
//!
//! The conformance suite races one winner at a time and the model-based run is
//! sequential; this checks whole concurrent histories, as Jepsen's Knossos and Porcupine
//! do. It finds what a store does wrong only when calls overlap: a claim read and
//! written in two steps, a completion that checks the fence and then writes whatever is
//! there, a renewal that lands after a takeover.
//!
//! - [`Workload`] says how many clients call how often on how many keys; [`record`]
//!   runs it and returns the [`History`]: every call with its invocation and return
//!   times, and its answer, or that the answer was lost (an error, a timeout, a cut
//!   connection), in which case the call may have taken effect or not.
//! - [`check`] searches each key's history for such an order (a Wing–Gong search with
//!   memoisation, the machine as its model, see the checker's notes on time below) and
//!   returns what it looked at, or the smallest part of a history it cannot explain.
//! - [`run`] does both; [`run_on`] spreads the clients over several stores on one
//!   database; [`assert_linearizable`] is a store's test in one call.
//!
//! # Time
//!
//! The machine's answers depend on the store's clock when a call takes effect. The
//! checker lets that be any millisecond between the call's invocation and its return,
//! widened by [`TOLERANCE`] on each side: the store's clock must be the one the test
//! process reads (a server on the same machine, or the process clock). The moments
//! follow the order the checker places the calls in (less [`TOLERANCE`]), as on a clock
//! that only moves forward: a store that reads its clock before the write takes effect
//! (in the client, or before waiting for a lock) may be seen to go back in time, and
//! its check takes [`Checker::moments_in_any_order`]. Either way, the time a store
//! writes must be read before the write takes effect: a call whose answer was lost
//! takes effect no later than the return (plus [`TOLERANCE`]) of each answered call
//! placed after it. A store that waits
//! a margin past a lease's end before a takeover (DynamoDB's `skew_margin`) must run with
//! the margin at zero here.
//!
//! A store may delete absent records whenever it likes (a purge, a TTL): the checker
//! allows it.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use idem_core::MemoryStore;
//! use idem_testkit::linearizability::{self, Workload};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let store = Arc::new(MemoryStore::new());
//! let checked = linearizability::run(store, &Workload::default().operations(300))
//!     .await
//!     .expect("every answer is explained");
//! assert_eq!(checked.operations, 300);
//! # });
//! ```

mod checker;
mod history;
mod workload;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Key, Record, Store, Timestamp};

pub use checker::{LOST_GRACE, TOLERANCE};
pub use history::{Answer, Call, History, Operation};
pub use workload::{Workload, record, record_on};

use checker::{Limits, Search, end_states, search};
use history::Names;

/// The most states one key's search visits before it gives up (and fails: a check that
/// cannot decide has not passed). A budget of 0 fails every key with an answered operation.
pub const DEFAULT_BUDGET: u64 = 2_000_000;

/// The most answers a check allows to be lost, in percent of the operations, by default.
pub const DEFAULT_MAX_LOST_PERCENT: u8 = 25;

/// The most starting points tried for a counterexample, and the states each search for
/// it may visit.
const SHRINK_SEARCHES: usize = 50;
const SHRINK_BUDGET: u64 = 200_000;

/// What a check looked at, when every answer was explained.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Checked {
    /// Keys checked.
    pub keys: usize,
    /// Operations checked.
    pub operations: usize,
    /// Of those, the ones whose answer was lost.
    pub lost: usize,
    /// States the searches visited, in all.
    pub states: u64,
    /// The most states one key's search visited.
    pub longest_search: u64,
}

/// A part of a history no order explains: the operations on one key, made as small as
/// the checker could while it stays unexplained.
#[derive(Clone, Debug)]
pub struct Counterexample {
    /// The key.
    pub key: Key,
    /// How many of the key's operations come before these (all returned before the first
    /// of these was invoked).
    pub after: usize,
    /// The records those earlier operations can leave (`None`: no record), from any of
    /// which these operations are unexplained.
    pub starting_states: Vec<Option<Record>>,
    /// The operations, in invocation order; an answer that came back after the cut counts
    /// as lost.
    pub operations: Vec<Operation>,
    /// How many operations the key had in the history.
    pub of: usize,
    /// The workload's seed, when the history came from [`run`].
    pub seed: Option<u64>,
    /// Names for the key's attempts and fingerprints, from its whole history.
    names: Names,
}

impl fmt::Display for Counterexample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = &self.names;
        writeln!(
            f,
            "no order of these {} operation(s) on key {}/{} (of {} on it), consistent with real time, is explained by the state machine",
            self.operations.len(),
            self.key.scope(),
            self.key.key(),
            self.of
        )?;
        if self.after > 0 {
            let first = match self.starting_states.first() {
                Some(Some(record)) => names.record(record),
                _ => "no record".to_owned(),
            };
            writeln!(
                f,
                "after the {} before them, which leave one of {} records (the first: {first}):",
                self.after,
                self.starting_states.len()
            )?;
        }
        for operation in &self.operations {
            writeln!(f, "  {}", names.operation(operation))?;
        }
        if let Some(seed) = self.seed {
            write!(f, "(workload seed {seed})")?;
        }
        Ok(())
    }
}

/// Why a check did not pass.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// Some answers are explained by no order of the calls: the store is not
    /// linearizable against the state machine.
    #[error("{0}")]
    Unexplained(Box<Counterexample>),
    /// A key's search visited its whole budget without deciding: check fewer operations
    /// per key (more keys, fewer calls) or raise the budget.
    #[error(
        "the search on key {scope}/{key} visited {states} states without deciding; check fewer operations per key or raise the budget"
    )]
    TooLong {
        /// The key's scope.
        scope: String,
        /// The key.
        key: String,
        /// States visited.
        states: u64,
    },
    /// More answers were lost than the checker's limit allows (see
    /// [`Checker::max_lost`]): a call whose answer was lost may have landed or not, so a
    /// history made mostly of them explains almost anything, and passing it would say
    /// nothing. The errors are in the history's [`Answer::Lost`] answers.
    #[error(
        "{lost} of {operations} answers were lost (errors, timeouts, cut connections), more than the {limit_percent}% a check allows: find why the store failed those calls, or raise the limit"
    )]
    TooManyLost {
        /// Answers lost.
        lost: usize,
        /// Operations in the history.
        operations: usize,
        /// The limit, in percent of the operations.
        limit_percent: u8,
    },
}

/// Checks `history` with the default [`Checker`].
///
/// # Errors
/// [`CheckError::Unexplained`] with the smallest unexplained part the checker found,
/// [`CheckError::TooLong`], or [`CheckError::TooManyLost`].
///
/// ```
/// use idem_testkit::linearizability::{History, check};
///
/// let nothing = check(&History::default()).unwrap();
/// assert_eq!(nothing.operations, 0);
/// ```
pub fn check(history: &History) -> Result<Checked, CheckError> {
    Checker::default().check(history)
}

/// A checker with its bounds: how many states a key's search may visit, and how long a
/// call whose answer was lost may still take effect after its client gave up.
///
/// ```
/// use std::time::Duration;
/// use idem_testkit::linearizability::{Checker, History};
///
/// // Through a proxy that holds a request at most 250 ms, a lost call lands within
/// // 300 ms of its client giving up, or never.
/// let checker = Checker::default()
///     .budget(5_000_000)
///     .lost_grace(Duration::from_millis(300));
/// assert!(checker.check(&History::default()).is_ok());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Checker {
    limits: Limits,
    max_lost_percent: u8,
}

impl Default for Checker {
    fn default() -> Self {
        Self {
            limits: Limits {
                budget: DEFAULT_BUDGET,
                lost_grace: LOST_GRACE,
                ordered_moments: true,
                first_round: checker::FIRST_ROUND,
            },
            max_lost_percent: DEFAULT_MAX_LOST_PERCENT,
        }
    }
}

impl Checker {
    /// The most states one key's search visits ([`DEFAULT_BUDGET`] by default).
    pub fn budget(mut self, states: u64) -> Self {
        self.limits.budget = states;
        self
    }

    /// How long after its client gave up a lost call may still take effect
    /// ([`LOST_GRACE`] by default). Shorter is a faster search; it must cover how long
    /// the network between client and server can hold a request.
    pub fn lost_grace(mut self, grace: Duration) -> Self {
        self.limits.lost_grace = grace;
        self
    }

    /// For a store that reads its clock before its write takes effect: in the client,
    /// before the request reaches the server (DynamoDB, whose conditions compare with a
    /// `now` the client sends), or when a statement starts, before it waits for a row
    /// lock (PostgreSQL's `now()`, which an `ON CONFLICT` update compares again after the
    /// wait). Two calls may then take effect in one order with clocks read in the other,
    /// so the moments the checker tries need not follow the order it places the calls
    /// in; each still lies in its own call's window. Such a store's fences rest on
    /// tokens, and its skew margin covers the rest. An answered call may be answered from
    /// a read and a clock read after it (DynamoDB's `get`); a write's time is still read
    /// before the write, so a call whose answer was lost takes effect no later than the
    /// return (plus [`TOLERANCE`]) of each answered call placed after it, as in the
    /// default mode.
    ///
    /// ```
    /// use idem_testkit::linearizability::{Checker, History};
    ///
    /// let checker = Checker::default().moments_in_any_order();
    /// assert!(checker.check(&History::default()).is_ok());
    /// ```
    pub fn moments_in_any_order(mut self) -> Self {
        self.limits.ordered_moments = false;
        self
    }

    /// The most answers that may be lost, in percent of the history's operations
    /// ([`DEFAULT_MAX_LOST_PERCENT`] by default; at most 100). Above it the check fails
    /// with [`CheckError::TooManyLost`].
    ///
    /// ```
    /// use idem_testkit::linearizability::Checker;
    ///
    /// // Through heavy faults, up to half the answers may be lost.
    /// let checker = Checker::default().max_lost(50);
    /// # let _ = checker;
    /// ```
    pub fn max_lost(mut self, percent: u8) -> Self {
        self.max_lost_percent = percent.min(100);
        self
    }

    /// Checks `history`.
    ///
    /// # Errors
    /// As [`check`].
    pub fn check(&self, history: &History) -> Result<Checked, CheckError> {
        let (lost, operations) = (history.lost(), history.operations.len());
        if lost * 100 > operations * usize::from(self.max_lost_percent) {
            return Err(CheckError::TooManyLost {
                lost,
                operations,
                limit_percent: self.max_lost_percent,
            });
        }
        check_within(history, self.limits)
    }
}

fn check_within(history: &History, limits: Limits) -> Result<Checked, CheckError> {
    let mut checked = Checked {
        lost: history.lost(),
        ..Checked::default()
    };
    for (key, operations) in history.by_key() {
        checked.keys += 1;
        checked.operations += operations.len();
        match search(&operations, &[None], limits) {
            Search::Explained { states } => {
                checked.states += states;
                checked.longest_search = checked.longest_search.max(states);
            }
            Search::TooLong { states } => {
                return Err(CheckError::TooLong {
                    scope: key.scope().to_owned(),
                    key: key.key().to_owned(),
                    states,
                });
            }
            Search::Unexplained => {
                let (after, starting_states, smallest) = witness(&operations, limits);
                let start = smallest.first().map_or_else(Timestamp::now, |o| o.invoked);
                return Err(CheckError::Unexplained(Box::new(Counterexample {
                    names: Names::of(&operations).from(start),
                    key,
                    after,
                    starting_states,
                    operations: smallest,
                    of: operations.len(),
                    seed: None,
                })));
            }
        }
    }
    Ok(checked)
}

/// Records `workload` against `store` (see [`record`]) and checks the history.
///
/// # Errors
/// As [`check`]; a counterexample carries the workload's seed.
pub async fn run(store: Arc<dyn Store>, workload: &Workload) -> Result<Checked, CheckError> {
    run_on(&[store], workload).await
}

/// Records `workload` against several stores over one database (see [`record_on`]) and
/// checks the history.
///
/// ```
/// use std::sync::Arc;
/// use idem_core::{MemoryStore, Store};
/// use idem_testkit::linearizability::{self, Workload};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// // Two handles on one in-memory map: the clients alternate between them.
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// let stores = [Arc::clone(&store), store];
/// let checked = linearizability::run_on(&stores, &Workload::default().operations(200))
///     .await
///     .unwrap();
/// assert_eq!(checked.keys, 4);
/// # });
/// ```
///
/// # Errors
/// As [`check`]; a counterexample carries the workload's seed.
pub async fn run_on(stores: &[Arc<dyn Store>], workload: &Workload) -> Result<Checked, CheckError> {
    run_with(stores, workload, Checker::default()).await
}

async fn run_with(
    stores: &[Arc<dyn Store>],
    workload: &Workload,
    checker: Checker,
) -> Result<Checked, CheckError> {
    let history = record_on(stores, workload).await;
    checker.check(&history).map_err(|err| match err {
        CheckError::Unexplained(mut counterexample) => {
            counterexample.seed = Some(workload.seed_value());
            CheckError::Unexplained(counterexample)
        }
        other => other,
    })
}

/// A store's own test in one call: records `workload` against `stores` (see
/// [`record_on`]), checks the history with `checker`, and returns what was checked.
///
/// ```
/// use std::sync::Arc;
/// use idem_core::{MemoryStore, Store};
/// use idem_testkit::linearizability::{Checker, Workload, assert_linearizable};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let stores: [Arc<dyn Store>; 1] = [Arc::new(MemoryStore::new())];
/// let workload = Workload::default().operations(300);
/// let checked = assert_linearizable(&stores, &workload, Checker::default()).await;
/// assert_eq!(checked.operations, 300);
/// # });
/// ```
///
/// # Panics
/// With the counterexample (and the workload's seed) when an answer is unexplained, or
/// the reason the check could not pass; and when an answer was lost: a store's test runs
/// without faults, so every call must answer.
pub async fn assert_linearizable(
    stores: &[Arc<dyn Store>],
    workload: &Workload,
    checker: Checker,
) -> Checked {
    let checked = run_with(stores, workload, checker)
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(
        checked.lost, 0,
        "{} of {} calls answered with an error or not at all",
        checked.lost, checked.operations
    );
    assert_eq!(checked.operations, workload.total_operations());
    checked
}

/// The smallest witness the checker finds in `operations` (one key's, unexplained).
///
/// The history is first cut at the earliest invocation that leaves it unexplained: the
/// operations invoked before it, with the answers that came back after it counted as
/// lost (a cut of a linearizable history is linearizable, so the cut is a witness too).
/// The witness then starts at the latest quiet moment before the cut (every earlier
/// operation had returned) from which the rest is unexplained whatever state the
/// earlier operations left.
fn witness(
    operations: &[Operation],
    limits: Limits,
) -> (usize, Vec<Option<Record>>, Vec<Operation>) {
    let limits = Limits {
        budget: limits.budget.min(SHRINK_BUDGET),
        ..limits
    };
    let unexplained = |operations: &[Operation], starts: &[Option<Record>]| {
        matches!(search(operations, starts, limits), Search::Unexplained)
    };
    let (mut explained, mut failing) = (0, operations.len());
    while explained + 1 < failing {
        let middle = (explained + failing) / 2;
        if unexplained(&cut(operations, middle), &[None]) {
            failing = middle;
        } else {
            explained = middle;
        }
    }
    let cut = cut(operations, failing);
    let mut tries = 0;
    for start in (1..cut.len()).rev() {
        let quiet = cut[..start]
            .iter()
            .all(|o| !o.is_lost() && o.returned_ns < cut[start].invoked_ns);
        if !quiet {
            continue;
        }
        tries += 1;
        if tries > SHRINK_SEARCHES {
            break;
        }
        if let Some(states) = end_states(&cut[..start], limits)
            && unexplained(&cut[start..], &states)
        {
            return (start, states, cut[start..].to_vec());
        }
    }
    (0, vec![None], cut)
}

/// The operations invoked before the `at`-th, with the answers that came back after it
/// counted as lost.
fn cut(operations: &[Operation], at: usize) -> Vec<Operation> {
    let Some(boundary) = operations.get(at).map(|o| o.invoked_ns) else {
        return operations.to_vec();
    };
    operations[..at]
        .iter()
        .map(|operation| {
            let mut operation = operation.clone();
            if operation.returned_ns >= boundary {
                operation.answer = Answer::Lost("its answer came after the cut".into());
            }
            operation
        })
        .collect()
}
