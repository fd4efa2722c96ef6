//! The scenarios: what the work does, with its effects recorded in the ledger and await
//! points where the explorer can drop the caller or crash the process.
//!
//! This file names the scenarios and what each promises (its result, its compensation,
//! its bound, its driver's settings); `work` holds the work each runs, and `probe` what
//! that work records its effects and meets its fault points with.

mod probe;
mod work;

use std::fmt;
use std::time::Duration;

use idem_core::{Aes256GcmCodec, ConfigError, Idempotency, InFlightPolicy};

use super::faults::ProcessStore;
use super::{Timing, execute_bound};

pub(crate) use probe::Probe;

/// What the explored work does. Each scenario's work records its effects outside the
/// store and waits at named await points, where faults strike too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scenario {
    /// Work without steps: one effect, then its result.
    Plain,
    /// Three steps (`reserve`, `debit`, `ship`), then the work's own effect.
    Steps,
    /// Three steps with undos (`reserve`, `debit`, `notify`); the step at this position
    /// (1 to 3) fails permanently. At 1 nothing is registered: a plain failure.
    SagaFailsAtStep(u8),
    /// The three steps with undos succeed, then the work fails permanently: all three are
    /// undone.
    SagaFailsAfterSteps,
    /// As [`Scenario::SagaFailsAtStep`]`(3)`, but a takeover that finds the compensation
    /// started fails at once, before any step: the steps an earlier owner registered must
    /// still be accounted for (undone, or reported pending).
    SagaRerunStopsEarly,
    /// As [`Scenario::SagaFailsAfterSteps`], but the undo of `debit` fails permanently:
    /// `notify` undone, `debit` failed, `reserve` pending.
    SagaUndoFails,
    /// A step, then the work completes the record itself, as a store whose `complete_in`
    /// writes inside the caller's transaction: `store.complete` with
    /// `completion.bytes()` under `completion.lease()`, then `completion.written()`; then
    /// it works on for half a lease, so a heartbeat finds the record completed.
    PrepareCompletion,
    /// Work that takes 3.5 leases between two steps: heartbeats must keep its lease.
    LongWork,
    /// A second caller under `InFlightPolicy::Wait` races the first.
    WaitDuplicate,
    /// [`Scenario::Steps`] with results and checkpoints encrypted (`Aes256GcmCodec`).
    Encrypted,
    /// [`Scenario::SagaFailsAfterSteps`] encrypted.
    EncryptedSaga,
    /// A step, then the first run works half a lease (a heartbeat renews) and fails
    /// retryably (the lease is released); the retry finishes.
    RetryableThenDone,
    /// As [`Scenario::SagaFailsAfterSteps`], but the undo of `debit` has its effect, then
    /// answers `WorkError::Unknown`: it is reported interrupted, never run again, and the
    /// other undos go on.
    SagaUndoUnknown,
    /// As [`Scenario::SagaFailsAfterSteps`], but the undo of `debit` answers
    /// `WorkError::Retryable` the first time (nothing happened), then undoes: the first
    /// caller gets `Error::CompensationPending`, and a takeover once the lease ended
    /// finishes the compensation, every step undone once.
    SagaUndoRetryable,
    /// `reserve` with an undo, then `debit` whose value is over the driver's size cap
    /// (`max_response_bytes`, which bounds every stored value): the work propagates the
    /// interruption, the driver registers a placeholder for `debit`'s undo (it has no
    /// value to give it), undoes `reserve` and stores the `StepTooLarge` marker with the
    /// compensation: `reserve` undone, `debit` pending.
    SagaStepTooLarge,
    /// As [`Scenario::SagaStepTooLarge`], with a value of `debit` that does not read back
    /// (a NaN), and work that turns the interruption into its permanent error, so that
    /// the compensation (`reserve` undone, `debit` pending) is in the answer.
    SagaStepUnserializable,
    /// [`Scenario::SagaFailsAfterSteps`] through `execute_bytes`: the failure is raw
    /// bytes (not UTF-8), stored in the raw encoding with the compensation.
    BytesSaga,
}

/// The steps with undos of the saga scenarios, in order.
const SAGA_STEPS: [&str; 3] = ["reserve", "debit", "notify"];

/// The driver's size cap in the scenarios with a value too large to store: far above
/// every other value they store, far below the large one.
const SMALL_CAP: usize = 1024;

/// The result kind a scenario must end with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expect {
    Completed,
    Failed,
    Compensated,
    /// A failure stored as a marker (`Error::Unstorable`).
    Marked,
}

/// What an undo does in a saga scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Undo {
    Done,
    Permanent,
    /// Has its effect, then answers `WorkError::Unknown`.
    Unknown,
    /// Answers `WorkError::Retryable` the first time, then undoes.
    RetryableOnce,
}

/// The compensation a saga scenario's fault-free run must end with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ExpectedCompensation {
    pub(crate) undone: &'static [&'static str],
    pub(crate) failed: Option<&'static str>,
    pub(crate) pending: &'static [&'static str],
    pub(crate) interrupted: &'static [&'static str],
}

