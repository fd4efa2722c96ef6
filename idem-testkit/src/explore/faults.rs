//! Faults, the points where they strike, and the store handle each simulated process
//! calls through: every call of a process is numbered (its fault point), and the plan of
//! a run says which fault, if any, strikes at which.
//!
//! This file names the faults and where they strike; `world` holds what one run shares
//! (the plan, the ledger, each process's counters and cuts, the copies still to land),
//! and `process_store` the store handle that numbers a process's calls and injects them.

mod process_store;
mod world;

use std::fmt;

use idem_core::store::Operation;

// Named only in the faults' docs.
#[cfg(doc)]
use super::Timing;

pub(crate) use process_store::ProcessStore;
pub(crate) use world::{BoxFuture, Kill, KillRequest, World};

/// One simulated process of a run: each has its own store handle and its own
/// `Idempotency` (same settings), over the one store under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Process {
    /// The first caller (`p1`).
    First,
    /// A second caller racing the first, in the scenario with a waiting duplicate (`dup`).
    Duplicate,
    /// The nth retry (from 1) after the first callers ended, each a new process (`r1` ...).
    Retry(u32),
    /// The retry after a result, which must replay it (`check`). Never faulted.
    Check,
    /// A client's retry that arrives while an earlier process is still alive but cut off
    /// (paused or partitioned), once that process's lease has run out by the store's
    /// clock: the owner that comes back finds the key taken over (`racer`).
    Racer,
}

impl Process {
    /// The seed of this process's driver jitter: one per process, fixed across runs.
    pub(crate) fn seed(self) -> u64 {
        match self {
            Process::First => 1,
            Process::Duplicate => 2,
            Process::Check => 3,
            Process::Racer => 4,
            Process::Retry(n) => 100 + u64::from(n),
        }
    }
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Process::First => f.write_str("p1"),
            Process::Duplicate => f.write_str("dup"),
            Process::Retry(n) => write!(f, "r{n}"),
            Process::Check => f.write_str("check"),
            Process::Racer => f.write_str("racer"),
        }
    }
}

/// Where in a process a fault strikes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Site {
    /// The process's store call number `index` (from 0), whichever of its tasks made it
    /// (the execution, a heartbeat, a write the driver spawned).
    Call {
        /// The call's number within the process.
        index: u32,
        /// What the call was in the run that found the point (the same number may be
        /// another call in a run with other faults).
        operation: Operation,
    },
    /// The work reached the await point `name` for the `occurrence`th time (from 0).
    Point {
        /// The point's name, such as `debit:effect-done` or `undo-debit:start`.
        name: String,
        /// How many times the process reached it before.
        occurrence: u32,
    },
}

/// A fault point: a process and a site in it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FaultPoint {
    /// The process.
    pub process: Process,
    /// The site.
    pub site: Site,
}

impl FaultPoint {
    /// True when `other` is the same place: the same process and call number (whatever
    /// operation it was), or the same await point and occurrence.
    pub fn same_place(&self, other: &FaultPoint) -> bool {
        self.process == other.process
            && match (&self.site, &other.site) {
                (Site::Call { index: a, .. }, Site::Call { index: b, .. }) => a == b,
                (a @ Site::Point { .. }, b @ Site::Point { .. }) => a == b,
                _ => false,
            }
    }
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.site {
            Site::Call { index, operation } => {
                write!(f, "{} call #{index} ({operation})", self.process)
            }
            Site::Point { name, occurrence } => {
                write!(f, "{} at `{name}`", self.process)?;
                if *occurrence > 0 {
                    write!(f, " (time {})", occurrence + 1)?;
                }
                Ok(())
            }
        }
    }
}

