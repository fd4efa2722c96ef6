//! Compensation: steps that register how to undo them, undone in reverse order, once
//! each, when a later step fails for good. The states are drawn on [`Compensation`].

mod engine;

use std::future::Future;
use std::pin::Pin;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::Context;
use super::error::{Interrupted, Reason, WorkError};

/// The checkpoint holding the failure a saga is compensating for.
pub(crate) const SAGA_STEP: &str = "idem.saga";
/// Prefix of the checkpoint each finished undo leaves.
const UNDO_PREFIX: &str = "idem.undo:";
const UNDONE_PREFIX: &str = "idem.undone:";
/// Step names starting with this are idem's own.
pub(crate) const RESERVED_PREFIX: &str = "idem.";
/// The checkpoint a run leaves before releasing its key when it derived a key for another
/// system but recorded no step: a release keeps a record with steps, so the next retry
/// takes over and derives the same key, instead of starting a lifetime that derives
/// another.
pub(crate) const DERIVED_STEP: &str = "idem.derived";

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
///     Running --> Compensating: Permanent with undos registered (failure and their steps checkpointed as idem.saga)
///     Compensating --> Compensating: undo of the latest listed step not yet run: idem.undo:STEP marked started (with the token), the undo runs, idem.undone:STEP marked with how it ended (with the token)
///     Compensating --> Compensating: crash or lost lease, then a takeover replays the steps (registering their undos), skips ended undos, reports started ones interrupted
///     Compensating --> Held: an undo is Retryable (Error::CompensationPending, lease kept)
///     Compensating --> Compensated: every listed step undone, pending or interrupted (Outcome::Compensated)
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
    /// The steps whose undos never ran (latest first): the undo in
    /// [`Compensation::failed`] stopped the compensation first, or the run of the work
    /// that finished the compensation (a takeover) no longer registers their undo. An
    /// operator must see to them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<String>,
    /// The steps whose undo started but whose end no owner saw (the process crashed, or
    /// the caller dropped the execution, while the undo ran): undos run at most once, so
    /// none of these ran again. An operator must check whether each took effect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interrupted: Vec<String>,
}

impl Compensation {
    /// True when every registered step was undone.
    pub fn is_complete(&self) -> bool {
        self.failed.is_none() && self.pending.is_empty() && self.interrupted.is_empty()
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

pub(crate) type UndoFuture = Pin<Box<dyn Future<Output = UndoResult> + Send>>;

/// An undo registered by a step, waiting to be needed.
pub(crate) struct Undo {
    pub(crate) step: String,
    /// `None` for a step whose effect happened but whose value could not be stored: its
    /// undo, which takes that value, cannot run, and is reported pending.
    pub(crate) run: Option<Box<dyn FnOnce() -> UndoFuture + Send>>,
}

pub(crate) enum UndoResult {
    Done,
    Permanent(serde_json::Value),
    /// Retryable: nothing happened; the compensation must be tried again later.
    NotYet,
    /// Unknown: it may have taken effect, so it never runs again (reported interrupted).
    Unknown,
}

/// What the checkpoints of an undo say of it. Two marks, each written by one owner once
/// per run of the undo, so that a mark never moves backwards:
///
/// - `idem.undo:STEP` is `started:TOKEN`, written before the undo runs;
/// - `idem.undone:STEP` is `TOKEN:HOW`, written when it ends (`true`, `retry`, or
///   `failed:` and the error as JSON); an undo whose outcome is unknown leaves none.
///
/// The end counts only when its token is at least the start's: an owner that starts the
/// undo again (after `retry`) makes the earlier end stale until it writes its own, so an
/// undo whose end no owner saw is never run a second time (a refund issued twice is money
/// gone, while an undo reported interrupted is one an operator checks). A delayed copy of
/// an owner's own `started` write that lands after its end mark changes nothing either:
/// the end carries the same token. Before this, one name held both marks, and such a copy
/// turned a `retry` back into `started`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UndoMark {
    /// No owner started it.
    NotRun,
    /// An owner started it and never recorded its end.
    Started,
    Done,
    /// It answered Retryable (nothing happened): the next owner runs it again.
    Retry,
    /// It failed for good, with this error.
    Failed(serde_json::Value),
}

const MARK_STARTED: &[u8] = b"started";
/// Also what earlier versions wrote for a finished undo.
const MARK_DONE: &[u8] = b"true";
const MARK_RETRY: &[u8] = b"retry";
const MARK_FAILED: &[u8] = b"failed:";

impl UndoMark {
    /// The undo's state from its start mark (`idem.undo:STEP`) and its end mark
    /// (`idem.undone:STEP`), as stored.
    pub(crate) fn read(started: Option<&[u8]>, ended: Option<&[u8]>) -> Self {
        // An earlier version kept the whole state under the start mark's name, untokened:
        // any end mark is later than it.
        let started_by = started.map(|mark| match mark.strip_prefix(b"started:") {
            Some(token) => Self::token(token).unwrap_or(u64::MAX),
            None => 0,
        });
        if let Some((token, how)) = ended.and_then(Self::split_end)
            && started_by.is_none_or(|start| token >= start)
        {
            return Self::how(how);
        }
        match started {
            None => UndoMark::NotRun,
            // `started:TOKEN` reads as started in `how`, as an earlier version's marks do.
            Some(mark) => Self::how(mark),
        }
    }

