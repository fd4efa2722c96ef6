//! The scenarios: what the work does, with its effects recorded in the ledger and await
//! points where the explorer can drop the caller or crash the process.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use idem_core::{
    Aes256GcmCodec, ConfigError, Context, Idempotency, InFlightPolicy, WorkError,
    driver::InterruptedKind, store::WriteOutcome,
};

use super::faults::{BoxFuture, Fault, Kill, Process, ProcessStore, World};
use super::ledger::{Effect, Event};
use super::{Timing, execute_bound};

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

    /// The work one process runs.
    pub(crate) fn work(self, probe: Probe) -> impl FnOnce(Context) -> WorkFuture + Send {
        move |ctx: Context| {
            Box::pin(async move {
                probe.started(&ctx);
                let result = self.body(&probe, &ctx).await;
                probe.returned();
                result
            })
        }
    }

    async fn body(self, probe: &Probe, ctx: &Context) -> WorkResult {
        let me = probe.process;
        let token = ctx.token();
        match self {
            Scenario::Plain => {
                probe.point("before-effect").await;
                probe.effect(Effect::Work).await;
                probe.point("after-effect").await;
                Ok(format!("paid by {me} (token {token})"))
            }
            Scenario::Steps | Scenario::Encrypted => {
                let mut done = Vec::new();
                for name in ["reserve", "debit", "ship"] {
                    done.push(effect_step(ctx, probe, name).await?);
                }
                probe.effect(Effect::Work).await;
                probe.point("after-effect").await;
                Ok(format!("{} by {me}", done.join(" ")))
            }
            Scenario::PrepareCompletion => {
                let reserved = effect_step(ctx, probe, "reserve").await?;
                let value = format!("{reserved}, committed by {me} (token {token})");
                let completion = ctx.prepare_completion(&value)?;
                probe.point("before-commit").await;
                match probe.commit(&completion).await {
                    Ok(WriteOutcome::Applied) => completion.written(),
                    Ok(WriteOutcome::Fenced) => {
                        return Err(WorkError::Retryable("another attempt owns the key".into()));
                    }
                    // Whether the transaction committed is unknown: keep the key held.
                    Err(err) => return Err(WorkError::Unknown(err)),
                }
                // Long enough for a heartbeat to find the record completed: the driver
                // must still answer the committed value, not a lost lease.
                probe.work_for(probe.world.timing.lease / 2).await;
                probe.point("after-commit").await;
                Ok(value)
            }
            Scenario::LongWork => {
                let started = effect_step(ctx, probe, "start").await?;
                // 3.5 leases in four pieces, with a point between each.
                let piece = probe.world.timing.lease * 7 / 8;
                for tick in 0..4 {
                    probe.work_for(piece).await;
                    probe.point(&format!("tick-{tick}")).await;
                }
                let finished = effect_step(ctx, probe, "finish").await?;
                Ok(format!("{started} {finished} by {me}"))
            }
            Scenario::WaitDuplicate => {
                let reserved = effect_step(ctx, probe, "reserve").await?;
                // Long enough that the duplicate really waits.
                probe.work_for(probe.world.timing.lease / 2).await;
                probe.effect(Effect::Work).await;
                probe.point("after-effect").await;
                Ok(format!("{reserved}, paid by {me}"))
            }
            Scenario::RetryableThenDone => {
                let reserved = effect_step(ctx, probe, "reserve").await?;
                if !probe.retryable_already_returned() {
                    // Long enough for a heartbeat to renew before the release: a late copy
                    // of that renewal must not hold the released key again.
                    probe.work_for(probe.world.timing.lease / 2).await;
                    probe.point("before-retryable").await;
                    probe.mark_retryable_returned();
                    return Err(WorkError::Retryable("the provider is busy".into()));
                }
                probe.effect(Effect::Work).await;
                probe.point("after-effect").await;
                Ok(format!("{reserved}, paid by {me} (token {token})"))
            }
            Scenario::SagaFailsAtStep(_)
            | Scenario::SagaFailsAfterSteps
            | Scenario::SagaRerunStopsEarly
            | Scenario::SagaUndoFails
            | Scenario::EncryptedSaga
            | Scenario::SagaUndoUnknown
            | Scenario::SagaUndoRetryable
            | Scenario::SagaStepTooLarge
            | Scenario::SagaStepUnserializable
            | Scenario::BytesSaga => {
                let fails_at = match self {
                    Scenario::SagaFailsAtStep(n) => usize::from(n),
                    Scenario::SagaRerunStopsEarly => 3,
                    _ => 0,
                };
                let compensating = ctx.completed_steps().iter().any(|s| s == "idem.saga");
                if self == Scenario::SagaRerunStopsEarly && compensating {
                    probe.point("stops-early").await;
                    return Err(WorkError::Permanent("the order is gone".into()));
                }
                let mut done = Vec::new();
                for (at, name) in SAGA_STEPS.iter().enumerate() {
                    if self.unstorable_step() == Some(name) {
                        unstorable_step(self, ctx, probe, name).await?;
                    }
                    let fails = fails_at == at + 1;
                    done.push(undo_step(ctx, probe, name, fails, self.undo(name)).await?);
                }
                if fails_at == 0 {
                    probe.point("before-failing").await;
                    return Err(WorkError::Permanent("the order was cancelled".into()));
                }
                Ok(format!("{} by {me}", done.join(" ")))
            }
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

type WorkResult = Result<String, WorkError<String>>;
pub(crate) type WorkFuture = BoxFuture<WorkResult>;

/// A step whose closure has an effect, with a point between the effect and the
/// checkpoint, and one after the checkpoint.
async fn effect_step(ctx: &Context, probe: &Probe, name: &'static str) -> WorkResult {
    let inner = probe.clone();
    let token = ctx.token();
    let value = ctx
        .step(name, || async move {
            inner.effect(Effect::Step(name.into())).await;
            inner.point(&format!("{name}:effect-done")).await;
            Ok::<_, WorkError<String>>(format!("{name}#{}.{token}", inner.process))
        })
        .await?;
    probe.point(&format!("after-{name}")).await;
    Ok(value)
}

/// [`effect_step`] with an undo (whose effect sits between two points), or a step whose
/// run fails permanently; `behaviour` says what the undo answers.
async fn undo_step(
    ctx: &Context,
    probe: &Probe,
    name: &'static str,
    fails: bool,
    behaviour: Undo,
) -> WorkResult {
    let (inner, undo) = (probe.clone(), probe.clone());
    let token = ctx.token();
    let value = ctx
        .step_with_undo(
            name,
            || async move {
                if fails {
                    return Err(WorkError::Permanent(format!("{name} was refused")));
                }
                inner.effect(Effect::Step(name.into())).await;
                inner.point(&format!("{name}:effect-done")).await;
                Ok(format!("{name}#{}.{token}", inner.process))
            },
            move |_value: String| async move {
                undo.point(&format!("undo-{name}:start")).await;
                match behaviour {
                    Undo::Permanent => {
                        return Err(WorkError::Permanent(format!("{name} cannot be undone")));
                    }
                    Undo::RetryableOnce if !undo.world.undo_retried.swap(true, SeqCst) => {
                        return Err(WorkError::Retryable(format!("{name}'s provider is busy")));
                    }
                    _ => {}
                }
                undo.effect(Effect::Undo(name.into())).await;
                undo.point(&format!("undo-{name}:effect-done")).await;
                if behaviour == Undo::Unknown {
                    return Err(WorkError::Unknown(format!("{name}'s refund timed out")));
                }
                Ok(())
            },
        )
        .await?;
    probe.point(&format!("after-{name}")).await;
    Ok(value)
}

/// The step of [`Scenario::unstorable_step`]: its effect happens, then its value cannot
/// be stored (over the size cap, or not reading back), so it registers its undo without a
/// value. Answers the interruption (propagated to the driver) or, where the scenario wants
/// the compensation in the answer, the permanent error the work makes of it.
async fn unstorable_step(
    scenario: Scenario,
    ctx: &Context,
    probe: &Probe,
    name: &'static str,
) -> Result<(), WorkError<String>> {
    let (inner, undo) = (probe.clone(), probe.clone());
    let undone = move || async move {
        // Never runs: the driver has no stored value to give it.
        undo.effect(Effect::Undo(name.into())).await;
        Ok(())
    };
    let stopped = if scenario == Scenario::SagaStepTooLarge {
        ctx.step_with_undo(
            name,
            || async move {
                inner.effect(Effect::Step(name.into())).await;
                inner.point(&format!("{name}:effect-done")).await;
                Ok::<_, WorkError<String>>("x".repeat(SMALL_CAP * 4))
            },
            move |_value: String| undone(),
        )
        .await
        .map(drop)
    } else {
        ctx.step_with_undo(
            name,
            || async move {
                inner.effect(Effect::Step(name.into())).await;
                inner.point(&format!("{name}:effect-done")).await;
                // Serialised as `null`, which does not read back as a number.
                Ok::<_, WorkError<String>>(f64::NAN)
            },
            move |_value: f64| undone(),
        )
        .await
        .map(drop)
    };
    match stopped {
        Err(WorkError::Interrupted(interrupted))
            if scenario == Scenario::SagaStepUnserializable
                && interrupted.kind() == InterruptedKind::Unstorable =>
        {
            Err(WorkError::Permanent(format!(
                "{name} left no receipt: {interrupted}"
            )))
        }
        Ok(()) => Err(WorkError::Permanent(format!(
            "{name} stored a value it cannot"
        ))),
        Err(other) => Err(other),
    }
}

/// What the work of one process uses to record its effects and to wait at fault points.
#[derive(Clone)]
pub(crate) struct Probe {
    pub(crate) process: Process,
    pub(crate) world: Arc<World>,
    pub(crate) store: Arc<ProcessStore>,
}

impl Probe {
    /// An await point: the explorer may drop the caller, crash the process or stall here.
    pub(crate) async fn point(&self, name: &str) {
        if self.world.crashed(self.process) {
            return self.world.dead().await;
        }
        match self.world.next_point(self.process, name) {
            Some(Fault::DropAtPoint) => self.world.kill(self.process, Kill::Drop).await,
            Some(Fault::CrashAtPoint) => {
                self.world.kill(self.process, Kill::Crash).await;
                self.world.dead().await;
            }
            Some(Fault::StallAtPoint) => self.work_for(self.world.timing.stall).await,
            Some(Fault::PauseAtPoint) => {
                let until = self.world.cut_off(self.process, Fault::PauseAtPoint);
                self.world.ledger.push(Event::WorkTime {
                    process: self.process,
                    duration: self.world.timing.stall,
                });
                tokio::time::sleep_until(until).await;
            }
            Some(Fault::PartitionAtPoint) => {
                self.world.cut_off(self.process, Fault::PartitionAtPoint);
            }
            _ => {}
        }
    }

    /// Records an effect; a crashed process has none.
    pub(crate) async fn effect(&self, effect: Effect) {
        if self.world.crashed(self.process) {
            return self.world.dead().await;
        }
        self.world.ledger.push(Event::Effect {
            process: self.process,
            effect,
            at: self.world.now_of(self.process),
        });
    }

    /// The work's own time: a sleep, counted toward the process's bound.
    pub(crate) async fn work_for(&self, duration: Duration) {
        self.world.ledger.push(Event::WorkTime {
            process: self.process,
            duration,
        });
        tokio::time::sleep(duration).await;
    }

    /// The work's own commit, bounded by the store timeout as an application would bound
    /// it (and counted as the work's own time).
    async fn commit(
        &self,
        completion: &idem_core::store::Completion,
    ) -> Result<WriteOutcome, String> {
        let timeout = self.world.timing.store_timeout;
        self.world.ledger.push(Event::WorkTime {
            process: self.process,
            duration: timeout,
        });
        match tokio::time::timeout(timeout, self.store.commit(completion)).await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err("the commit timed out".into()),
        }
    }

    fn started(&self, ctx: &Context) {
        self.world.ledger.push(Event::WorkStarted {
            process: self.process,
            token: ctx.token(),
            resumed: ctx.resumed(),
        });
    }

    fn returned(&self) {
        self.world.ledger.push(Event::WorkReturned {
            process: self.process,
        });
    }

    fn retryable_already_returned(&self) -> bool {
        self.world
            .retryable_returned
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    fn mark_retryable_returned(&self) {
        self.world
            .retryable_returned
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
