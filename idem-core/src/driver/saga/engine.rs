//! The compensation engine: once the work failed for good, the saga checkpoint, every
//! undo and the stored failure, in a task of its own.
//!
//! It works on the failure's plain bytes, not on the error's type, so that it can run
//! apart from the caller: a caller that drops `execute` (a client gone, a timeout) stops
//! none of it, and the lease is renewed on the heartbeat's schedule for the whole of it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::driver::error::{CannotStore, Error, Interrupted, Reason};
use crate::driver::finish::answer_failure;
use crate::driver::saga::{self, Undo, UndoMark, UndoResult};
use crate::driver::wire::{Marker, StoredFailure, Wire};
use crate::driver::{Context, FailedUndo, durable, heartbeat, interruption_error, step_name};
use crate::driver::{Idempotency, Outcome};
use crate::record::ValuePart;
use crate::{BoxError, Compensation, Store, StoreError, store::Operation, store::WriteOutcome};

/// How the engine writes failures without knowing the error's type.
#[derive(Clone, Copy)]
pub(crate) struct Encoding {
    pub(crate) with_compensation: fn(&[u8], &Compensation) -> Result<Vec<u8>, BoxError>,
    pub(crate) marker: fn(&Marker, Option<&Compensation>) -> Vec<u8>,
}

/// One compensation to run.
pub(crate) struct Saga {
    pub(crate) context: Context,
    /// The undos this run of the work registered, in order.
    pub(crate) undos: Vec<Undo>,
    /// On the run that failed: the failure's plain bytes (the work's error, or a marker
    /// saying why it cannot be stored). `None` on a takeover, which reads them, with the
    /// steps, from the saga checkpoint.
    pub(crate) failure: Option<Vec<u8>>,
    /// This run of the work went as far as it can: an undo it did not register, it never
    /// will.
    pub(crate) whole: bool,
    pub(crate) every: Option<Duration>,
    pub(crate) lease: Duration,
    pub(crate) encoding: Encoding,
}

/// Runs `saga` in a task of its own and answers the stored failure's plain bytes.
///
/// The lease is renewed while the caller waits, and for one more lease after it left: a
/// compensation left by its caller still finishes its undos, but one whose undo never
/// returns does not hold the key for ever; the lease ends, and a retry reports that undo
/// interrupted.
pub(crate) async fn run(saga: Saga) -> Result<Vec<u8>, Error> {
    let left = Arc::new(Mutex::new(None::<Instant>));
    let caller = CallerPresent(Arc::clone(&left));
    let task = tokio::spawn(tracing::Instrument::in_current_span(async move {
        let (context, every, lease) = (saga.context.clone(), saga.every, saga.lease);
        let keep = move || {
            let left = *left.lock().unwrap_or_else(PoisonError::into_inner);
            left.is_none_or(|left| left.elapsed() < lease)
        };
        heartbeat::run_while(compensate(saga), &context, every, lease, keep).await
    }));
    let joined = task.await;
    drop(caller);
    match joined {
        Ok(result) => result,
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        // Only a runtime shutting down cancels the task; a takeover finishes the saga.
        Err(err) => Err(Error::Store(StoreError::Unavailable {
            operation: Operation::Checkpoint,
            source: Box::new(err),
        })),
    }
}

/// Records when the caller stopped waiting (dropped `execute`).
struct CallerPresent(Arc<Mutex<Option<Instant>>>);

impl Drop for CallerPresent {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }
}

