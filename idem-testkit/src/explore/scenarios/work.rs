//! The work each scenario runs: its steps, its undos, its effects and its await points.

use std::sync::atomic::Ordering::SeqCst;

use idem_core::{Context, WorkError, driver::InterruptedKind, store::WriteOutcome};

use super::{Probe, SAGA_STEPS, SMALL_CAP, Scenario, Undo};
use crate::explore::faults::BoxFuture;
use crate::explore::ledger::Effect;

impl Scenario {
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
