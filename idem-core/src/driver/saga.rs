//! Compensation: steps that register how to undo them, undone in reverse order, once
//! each, when a later step fails for good. The states are drawn on [`Compensation`].

use std::future::Future;
use std::pin::Pin;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::Context;
use super::errors::{Interrupted, Reason, WorkError};

/// The checkpoint holding the failure a saga is compensating for.
pub(crate) const SAGA_STEP: &str = "idem.saga";
/// Prefix of the checkpoint each finished undo leaves.
const UNDO_PREFIX: &str = "idem.undo:";
/// Step names starting with this are idem's own.
pub(crate) const RESERVED_PREFIX: &str = "idem.";

/// What compensating a failed execution did; stored with the failure and replayed with it
/// ([`Outcome::Compensated`](crate::Outcome::Compensated)).
///
/// An execution's states when its steps register undos
/// ([`Context::step_with_undo`](crate::Context::step_with_undo)):
///
/// ```mermaid
/// stateDiagram-v2
///     [*] --> Running: claim
///     Running --> Running: step_with_undo checkpointed (its undo registered)
///     Running --> Completed: work returns Ok
///     Running --> Failed: Permanent, no undo registered
///     Running --> Held: Unknown (lease kept, nothing undone)
///     Running --> Compensating: Permanent with undos registered (failure checkpointed as idem.saga)
///     Compensating --> Compensating: undo of the latest step not yet undone runs, checkpointed as idem.undo:STEP
///     Compensating --> Compensating: crash or lost lease, then a takeover replays the steps (registering their undos) and skips undos already checkpointed
///     Compensating --> Held: an undo is Retryable or Unknown (Error::CompensationPending, lease kept)
///     Compensating --> Compensated: every undo ran (Outcome::Compensated, failed = None)
///     Compensating --> Compensated: an undo failed permanently (failed = that step, pending = the rest)
///     Held --> Running: lease expires, a retry takes over
///     Held --> Compensating: lease expires during a saga, a retry takes over
///     Completed --> [*]
///     Failed --> [*]
///     Compensated --> [*]
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Compensation {
    /// The steps undone, in the order their undos ran (the reverse of the steps').
    pub undone: Vec<String>,
    /// The undo that failed permanently, which stopped the compensation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<FailedUndo>,
    /// The steps whose undos never ran because the undo in [`Compensation::failed`]
    /// stopped the compensation first (latest first): an operator must see to them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<String>,
}

impl Compensation {
    /// True when every registered step was undone.
    pub fn is_complete(&self) -> bool {
        self.failed.is_none() && self.pending.is_empty()
    }
}

/// An undo that failed permanently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FailedUndo {
    /// The step whose undo failed.
    pub step: String,
    /// The undo's error, as JSON.
    pub error: serde_json::Value,
}

type UndoFuture = Pin<Box<dyn Future<Output = UndoResult> + Send>>;

/// An undo registered by a step, waiting to be needed.
pub(crate) struct Undo {
    pub(crate) step: String,
    pub(crate) run: Box<dyn FnOnce() -> UndoFuture + Send>,
}

pub(crate) enum UndoResult {
    Done,
    Permanent(serde_json::Value),
    /// Retryable or unknown: the compensation must be tried again later.
    NotYet,
}

/// The checkpoint an undo of `step` leaves: `idem.undo:STEP`, or for a step name too long
/// to fit beside the prefix, `idem.undo#` and the name's SHA-256 (still one name per step).
pub(crate) fn undo_checkpoint(step: &str) -> String {
    if UNDO_PREFIX.len() + step.len() <= crate::MAX_PART_LEN {
        return format!("{UNDO_PREFIX}{step}");
    }
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(step.as_bytes());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("idem.undo#{hex}")
}

