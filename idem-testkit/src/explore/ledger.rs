//! What every process of a run did, kept outside the store under test: the effects of
//! steps, undos and work, what the store really answered (even when the answer was then
//! lost), and every answer a caller got. The checks read only this.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use idem_core::{Compensation, Timestamp, store::Operation};

use super::faults::{FaultPoint, PlacedFault, Process};

/// An effect the work has on the world outside idem.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Effect {
    /// The work's own effect, outside any step (for the completion scenario: the business
    /// row committed with the result).
    Work,
    /// A step's effect.
    Step(String),
    /// An undo's effect.
    Undo(String),
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Effect::Work => f.write_str("the work's effect"),
            Effect::Step(step) => write!(f, "step `{step}`"),
            Effect::Undo(step) => write!(f, "the undo of `{step}`"),
        }
    }
}

/// What a caller got from `execute`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    Completed {
        value: String,
        replayed: bool,
    },
    Failed {
        error: String,
        replayed: bool,
    },
    Compensated {
        error: String,
        compensation: Compensation,
        replayed: bool,
    },
    Retryable(String),
    Unknown(String),
    /// A failure the driver stored as a marker (a value too large, or that does not
    /// serialise) and answers as an `idem_core::Error`: every caller must agree on it, as
    /// on any stored failure.
    Marked {
        text: String,
        replayed: bool,
    },
    /// An `idem_core::Error`: `name` says which, `fine` whether it is an answer a correct
    /// driver may give under faults (in flight, lease lost, a store error ...).
    Error {
        name: &'static str,
        text: String,
        retry_after: Option<Duration>,
        fine: bool,
    },
}

impl Answer {
    /// The result this answer carries (Completed, Failed, Compensated), without its
    /// replay flag: what every caller must agree on.
    pub(crate) fn result(&self) -> Option<String> {
        match self {
            Answer::Completed { value, .. } => Some(format!("completed {value:?}")),
            Answer::Failed { error, .. } => Some(format!("failed {error:?}")),
            Answer::Compensated {
                error,
                compensation,
                ..
            } => Some(format!(
                "compensated {error:?} {}",
                compensation_text(compensation)
            )),
            Answer::Marked { text, .. } => Some(format!("marked {text}")),
            _ => None,
        }
    }

    pub(crate) fn replayed(&self) -> bool {
        matches!(
            self,
            Answer::Completed { replayed: true, .. }
                | Answer::Failed { replayed: true, .. }
                | Answer::Compensated { replayed: true, .. }
                | Answer::Marked { replayed: true, .. }
        )
    }
}

pub(crate) fn compensation_text(c: &Compensation) -> String {
    let mut text = format!("undone {:?}", c.undone);
    if let Some(failed) = &c.failed {
        text.push_str(&format!(", failed {:?}", failed.step));
    }
    if !c.pending.is_empty() {
        text.push_str(&format!(", pending {:?}", c.pending));
    }
    if !c.interrupted.is_empty() {
        text.push_str(&format!(", interrupted {:?}", c.interrupted));
    }
    text
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(result) = self.result() {
            let replay = if self.replayed() { " (replayed)" } else { "" };
            return write!(f, "{result}{replay}");
        }
        match self {
            Answer::Retryable(error) => write!(f, "retryable {error:?}"),
            Answer::Unknown(error) => write!(f, "unknown {error:?}"),
            Answer::Error { text, .. } => write!(f, "error: {text}"),
            _ => Ok(()),
        }
    }
}

/// How one process's `execute` ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// `execute` returned, after `took` (Tokio's clock: virtual under paused time).
    Returned { answer: Answer, took: Duration },
    /// The caller went away: its `execute` future was dropped, while its work was still
    /// running or after it returned.
    Dropped { work_returned: bool },
    /// The process crashed: its futures were dropped and its store handle went dead.
    Crashed,
    /// The execute task panicked.
    Panicked(String),
    /// `execute` had not returned after this long; the explorer dropped it.
    DidNotReturn(Duration),
    /// The driver could not be built with the run's settings.
    Setup(String),
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Returned { answer, .. } => write!(f, "{answer}"),
            End::Dropped {
                work_returned: true,
            } => f.write_str("dropped after its work returned"),
            End::Dropped { .. } => f.write_str("dropped"),
            End::Crashed => f.write_str("crashed"),
            End::Panicked(message) => write!(f, "panicked: {message}"),
            End::DidNotReturn(waited) => write!(f, "did not return within {waited:?}"),
            End::Setup(error) => write!(f, "could not be set up: {error}"),
        }
    }
}