impl ExpectedCompensation {
    const fn undone(undone: &'static [&'static str]) -> Self {
        Self {
            undone,
            failed: None,
            pending: &[],
            interrupted: &[],
        }
    }
}

impl fmt::Display for ExpectedCompensation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "undone {:?}", self.undone)?;
        if let Some(failed) = self.failed {
            write!(f, ", failed {failed:?}")?;
        }
        if !self.pending.is_empty() {
            write!(f, ", pending {:?}", self.pending)?;
        }
        if !self.interrupted.is_empty() {
            write!(f, ", interrupted {:?}", self.interrupted)?;
        }
        Ok(())
    }
}

impl Scenario {
    /// Every scenario, in the order explorations run them.
    pub fn all() -> Vec<Scenario> {
        vec![
            Scenario::Plain,
            Scenario::Steps,
            Scenario::SagaFailsAtStep(1),
            Scenario::SagaFailsAtStep(2),
            Scenario::SagaFailsAtStep(3),
            Scenario::SagaFailsAfterSteps,
            Scenario::SagaRerunStopsEarly,
            Scenario::SagaUndoFails,
            Scenario::PrepareCompletion,
            Scenario::LongWork,
            Scenario::WaitDuplicate,
            Scenario::Encrypted,
            Scenario::EncryptedSaga,
            Scenario::RetryableThenDone,
            Scenario::SagaUndoUnknown,
            Scenario::SagaUndoRetryable,
            Scenario::SagaStepTooLarge,
            Scenario::SagaStepUnserializable,
            Scenario::BytesSaga,
        ]
    }

    /// The scenario's name, as reports print it.
    pub fn name(&self) -> String {
        match self {
            Scenario::Plain => "plain".into(),
            Scenario::Steps => "steps".into(),
            Scenario::SagaFailsAtStep(n) => format!("saga-fails-at-step-{n}"),
            Scenario::SagaFailsAfterSteps => "saga-fails-after-steps".into(),
            Scenario::SagaRerunStopsEarly => "saga-rerun-stops-early".into(),
            Scenario::SagaUndoFails => "saga-undo-fails".into(),
            Scenario::PrepareCompletion => "prepare-completion".into(),
            Scenario::LongWork => "long-work".into(),
            Scenario::WaitDuplicate => "wait-duplicate".into(),
            Scenario::Encrypted => "encrypted".into(),
            Scenario::EncryptedSaga => "encrypted-saga".into(),
            Scenario::RetryableThenDone => "retryable-then-done".into(),
            Scenario::SagaUndoUnknown => "saga-undo-unknown".into(),
            Scenario::SagaUndoRetryable => "saga-undo-retryable".into(),
            Scenario::SagaStepTooLarge => "saga-step-too-large".into(),
            Scenario::SagaStepUnserializable => "saga-step-unserializable".into(),
            Scenario::BytesSaga => "bytes-saga".into(),
        }
    }

    fn is_saga(&self) -> bool {
        matches!(
            self,
            Scenario::SagaFailsAtStep(_)
                | Scenario::SagaFailsAfterSteps
                | Scenario::SagaRerunStopsEarly
                | Scenario::SagaUndoFails
                | Scenario::EncryptedSaga
                | Scenario::SagaUndoUnknown
                | Scenario::SagaUndoRetryable
                | Scenario::SagaStepTooLarge
                | Scenario::SagaStepUnserializable
                | Scenario::BytesSaga
        )
    }

    pub(crate) fn expect(&self) -> Expect {
        match self {
            Scenario::SagaFailsAtStep(n) if *n <= 1 => Expect::Failed,
            Scenario::SagaStepTooLarge => Expect::Marked,
            _ if self.is_saga() => Expect::Compensated,
            _ => Expect::Completed,
        }
    }