async fn compensate(saga: Saga) -> Result<Vec<u8>, Error> {
    let Saga {
        context,
        undos: mut registered,
        failure,
        whole,
        encoding,
        ..
    } = saga;
    let key = context.key();
    let interrupted = |err: Interrupted| interruption_error(&key, err);
    let (listed, plain) = match failure {
        Some(plain) => {
            let listed: Vec<String> = registered.iter().map(|undo| undo.step.clone()).collect();
            match checkpoint_saga(&context, &listed, plain, encoding).await? {
                Ok(plain) => (listed, plain),
                // Not even a marker fits beside the checkpoints: nothing can record what
                // would be undone, so nothing is; every step is reported pending, for an
                // operator, beside the marker saying why.
                Err(marker) => {
                    tracing::warn!(
                        steps = ?listed,
                        "no room in the record to compensate; every step reported pending"
                    );
                    let compensation = Compensation {
                        undone: Vec::new(),
                        failed: None,
                        pending: listed.into_iter().rev().collect(),
                        interrupted: Vec::new(),
                    };
                    let plain = (encoding.marker)(&marker, Some(&compensation));
                    return store_compensated(&context, plain, &compensation, encoding).await;
                }
            }
        }
        None => {
            let stored = context
                .checkpointed(saga::SAGA_STEP)
                .map_err(interrupted)?
                .ok_or_else(|| Error::Decode("the saga checkpoint is missing".into()))?;
            let (listed, plain) = saga::decode_saga(&stored).map_err(Error::Decode)?;
            let listed =
                listed.unwrap_or_else(|| registered.iter().map(|undo| undo.step.clone()).collect());
            (listed, plain.to_vec())
        }
    };
    let mut compensation = Compensation {
        undone: Vec::new(),
        failed: None,
        pending: Vec::new(),
        interrupted: Vec::new(),
    };
    // A step run twice under one name registered twice: it is undone once.
    let mut seen = HashSet::new();
    let listed: Vec<String> = listed
        .into_iter()
        .filter(|step| seen.insert(step.clone()))
        .collect();
    for step in listed.into_iter().rev() {
        let started = context
            .checkpointed(&saga::undo_checkpoint(&step))
            .map_err(interrupted)?;
        let ended = context
            .checkpointed(&saga::undone_checkpoint(&step))
            .map_err(interrupted)?;
        let stopped = compensation.failed.is_some();
        match UndoMark::read(started.as_deref(), ended.as_deref()) {
            UndoMark::Done => compensation.undone.push(step),
            UndoMark::Started => compensation.interrupted.push(step),
            _ if stopped => compensation.pending.push(step),
            UndoMark::Failed(error) => compensation.failed = Some(FailedUndo { step, error }),
            UndoMark::NotRun | UndoMark::Retry => {
                let Some(at) = registered.iter().rposition(|undo| undo.step == step) else {
                    if !whole {
                        // A later run of the work may register it yet.
                        return Err(Error::CompensationPending { step });
                    }
                    tracing::warn!(
                        step = %step,
                        "a step registered an undo that this run of the work never reached; reported pending"
                    );
                    compensation.pending.push(step);
                    continue;
                };
                let Some(undo) = registered.swap_remove(at).run else {
                    // The step's value could not be stored: no value to undo it with.
                    compensation.pending.push(step);
                    continue;
                };
                if context.is_lease_lost() {
                    return Err(Error::LeaseLost);
                }
                match run_undo(&context, &step, undo).await? {
                    Ran::Ended(UndoResult::Done) => compensation.undone.push(step),
                    Ran::Ended(UndoResult::Permanent(error)) => {
                        tracing::warn!(step = %step, "an undo failed permanently; compensation stopped");
                        compensation.failed = Some(FailedUndo { step, error });
                    }
                    Ran::Ended(UndoResult::Unknown) => {
                        tracing::warn!(step = %step, "an undo's outcome is unknown; reported interrupted, never run again");
                        compensation.interrupted.push(step);
                    }
                    Ran::Ended(UndoResult::NotYet) => {
                        return Err(Error::CompensationPending { step });
                    }
                    Ran::NoRoom => compensation.pending.push(step),
                }
            }
        }
    }
    let plain = (encoding.with_compensation)(&plain, &compensation).map_err(Error::Decode)?;
    store_compensated(&context, plain, &compensation, encoding).await
}

/// Checkpoints the failure with the steps to undo. A failure that does not fit is
/// checkpointed as the marker saying so; `Err(marker)` when not even that fits.
async fn checkpoint_saga(
    context: &Context,
    listed: &[String],
    mut plain: Vec<u8>,
    encoding: Encoding,
) -> Result<Result<Vec<u8>, Marker>, Error> {
    let key = context.key();
    let step = step_name(saga::SAGA_STEP).map_err(|err| interruption_error(&key, err))?;
    let mut marked = false;
    loop {
        match context
            .checkpoint_own(&step, &saga::encode_saga(listed, &plain))
            .await
        {
            Ok(()) => return Ok(Ok(plain)),
            Err(Interrupted(Reason::Unstorable(CannotStore::StepTooLarge {
                size, limit, ..
            }))) if !marked => {
                marked = true;
                plain = (encoding.marker)(
                    &Marker::ResultTooLarge {
                        size,
                        limit,
                        failure: true,
                    },
                    None,
                );
            }
            Err(Interrupted(Reason::Unstorable(unstorable))) => {
                return Ok(Err(Marker::from_unstorable(unstorable)));
            }
            Err(other) => return Err(interruption_error(&key, other)),
        }
    }
}

enum Ran {
    Ended(UndoResult),
    /// Not even its `started` mark fits in the record: it did not run.
    NoRoom,
}