/// One thing that happened, in the order it happened.
#[derive(Clone, Debug)]
pub(crate) enum Event {
    /// A process reached a fault point.
    Reached(FaultPoint),
    /// A fault struck there.
    Faulted(PlacedFault),
    /// A process sent a store call (before any fault).
    Call {
        process: Process,
        operation: Operation,
        /// The checkpoint's name, for a checkpoint.
        step: Option<String>,
        /// Made by the work itself (the completion in the caller's transaction), not by
        /// the driver.
        by_work: bool,
    },
    /// The store granted a lease (a fresh claim, a takeover, or the same lease again).
    Claimed {
        process: Process,
        token: u64,
        lease_until: Timestamp,
        /// What the store said: a takeover of an earlier owner's record.
        resumed: bool,
    },
    /// The store renewed a lease.
    Renewed {
        process: Process,
        /// The end of the lease the renewal was asked to extend.
        asked: Timestamp,
        lease_until: Timestamp,
    },
    /// The store applied a checkpoint.
    Checkpointed { process: Process, step: String },
    /// Tasks other than a crashed process's were still alive `after` this long once
    /// every process had ended: something the driver spawned never stops.
    Lingered { tasks: usize, after: Duration },
    /// The store applied a `complete` or a `fail`.
    Finished {
        process: Process,
        /// When, on the writer's clock (the one the store keeps the result from).
        at: Timestamp,
    },
    /// The store applied a `release`: the lease ended then.
    Released { process: Process },
    /// The work started, with what its context said.
    WorkStarted {
        process: Process,
        token: u64,
        resumed: bool,
    },
    /// The work returned (whatever it returned).
    WorkReturned { process: Process },
    /// Time the work spent on its own (sleeps, stalls, its own store call's budget).
    WorkTime {
        process: Process,
        duration: Duration,
    },
    /// An effect took place, at this time on the run's clock.
    Effect {
        process: Process,
        effect: Effect,
        at: Timestamp,
    },
    /// A process's `execute` ended.
    Ended { process: Process, end: End },
    /// A process was cut off: paused (its calls wait) or partitioned (its calls fail),
    /// for [`Timing::stall`](super::Timing::stall) from here.
    CutOff { process: Process, paused: bool },
    /// The compensation stored with a failure marker, read from the record at the end of
    /// the run (the marker's answer, an `idem_core::Error`, does not carry it).
    StoredCompensation(Compensation),
}

/// The end of `process`'s lease as the store last granted or renewed it within `events`.
pub(crate) fn held_until(events: &[Event], process: Process) -> Option<Timestamp> {
    events
        .iter()
        .filter_map(|event| match event {
            Event::Claimed {
                process: p,
                lease_until,
                ..
            }
            | Event::Renewed {
                process: p,
                lease_until,
                ..
            } if *p == process => Some(*lease_until),
            _ => None,
        })
        .max()
}

/// The events of one run; closed once the run is over, so that anything a dead process
/// leaves behind is not counted.
#[derive(Default)]
pub(crate) struct Ledger {
    events: Mutex<Vec<Event>>,
    closed: AtomicBool,
}

impl Ledger {
    pub(crate) fn push(&self, event: Event) {
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.closed.load(Ordering::SeqCst) {
            events.push(event);
        }
    }

    pub(crate) fn close(&self) {
        let _events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        self.closed.store(true, Ordering::SeqCst);
    }

    pub(crate) fn snapshot(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// True once `process`'s work returned.
    pub(crate) fn work_returned(&self, process: Process) -> bool {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|e| matches!(e, Event::WorkReturned { process: p } if *p == process))
    }

    /// The first result (Completed, Failed, Compensated) any caller got.
    pub(crate) fn first_result(&self) -> Option<String> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find_map(|e| match e {
                Event::Ended {
                    end: End::Returned { answer, .. },
                    ..
                } => answer.result(),
                _ => None,
            })
    }
}