impl Context {
    /// [`Context::step`] that also registers how to undo the step: if a later step (or
    /// the work) fails with [`WorkError::Permanent`], the driver runs the registered
    /// undos in reverse order before storing the failure.
    ///
    /// - `undo` gets the step's value (as stored) and runs at most once per execution,
    ///   across takeovers: each finished undo is checkpointed.
    /// - The failure that started compensating is checkpointed first, so a takeover
    ///   during compensation goes on compensating: it runs the work again, whose
    ///   checkpointed steps replay (registering their undos) and whose first step without
    ///   a checkpoint stops it ([`InterruptedKind::Compensating`](crate::InterruptedKind::Compensating)),
    ///   then it runs the undos not yet checkpointed. Keep the work's path through its
    ///   steps deterministic, and every effect inside a step.
    /// - `undo` answers `Ok(())` when undone; [`WorkError::Permanent`] stops compensating
    ///   and is stored ([`Compensation::failed`]); [`WorkError::Retryable`] or
    ///   [`WorkError::Unknown`] keep the key held
    ///   ([`Error::CompensationPending`](crate::Error::CompensationPending)) until its
    ///   lease ends and a retry takes over to try again.
    /// - [`WorkError::Unknown`] and [`WorkError::Retryable`] from the work never
    ///   compensate: the effect may yet happen, or the work runs again.
    ///
    /// ```
    /// use idem_core::{Fingerprint, Idempotency, Key, MemoryStore, Outcome, WorkError};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let key = Key::new("acct_42/orders.place", "order-7")?;
    /// let outcome = idem
    ///     .execute(&key, Fingerprint::of_bytes("order 7"), |ctx| async move {
    ///         let hold: String = ctx
    ///             .step_with_undo(
    ///                 "reserve",
    ///                 || async { Ok::<_, WorkError<String>>("hold_1".to_string()) },
    ///                 |hold: String| async move { println!("release {hold}"); Ok(()) },
    ///             )
    ///             .await?;
    ///         ctx.step("ship", || async { Err::<(), _>(WorkError::Permanent("no courier".to_string())) })
    ///             .await?;
    ///         Ok(hold)
    ///     })
    ///     .await?;
    /// let Outcome::Compensated { error, compensation, .. } = outcome else { panic!() };
    /// assert_eq!(error, "no courier");
    /// assert_eq!(compensation.undone, ["reserve"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// As [`Context::step`].
    pub async fn step_with_undo<T, E, F, Fut, U, UndoFut>(
        &self,
        name: &str,
        run: F,
        undo: U,
    ) -> Result<T, WorkError<E>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
        U: FnOnce(T) -> UndoFut + Send + 'static,
        UndoFut: Future<Output = Result<(), WorkError<E>>> + Send + 'static,
        E: Serialize + Send + 'static,
    {
        let (value, plain) = self.step_plain(name, run).await?;
        // The undo gets its own copy, decoded from the same stored bytes.
        let for_undo: T = serde_json::from_slice(&plain).map_err(|source| {
            Interrupted(Reason::StepUndecodable {
                step: name.to_owned(),
                source: source.into(),
            })
        })?;
        let run: Box<dyn FnOnce() -> UndoFuture + Send> = Box::new(move || {
            Box::pin(async move {
                match undo(for_undo).await {
                    Ok(()) => UndoResult::Done,
                    Err(WorkError::Permanent(error)) => UndoResult::Permanent(
                        serde_json::to_value(&error).unwrap_or(serde_json::Value::Null),
                    ),
                    Err(_) => UndoResult::NotYet,
                }
            })
        });
        self.register_undo(Undo {
            step: name.to_owned(),
            run,
        });
        Ok(value)
    }
}

/// Refuses `Interrupted::Compensating` to code that would run a new step mid-saga.
pub(crate) fn compensating() -> Interrupted {
    Interrupted(Reason::Compensating)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undo_checkpoints_fit_every_step_name() {
        assert_eq!(undo_checkpoint("charge"), "idem.undo:charge");
        let long = "s".repeat(crate::MAX_PART_LEN);
        let other = format!("{}t", "s".repeat(crate::MAX_PART_LEN - 1));
        for name in [&long, &other] {
            assert!(crate::StepName::new(undo_checkpoint(name)).is_ok());
        }
        assert_ne!(undo_checkpoint(&long), undo_checkpoint(&other));
    }

    #[test]
    fn compensation_round_trips_in_json() {
        let full = Compensation {
            undone: vec!["b".into()],
            failed: Some(FailedUndo {
                step: "a".into(),
                error: serde_json::json!({"code": 7}),
            }),
            pending: vec!["a".into()],
        };
        let text = serde_json::to_string(&full).unwrap();
        assert_eq!(serde_json::from_str::<Compensation>(&text).unwrap(), full);
        let done: Compensation = serde_json::from_str(r#"{"undone":["b","a"]}"#).unwrap();
        assert!(done.is_complete());
        assert!(!full.is_complete());
    }
}