/// Runs one undo, marked started (`idem.undo:STEP`) before and ended (`idem.undone:STEP`)
/// after, both with the owner's token.
async fn run_undo(
    context: &Context,
    step: &str,
    undo: Box<dyn FnOnce() -> saga::UndoFuture + Send>,
) -> Result<Ran, Error> {
    let key = context.key();
    let token = context.token();
    let started =
        step_name(&saga::undo_checkpoint(step)).map_err(|err| interruption_error(&key, err))?;
    let ended_mark =
        step_name(&saga::undone_checkpoint(step)).map_err(|err| interruption_error(&key, err))?;
    match context
        .checkpoint_own(&started, &UndoMark::started(token))
        .await
    {
        Ok(()) => {}
        Err(Interrupted(Reason::Unstorable(_))) => return Ok(Ran::NoRoom),
        Err(other) => return Err(interruption_error(&key, other)),
    }
    let result = undo().await;
    if let Some(mark) = UndoMark::ended(token, &result) {
        let ended = match context.checkpoint_own(&ended_mark, &mark).await {
            // An undo's error too large for its mark: the mark keeps that it failed for
            // good (which stops the compensation on any takeover too), not the error.
            Err(Interrupted(Reason::Unstorable(_)))
                if matches!(result, UndoResult::Permanent(_)) =>
            {
                let failed = UndoResult::Permanent(serde_json::Value::Null);
                match UndoMark::ended(token, &failed) {
                    Some(mark) => context.checkpoint_own(&ended_mark, &mark).await,
                    None => Ok(()),
                }
            }
            ended => ended,
        };
        ended.map_err(|err| interruption_error(&key, err))?;
    }
    Ok(Ran::Ended(result))
}

/// Stores the compensated failure, or, when it does not fit, the marker saying so with
/// what compensating did.
async fn store_compensated(
    context: &Context,
    plain: Vec<u8>,
    compensation: &Compensation,
    encoding: Encoding,
) -> Result<Vec<u8>, Error> {
    let room = context.room_for_response();
    let size = encoded(context, plain.clone())?.len();
    if size <= room {
        return store(context, plain, compensation, encoding).await;
    }
    let marker = Marker::ResultTooLarge {
        size,
        limit: room,
        failure: true,
    };
    let plain = (encoding.marker)(&marker, Some(compensation));
    store(context, plain, compensation, encoding).await
}

/// Writes a failure's plain bytes; one the store refuses as too large is written again as
/// the marker saying so, with what compensating did, and only when the store refuses even
/// that, as the bare marker.
async fn store(
    context: &Context,
    plain: Vec<u8>,
    compensation: &Compensation,
    encoding: Encoding,
) -> Result<Vec<u8>, Error> {
    let mut plain = plain;
    let mut fallbacks = [Some(compensation), None].into_iter();
    loop {
        let bytes = encoded(context, plain.clone())?;
        match context.durable(durable::Write::Fail(bytes)).await {
            Ok(WriteOutcome::Applied) => return Ok(plain),
            Ok(WriteOutcome::Fenced) => {
                return Err(crate::driver::finish::fenced_at_the_end(context));
            }
            Err(StoreError::TooLarge { part, size, limit }) => match fallbacks.next() {
                Some(kept) => {
                    plain = (encoding.marker)(
                        &Marker::ResultTooLarge {
                            size,
                            limit,
                            failure: true,
                        },
                        kept,
                    );
                }
                None => return Err(Error::Store(StoreError::TooLarge { part, size, limit })),
            },
            Err(err) => return Err(Error::Store(err)),
        }
    }
}

fn encoded(context: &Context, plain: Vec<u8>) -> Result<Vec<u8>, Error> {
    context
        .encode(ValuePart::Failure, plain)
        .map_err(|err| interruption_error(&context.key(), err))
}

impl<S: Store + ?Sized + 'static> Idempotency<S> {
    /// Runs the undos in reverse order, each at most once across takeovers, then stores
    /// the failure with what was undone, all in a task of its own (see [`run`] below).
    /// `failure` is the work's failure on the run that failed; a takeover reads it from
    /// the saga checkpoint. `whole` says this run of the work went as far as it can, so an
    /// undo it did not register never will be.
    pub(in crate::driver) async fn compensate<W: Wire>(
        &self,
        context: &Context,
        failure: Option<StoredFailure<W::Failure>>,
        whole: bool,
        every: Option<Duration>,
    ) -> Result<Outcome<W::Value, W::Failure>, Error> {
        // A work error that does not serialise, or does not read back, compensates all the
        // same: the marker saying so stands in for it.
        let failure = failure.map(|failure| {
            W::encode_failure(&failure)
                .and_then(|plain| W::decode_failure(&plain).map(|_| plain))
                .unwrap_or_else(|_| {
                    let marker = Marker::Unserializable {
                        step: None,
                        failure: true,
                    };
                    W::marker(&marker, None)
                })
        });
        let saga = Saga {
            context: context.clone(),
            undos: context.take_undos(),
            failure,
            whole,
            every,
            lease: self.settings.lease,
            encoding: Encoding {
                with_compensation: W::with_compensation,
                marker: W::marker,
            },
        };
        let plain = run(saga).await?;
        let stored = W::decode_failure(&plain).map_err(Error::Decode)?;
        if let StoredFailure::CompensatedMarker(_, compensation) = &stored {
            tracing::warn!(
                undone = ?compensation.undone,
                pending = ?compensation.pending,
                interrupted = ?compensation.interrupted,
                "compensated a work error that could not be stored"
            );
        }
        answer_failure(stored, false, None)
    }
}