/// What goes wrong at a fault point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// The call fails (`StoreError::Unavailable`) before it reaches the store.
    ErrorBefore,
    /// The call applies, then its answer is lost (`StoreError::Unavailable`).
    LostAnswer,
    /// The call hangs for [`Timing::hang`], far past the store timeout, then applies
    /// (a request stuck in the network that lands late), whether or not anyone still waits.
    HangThenApply,
    /// The call hangs for [`Timing::hang`], then fails without applying.
    HangNoApply,
    /// The caller goes away: its `execute` future is dropped while this call is pending,
    /// before it applied. The call still applies if the task that made it survives.
    DropBefore,
    /// The call applies, then the caller's `execute` future is dropped.
    DropAfter,
    /// The process crashes at this call, before it applies: the call and every later
    /// call of the process never reach the store, and its futures are dropped.
    CrashBefore,
    /// The call applies, then the process crashes.
    CrashAfter,
    /// The caller's `execute` future is dropped while the work waits at this point.
    DropAtPoint,
    /// The process crashes while the work waits at this point.
    CrashAtPoint,
    /// The work stalls at this point for [`Timing::stall`] (two leases), then goes on:
    /// heartbeats must keep the lease.
    StallAtPoint,
    /// The whole process pauses here for [`Timing::stall`] (a stop-the-world pause, a
    /// suspended VM): its work waits, and every store call any of its tasks starts
    /// meanwhile (heartbeats included) leaves only once it resumes. Its timers run on (a
    /// call waiting out the pause may time out first), as a real process's fire at once
    /// when it resumes; a call already on its way when the pause began lands. A
    /// [`Process::Racer`] retries once the lease has run out; the process then goes on and
    /// must start no new effect under the lease it lost.
    PauseAtPoint,
    /// From this point of the work on, for [`Timing::stall`], every store call of the
    /// process fails before it reaches the store (a network partition of that process
    /// alone), while its work goes on; a [`Process::Racer`] retries once the lease has run
    /// out (as the store last granted or renewed it). The owner must stop by its own clock.
    PartitionAtPoint,
    /// This call and every store call of the process for [`Timing::stall`] fail before
    /// they reach the store; a [`Process::Racer`] retries as for
    /// [`Fault::PartitionAtPoint`].
    PartitionAtCall,
    /// The call applies, and a copy of it (a request delivered twice) applies again once
    /// the process's `execute` has ended: after its release or its result, while whatever
    /// else runs (the duplicate, the racer, a write of the process still in flight) goes
    /// on. The work's own commit (its transaction) is never copied.
    DuplicatedLate,
    /// The call applies, and a copy of it applies again just after the store next grants
    /// the key to another process, before that owner hears of its grant: a stale write
    /// meeting a live owner's record. A copy that meets no such grant lands before the run's
    /// last retry, as do copies sent after their process's `execute` ended.
    DuplicatedAfterTakeover,
}

impl Fault {
    /// Every fault that strikes at a store call.
    pub const AT_CALLS: [Fault; 11] = [
        Fault::ErrorBefore,
        Fault::LostAnswer,
        Fault::HangThenApply,
        Fault::HangNoApply,
        Fault::DropBefore,
        Fault::DropAfter,
        Fault::CrashBefore,
        Fault::CrashAfter,
        Fault::PartitionAtCall,
        Fault::DuplicatedLate,
        Fault::DuplicatedAfterTakeover,
    ];

    /// Every fault that strikes at an await point of the work.
    pub const AT_POINTS: [Fault; 5] = [
        Fault::DropAtPoint,
        Fault::CrashAtPoint,
        Fault::StallAtPoint,
        Fault::PauseAtPoint,
        Fault::PartitionAtPoint,
    ];

    /// True for the faults that cut a live process off (a pause, a partition), after
    /// which a [`Process::Racer`] retries beside it.
    pub fn cuts_off(self) -> bool {
        matches!(
            self,
            Fault::PauseAtPoint | Fault::PartitionAtPoint | Fault::PartitionAtCall
        )
    }

    /// The faults that can strike at `site`.
    pub fn for_site(site: &Site) -> &'static [Fault] {
        match site {
            Site::Call { .. } => &Self::AT_CALLS,
            Site::Point { .. } => &Self::AT_POINTS,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fault::ErrorBefore => "fails before it applies",
            Fault::LostAnswer => "applies, its answer lost",
            Fault::HangThenApply => "hangs past the store timeout, then applies",
            Fault::HangNoApply => "hangs past the store timeout, never applies",
            Fault::DropBefore => "the caller drops execute before it applies",
            Fault::DropAfter => "the caller drops execute after it applies",
            Fault::CrashBefore => "the process crashes before it applies",
            Fault::CrashAfter => "the process crashes after it applies",
            Fault::DropAtPoint => "the caller drops execute here",
            Fault::CrashAtPoint => "the process crashes here",
            Fault::StallAtPoint => "the work stalls here for two leases",
            Fault::PauseAtPoint => "the whole process pauses here for two leases",
            Fault::PartitionAtPoint => "from here the process is cut off for two leases",
            Fault::PartitionAtCall => {
                "from this call the process is cut off for two leases, never applies"
            }
            Fault::DuplicatedLate => "applies, and a copy applies again once the process ended",
            Fault::DuplicatedAfterTakeover => {
                "applies, and a copy applies again just after the key is granted to another"
            }
        })
    }
}

/// A fault at a point: one entry of a run's plan.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PlacedFault {
    /// Where.
    pub point: FaultPoint,
    /// What.
    pub fault: Fault,
}

impl fmt::Display for PlacedFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.point, self.fault)
    }
}