    /// The steps that register undos.
    pub(crate) fn undo_steps(&self) -> &'static [&'static str] {
        if self.is_saga() { &SAGA_STEPS } else { &[] }
    }

    /// The step whose value cannot be stored: it registers an undo without a checkpoint,
    /// once its effect happened.
    pub(crate) fn unstorable_step(&self) -> Option<&'static str> {
        matches!(
            self,
            Scenario::SagaStepTooLarge | Scenario::SagaStepUnserializable
        )
        .then_some("debit")
    }

    /// The work stores raw bytes (`execute_bytes`).
    pub(crate) fn raw(&self) -> bool {
        *self == Scenario::BytesSaga
    }

    pub(crate) fn undo(&self, step: &str) -> Undo {
        match (self, step) {
            (Scenario::SagaUndoFails, "debit") => Undo::Permanent,
            (Scenario::SagaUndoUnknown, "debit") => Undo::Unknown,
            (Scenario::SagaUndoRetryable, "debit") => Undo::RetryableOnce,
            _ => Undo::Done,
        }
    }

    /// The compensation the fault-free run ends with: what the driver documents for
    /// this scenario.
    pub(crate) fn fault_free_compensation(&self) -> Option<ExpectedCompensation> {
        const ALL: ExpectedCompensation =
            ExpectedCompensation::undone(&["notify", "debit", "reserve"]);
        const TWO: ExpectedCompensation = ExpectedCompensation::undone(&["debit", "reserve"]);
        const FIRST_KEPT_PENDING: ExpectedCompensation = ExpectedCompensation {
            undone: &["reserve"],
            failed: None,
            pending: &["debit"],
            interrupted: &[],
        };
        Some(match self {
            Scenario::SagaFailsAtStep(2) => ExpectedCompensation::undone(&["reserve"]),
            Scenario::SagaFailsAtStep(3) | Scenario::SagaRerunStopsEarly => TWO,
            Scenario::SagaFailsAfterSteps
            | Scenario::EncryptedSaga
            | Scenario::SagaUndoRetryable
            | Scenario::BytesSaga => ALL,
            Scenario::SagaUndoFails => ExpectedCompensation {
                undone: &["notify"],
                failed: Some("debit"),
                pending: &["reserve"],
                interrupted: &[],
            },
            Scenario::SagaUndoUnknown => ExpectedCompensation {
                undone: &["notify", "reserve"],
                failed: None,
                pending: &[],
                interrupted: &["debit"],
            },
            Scenario::SagaStepTooLarge | Scenario::SagaStepUnserializable => FIRST_KEPT_PENDING,
            _ => return None,
        })
    }

    /// The step every compensation of the scenario lists interrupted, whatever the
    /// faults: the undo that answered `Unknown` may have taken effect, and never runs
    /// again.
    pub(crate) fn always_interrupted(&self) -> Option<&'static str> {
        (*self == Scenario::SagaUndoUnknown).then_some("debit")
    }

    /// A rerun of the work after the saga was checkpointed registers no undo at all: the
    /// steps an earlier owner registered and did not undo are reported pending.
    pub(crate) fn rerun_registers_nothing(&self) -> bool {
        *self == Scenario::SagaRerunStopsEarly
    }

    /// The work's own time at most, in one process, without stalls.
    fn max_work(&self, timing: &Timing) -> Duration {
        match self {
            Scenario::LongWork => timing.lease * 7 / 8 * 4,
            Scenario::WaitDuplicate | Scenario::RetryableThenDone => timing.lease / 2,
            Scenario::PrepareCompletion => timing.lease / 2 + timing.store_timeout,
            _ => Duration::ZERO,
        }
    }

    /// The store writes one process makes at most after its claim: each step's
    /// checkpoint, for a saga its checkpoint and two marks per undo, the result or
    /// failure and the marker written instead of it, a release.
    fn max_writes(&self) -> u32 {
        let steps: u32 = match self {
            Scenario::Plain => 0,
            Scenario::PrepareCompletion | Scenario::WaitDuplicate | Scenario::RetryableThenDone => {
                1
            }
            Scenario::LongWork => 2,
            _ => 3,
        };
        let undos = u32::try_from(self.undo_steps().len()).unwrap_or(u32::MAX);
        let saga = if undos > 0 { 1 + 2 * undos } else { 0 };
        steps + saga + 3
    }

    /// The largest [`execute_bound`] any process of this scenario can have, with
    /// `stalls` stalls of its work: what a hanging store call must outlast to show.
    pub(crate) fn max_bound(&self, timing: &Timing, stalls: u32) -> Duration {
        execute_bound(
            timing.lease,
            timing.store_timeout,
            self.wait(timing),
            self.max_work(timing) + timing.stall * stalls,
            self.max_writes(),
        )
    }

    pub(crate) fn has_duplicate(&self) -> bool {
        *self == Scenario::WaitDuplicate
    }

    /// Whether the work itself may answer `Retryable` or `Unknown`: only where it does.
    pub(crate) fn may_answer_retryable(&self) -> bool {
        *self == Scenario::RetryableThenDone
    }

    pub(crate) fn may_answer_unknown(&self) -> bool {
        *self == Scenario::PrepareCompletion
    }

    pub(crate) fn wait(&self, timing: &Timing) -> Option<Duration> {
        self.has_duplicate().then_some(timing.wait_timeout)
    }

    /// The driver of one process, over its own store handle, with the scenario's settings.
    pub(crate) fn driver(
        &self,
        timing: &Timing,
        store: ProcessStore,
    ) -> Result<Idempotency<ProcessStore>, ConfigError> {
        // Each process draws its backoff jitter from a sequence of its own, the same in
        // every run: a plan replays exactly, and processes do not back off in step.
        let seed = store.process.seed();
        let mut builder = Idempotency::builder(store)
            .jitter_seed(seed)
            .lease(timing.lease)
            .retention(timing.retention.max(timing.lease))
            .store_timeout(timing.store_timeout)
            .heartbeat(timing.heartbeat);
        if let Some(timeout) = self.wait(timing) {
            builder = builder.in_flight(InFlightPolicy::Wait { timeout });
        }
        if matches!(self, Scenario::Encrypted | Scenario::EncryptedSaga) {
            builder = builder.codec(Aes256GcmCodec::new(1, [42; 32]));
        }
        if *self == Scenario::SagaStepTooLarge {
            builder = builder.max_response_bytes(SMALL_CAP);
        }
        builder.build()
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}