    fn token(digits: &[u8]) -> Option<u64> {
        std::str::from_utf8(digits).ok()?.parse().ok()
    }

    /// `TOKEN:HOW` into its token and `HOW`; an end mark that does not read so counts
    /// as none, and the start mark decides.
    fn split_end(mark: &[u8]) -> Option<(u64, &[u8])> {
        let colon = mark.iter().position(|&byte| byte == b':')?;
        Some((Self::token(&mark[..colon])?, &mark[colon + 1..]))
    }

    fn how(how: &[u8]) -> Self {
        match how {
            MARK_DONE => UndoMark::Done,
            MARK_RETRY => UndoMark::Retry,
            bytes => match bytes.strip_prefix(MARK_FAILED) {
                Some(json) => UndoMark::Failed(
                    crate::driver::wire::from_json(json).unwrap_or(serde_json::Value::Null),
                ),
                // Started, or a mark this version does not know: never run it again.
                None => UndoMark::Started,
            },
        }
    }

    /// The start mark of an owner holding `token`.
    pub(crate) fn started(token: u64) -> Vec<u8> {
        let mut out = MARK_STARTED.to_vec();
        out.push(b':');
        out.extend_from_slice(token.to_string().as_bytes());
        out
    }

    /// The end mark an undo's result leaves under `token`; none for an outcome that is
    /// unknown (it may have taken effect: the start mark stands).
    pub(crate) fn ended(token: u64, result: &UndoResult) -> Option<Vec<u8>> {
        let how = match result {
            UndoResult::Done => MARK_DONE.to_vec(),
            UndoResult::NotYet => MARK_RETRY.to_vec(),
            UndoResult::Unknown => return None,
            UndoResult::Permanent(error) => {
                let mut out = MARK_FAILED.to_vec();
                // A serde_json::Value always serialises.
                out.extend_from_slice(&serde_json::to_vec(error).unwrap_or_default());
                out
            }
        };
        let mut out = token.to_string().into_bytes();
        out.push(b':');
        out.extend_from_slice(&how);
        Some(out)
    }
}

/// The saga checkpoint: the failure being compensated for (as the driver stores
/// failures, in plain bytes) and the steps that registered undos on the run that failed,
/// in the order they registered, so that a takeover whose own run of the work no longer
/// reaches some of them still accounts for every one.
const SAGA_V2: &[u8] = b"idem.saga/2\n";

pub(crate) fn encode_saga(steps: &[String], failure: &[u8]) -> Vec<u8> {
    // A list of strings always serialises.
    let list = serde_json::to_vec(steps).unwrap_or_default();
    let mut out = Vec::with_capacity(SAGA_V2.len() + 4 + list.len() + failure.len());
    out.extend_from_slice(SAGA_V2);
    out.extend_from_slice(&u32::try_from(list.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(&list);
    out.extend_from_slice(failure);
    out
}

/// The steps (`None` in a checkpoint of an earlier version, which kept only the
/// failure) and the failure's plain bytes.
pub(crate) fn decode_saga(stored: &[u8]) -> Result<(Option<Vec<String>>, &[u8]), crate::BoxError> {
    let Some(rest) = stored.strip_prefix(SAGA_V2) else {
        return Ok((None, stored));
    };
    let (len, rest) = rest
        .split_first_chunk::<4>()
        .ok_or("a saga checkpoint without its length")?;
    let len = u32::from_be_bytes(*len) as usize;
    if rest.len() < len {
        return Err("a saga checkpoint shorter than its length".into());
    }
    let (list, failure) = rest.split_at(len);
    Ok((Some(crate::driver::wire::from_json(list)?), failure))
}

/// The checkpoint an undo of `step` leaves when it starts: `idem.undo:STEP`, or for a
/// step name too long to fit beside the prefix, `idem.undo#` and the name's SHA-256
/// (still one name per step).
pub(crate) fn undo_checkpoint(step: &str) -> String {
    mark_name(UNDO_PREFIX, "idem.undo#", step)
}

/// The checkpoint an undo of `step` leaves when it ends: `idem.undone:STEP`, or
/// `idem.undone#` and the name's SHA-256, as [`undo_checkpoint`].
pub(crate) fn undone_checkpoint(step: &str) -> String {
    mark_name(UNDONE_PREFIX, "idem.undone#", step)
}

fn mark_name(prefix: &str, hashed: &str, step: &str) -> String {
    if prefix.len() + step.len() <= crate::key::MAX_PART_LEN {
        return format!("{prefix}{step}");
    }
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(step.as_bytes());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("{hashed}{hex}")
}

impl Context {
    /// [`Context::step`] that also registers how to undo the step: if a later step (or
    /// the work) fails with [`WorkError::Permanent`], the driver runs the registered
    /// undos in reverse order before storing the failure.
    ///
    /// - `undo` gets the step's value (as stored) and runs **at most once** per execution,
    ///   across takeovers: its checkpoint marks it started before it runs and ended after.
    ///   An undo whose end no owner saw (a crash mid-undo) is never run again: the final
    ///   [`Compensation`] lists it as [`interrupted`](Compensation::interrupted), for an
    ///   operator to check. Once started, an undo runs in a task of its own and ends even
    ///   if the caller drops `execute`.
    /// - The failure that started compensating is checkpointed first, with the names of
    ///   the steps that registered undos, so a takeover during compensation goes on
    ///   compensating, for every one of them: it runs the work again, whose checkpointed
    ///   steps replay (registering their undos) and whose first step without a checkpoint
    ///   stops it ([`InterruptedKind::Compensating`](crate::driver::InterruptedKind::Compensating)),
    ///   then it runs the undos not yet run. A listed step whose undo that run did not
    ///   register is waited for (the key stays held) when the run stopped early
    ///   (Retryable, Unknown), and reported [`pending`](Compensation::pending) when it
    ///   went as far as it goes: never skipped silently. Keep the work's path through its
    ///   steps deterministic, and every effect inside a step.
    /// - A failure that does not serialise, does not fit, or a step value that cannot be
    ///   stored ([`InterruptedKind::Unstorable`](crate::driver::InterruptedKind::Unstorable)) still
    ///   compensates; what is stored is the marker saying why, with what was undone. A
    ///   `step_with_undo` whose own value cannot be stored has no value to give its undo:
    ///   it is reported [`pending`](Compensation::pending).
    /// - The whole compensation (the saga checkpoint, every undo, the stored failure)
    ///   runs in a task of its own, with the lease renewed on the heartbeat's schedule: a
    ///   caller that drops `execute` once the work has failed stops none of it. Once the
    ///   caller left, the lease is renewed for one more lease only: an undo that never
    ///   returns lets the lease end, and a retry reports it interrupted.
    /// - An undo's permanent error too large for its checkpoint is recorded as failed
    ///   without the error (`null`): it stops the compensation all the same. A record
    ///   with no room left for the saga checkpoint undoes nothing and reports every step
    ///   pending, beside the marker saying why.
    /// - `undo` answers `Ok(())` when undone; [`WorkError::Permanent`] stops compensating
    ///   and is stored ([`Compensation::failed`]); [`WorkError::Retryable`] (nothing
    ///   happened) keeps the key held
    ///   ([`Error::CompensationPending`](crate::Error::CompensationPending)) until its
    ///   lease ends and a retry takes over to try again; [`WorkError::Unknown`] (it may
    ///   have taken effect) is never run again: it is reported
    ///   [`interrupted`](Compensation::interrupted) and the other undos go on.
    /// - [`WorkError::Unknown`] and [`WorkError::Retryable`] from the work never
    ///   compensate: the effect may yet happen, or the work runs again.
    ///
    /// ```
    /// use idem_core::{Fingerprint, Idempotency, Key, MemoryStore, Outcome, WorkError, WorkResult};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let key = Key::new("acct_42/orders.place", "order-7")?;
    /// let outcome = idem
    ///     .execute(&key, Fingerprint::of_bytes("order 7"), |ctx| async move {
    ///         let hold: String = ctx
    ///             .step_with_undo(
    ///                 "reserve",
    ///                 || async { WorkResult::<_, String>::Ok("hold_1".to_string()) },
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
        let (value, plain) = match self.step_plain(name, run).await {
            Ok(stored) => stored,
            // The step's effect happened but its value cannot be stored: its undo cannot
            // get that value, but the compensation must not read as complete without it.
            Err(WorkError::Interrupted(Interrupted(Reason::Unstorable(unstorable)))) => {
                self.register_undo(Undo {
                    step: name.to_owned(),
                    run: None,
                });
                return Err(Interrupted(Reason::Unstorable(unstorable)).into());
            }
            Err(other) => return Err(other),
        };
        // The undo gets its own copy, decoded from the same stored bytes.
        let for_undo: T = crate::driver::wire::from_json(&plain).map_err(|source| {
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
                    Err(WorkError::Unknown(_)) => UndoResult::Unknown,
                    Err(_) => UndoResult::NotYet,
                }
            })
        });
        self.register_undo(Undo {
            step: name.to_owned(),
            run: Some(run),
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
        assert_eq!(undone_checkpoint("charge"), "idem.undone:charge");
        // The longest name that fits beside the prefix is kept as it is.
        let fits = "s".repeat(crate::key::MAX_PART_LEN - UNDONE_PREFIX.len());
        assert_eq!(undone_checkpoint(&fits), format!("{UNDONE_PREFIX}{fits}"));
        let long = "s".repeat(crate::key::MAX_PART_LEN);
        let other = format!("{}t", "s".repeat(crate::key::MAX_PART_LEN - 1));
        for name in [&long, &other] {
            assert!(crate::key::StepName::new(undo_checkpoint(name)).is_ok());
            assert!(crate::key::StepName::new(undone_checkpoint(name)).is_ok());
            assert_ne!(undo_checkpoint(name), undone_checkpoint(name));
        }
        assert_ne!(undo_checkpoint(&long), undo_checkpoint(&other));
        assert_ne!(undone_checkpoint(&long), undone_checkpoint(&other));
    }

    #[test]
    fn saga_checkpoints_and_undo_marks_round_trip() {
        let steps = vec!["reserve".to_string(), "charge".to_string()];
        let stored = encode_saga(&steps, b"\x00\xffthe failure");
        let (read, failure) = decode_saga(&stored).unwrap();
        assert_eq!(read, Some(steps.clone()));
        assert_eq!(failure, b"\x00\xffthe failure");
        // A failure of no bytes: the list ends the checkpoint.
        let stored = encode_saga(&steps, b"");
        assert_eq!(
            decode_saga(&stored).unwrap(),
            (Some(steps.clone()), &b""[..])
        );
        // An earlier version's checkpoint: the failure alone.
        assert_eq!(
            decode_saga(b"{\"e\":1}").unwrap(),
            (None, &b"{\"e\":1}"[..])
        );
        assert!(decode_saga(b"idem.saga/2\n\x00\x00\x00\x09[]").is_err());
        assert!(decode_saga(b"idem.saga/2\n\x00").is_err());

        let started = UndoMark::started(5);
        for result in [
            UndoResult::Done,
            UndoResult::NotYet,
            UndoResult::Unknown,
            UndoResult::Permanent(serde_json::json!({"code": 7})),
        ] {
            let ended = UndoMark::ended(5, &result);
            let mark = UndoMark::read(Some(&started), ended.as_deref());
            let expected = match result {
                UndoResult::Done => UndoMark::Done,
                UndoResult::NotYet => UndoMark::Retry,
                UndoResult::Permanent(error) => UndoMark::Failed(error),
                UndoResult::Unknown => UndoMark::Started,
            };
            assert_eq!(mark, expected);
        }
        assert_eq!(UndoMark::read(None, None), UndoMark::NotRun);
        assert_eq!(UndoMark::read(Some(&started), None), UndoMark::Started);
        assert_eq!(
            UndoMark::read(Some(b"started:from the future"), Some(b"5:true")),
            UndoMark::Started,
            "a start mark whose token does not read is later than any end"
        );
        assert_eq!(
            UndoMark::read(Some(&started), Some(b"not an end mark")),
            UndoMark::Started
        );
        assert_eq!(
            UndoMark::read(Some(&started), Some(b"5:from the future")),
            UndoMark::Started
        );
    }

    #[test]
    fn undo_marks_only_move_forward() {
        let retry = UndoMark::ended(5, &UndoResult::NotYet);
        // A run at token 5 ended `retry`; a delayed copy of its own start mark changes
        // nothing.
        assert_eq!(
            UndoMark::read(Some(&UndoMark::started(5)), retry.as_deref()),
            UndoMark::Retry
        );
        // A later owner (token 7) started it again and was never seen to end: the earlier
        // `retry` is stale, and the undo is never run a third time.
        assert_eq!(
            UndoMark::read(Some(&UndoMark::started(7)), retry.as_deref()),
            UndoMark::Started
        );
        let done = UndoMark::ended(7, &UndoResult::Done);
        assert_eq!(
            UndoMark::read(Some(&UndoMark::started(7)), done.as_deref()),
            UndoMark::Done
        );
    }

    #[test]
    fn marks_of_an_earlier_version_still_read() {
        assert_eq!(UndoMark::read(Some(b"started"), None), UndoMark::Started);
        assert_eq!(UndoMark::read(Some(b"true"), None), UndoMark::Done);
        assert_eq!(UndoMark::read(Some(b"retry"), None), UndoMark::Retry);
        assert_eq!(
            UndoMark::read(Some(b"failed:{\"code\":7}"), None),
            UndoMark::Failed(serde_json::json!({"code": 7}))
        );
        assert_eq!(
            UndoMark::read(Some(b"from the future"), None),
            UndoMark::Started
        );
        // An end mark of this version is later than any of them.
        let done = UndoMark::ended(3, &UndoResult::Done);
        assert_eq!(
            UndoMark::read(Some(b"retry"), done.as_deref()),
            UndoMark::Done
        );
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
            interrupted: vec!["c".into()],
        };
        let text = serde_json::to_string(&full).unwrap();
        assert_eq!(serde_json::from_str::<Compensation>(&text).unwrap(), full);
        let done: Compensation = serde_json::from_str(r#"{"undone":["b","a"]}"#).unwrap();
        assert!(done.is_complete());
        assert!(!full.is_complete());
    }
}
