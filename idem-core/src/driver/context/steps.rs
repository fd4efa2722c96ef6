//! Steps: run once across retries and takeovers, their checkpoints, and the undos they
//! register.

use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Context, lock};
use crate::driver::durable::Write;
use crate::driver::error::{CannotStore, Interrupted, Reason, WorkError};
use crate::driver::observe;
use crate::driver::saga::{self, Undo};
use crate::driver::{MARKER_RESERVE, OWN_RESERVE};
use crate::record::ValuePart;
use crate::{StoreError, key::StepName, store::WriteOutcome};

impl Context {
    /// Runs the step `name` once across retries and takeovers, unless the process dies
    /// between the step's effect and its checkpoint.
    ///
    /// - A checkpoint for `name` exists (written by this run or an earlier owner): returns
    ///   its stored value; `run` does not run.
    /// - Otherwise runs `run`, checkpoints its value (fenced by the lease, retried like
    ///   every store write, and finished in a task of its own if the caller drops
    ///   `execute` meanwhile) and
    ///   returns the value as stored, decoded: exactly what a takeover will read.
    /// - At least once, not exactly once, where nothing can know: if the process crashes
    ///   (or `execute` is dropped) while `run` runs, or after it and before its
    ///   checkpoint is stored, a takeover runs `run` again. Make the step's effect
    ///   idempotent downstream with a key from [`Context::derive`], so the second run is
    ///   answered, not repeated.
    /// - `run` fails: its error is returned and nothing is checkpointed.
    /// - The checkpoint is fenced (another attempt took over): the lease is lost, and
    ///   [`WorkError::Interrupted`] says so; the other owner will run this step again, so
    ///   make the step's own effect idempotent downstream (see [`Context::derive`]).
    /// - The value does not serialise, does not read back as `T`, or does not fit in the
    ///   record: interrupted, and the driver stores that as the execution's permanent
    ///   failure ([`Error::Unstorable`](crate::Error::Unstorable) naming the step), since
    ///   the step's effect
    ///   happened and must not happen again.
    /// - A stored value that no longer decodes as `T` (its type changed): interrupted, with
    ///   an error naming the step. Give a step whose type changes a new name
    ///   (`"charge.v2"`): records written before keep theirs.
    ///
    /// Use `?` on the result inside the work.
    ///
    /// # Errors
    /// `run`'s error, or [`WorkError::Interrupted`].
    pub async fn step<T, E, F, Fut>(&self, name: &str, run: F) -> Result<T, WorkError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        Ok(self.step_plain(name, run).await?.0)
    }

    /// [`Context::step`], also answering the value's plain stored bytes.
    pub(crate) async fn step_plain<T, E, F, Fut>(
        &self,
        name: &str,
        run: F,
    ) -> Result<(T, Vec<u8>), WorkError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let step = StepName::new(name).map_err(|err| Interrupted(Reason::InvalidStepName(err)))?;
        if name.starts_with(saga::RESERVED_PREFIX) {
            return Err(
                Interrupted(Reason::InvalidStepName(crate::key::KeyError::Reserved {
                    part: crate::key::KeyPart::Step,
                    prefix: saga::RESERVED_PREFIX,
                }))
                .into(),
            );
        }
        if let Some(plain) = self.checkpointed(name)? {
            let value = crate::driver::wire::from_json(&plain).map_err(|source| {
                Interrupted(Reason::StepUndecodable {
                    step: name.to_owned(),
                    source: source.into(),
                })
            })?;
            return Ok((value, plain));
        }
        if self.inner.compensating {
            return Err(saga::compensating().into());
        }
        if self.is_lease_lost() {
            return Err(Interrupted::lease_lost().into());
        }
        let value = run().await?;
        let unserializable = || {
            Interrupted(Reason::Unstorable(CannotStore::Unserializable {
                what: ValuePart::Step(name.to_owned()),
            }))
        };
        let plain = serde_json::to_vec(&value).map_err(|_| unserializable())?;
        let value: T = crate::driver::wire::from_json(&plain).map_err(|_| unserializable())?;
        self.checkpoint(&step, &plain).await?;
        Ok((value, plain))
    }

    /// The plain bytes of the checkpoint `name`, if there is one.
    pub(crate) fn checkpointed(&self, name: &str) -> Result<Option<Vec<u8>>, Interrupted> {
        let steps = lock(&self.inner.steps);
        steps
            .get(name)
            .map(|stored| {
                self.decode(ValuePart::Step(name.to_owned()), stored)
                    .map(std::borrow::Cow::into_owned)
            })
            .transpose()
    }

    /// Checkpoints `plain` as the value of `step`: encoded, size-checked, fenced and
    /// retried like every store write.
    pub(crate) async fn checkpoint(
        &self,
        step: &StepName,
        plain: &[u8],
    ) -> Result<(), Interrupted> {
        self.checkpoint_within(step, plain, MARKER_RESERVE).await
    }

    /// [`Context::checkpoint`] for idem's own checkpoints (the saga's, the undos' marks),
    /// which may use most of the room kept for the failure marker: a record the work's
    /// steps filled still records what to undo.
    pub(crate) async fn checkpoint_own(
        &self,
        step: &StepName,
        plain: &[u8],
    ) -> Result<(), Interrupted> {
        self.checkpoint_within(step, plain, OWN_RESERVE).await
    }

    async fn checkpoint_within(
        &self,
        step: &StepName,
        plain: &[u8],
        reserve: usize,
    ) -> Result<(), Interrupted> {
        let name = step.as_str();
        let bytes = self.encode(ValuePart::Step(name.to_owned()), plain.to_vec())?;
        let size = name.len() + bytes.len();
        let room = self.inner.limits.room(self.steps_size(), reserve);
        if size > room {
            return Err(too_large(name, size, room));
        }
        let write = Write::Checkpoint(step.clone(), bytes.clone());
        match self.durable(write).await {
            Ok(WriteOutcome::Applied) => {
                lock(&self.inner.steps).insert(name.to_owned(), bytes);
                Ok(())
            }
            Ok(WriteOutcome::Fenced) => {
                observe::count(observe::FENCED_WRITES);
                self.mark_lost();
                Err(Interrupted::lease_lost())
            }
            Err(StoreError::TooLarge { size, limit, .. }) => Err(too_large(name, size, limit)),
            Err(err) => Err(Interrupted(Reason::Store(err))),
        }
    }

    /// True when an earlier owner started compensating this execution.
    pub(crate) fn is_compensating(&self) -> bool {
        self.inner.compensating
    }

    pub(crate) fn register_undo(&self, undo: Undo) {
        lock(&self.inner.undos).push(undo);
    }

    /// The undos registered so far, in the order their steps finished.
    pub(crate) fn take_undos(&self) -> Vec<Undo> {
        std::mem::take(&mut *lock(&self.inner.undos))
    }

    /// True when some step registered an undo.
    pub(crate) fn has_undos(&self) -> bool {
        !lock(&self.inner.undos).is_empty()
    }
}

fn too_large(step: &str, size: usize, limit: usize) -> Interrupted {
    Interrupted(Reason::Unstorable(CannotStore::StepTooLarge {
        step: step.to_owned(),
        size,
        limit,
    }))
}
