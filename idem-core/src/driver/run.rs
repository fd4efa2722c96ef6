//! One execution: check the key, charge the budget, claim, run the work beside its
//! heartbeat, and hand its result to what stores it.

use std::future::Future;
use std::sync::Arc;

use super::claim::{Claim, Won};
use super::error::{Interrupted, Reason};
use super::finish::{answer_failure, cannot_write};
use super::wire::{Marker, StoredFailure, Wire};
use super::{
    Context, Error, Idempotency, KeyBudget, Limits, Outcome, WorkError, durable, heartbeat,
    observe, retry_store,
};
use crate::record::ValuePart;
use crate::store::Operation;
use crate::{Fingerprint, Key, Store};

impl<S: Store + ?Sized + 'static> Idempotency<S> {
    pub(super) async fn run<W, F, Fut>(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        work: F,
    ) -> Result<Outcome<W::Value, W::Failure>, Error>
    where
        W: Wire,
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<W::Value, WorkError<W::Failure>>>,
    {
        self.settings
            .key_policy
            .check(key.key())
            .map_err(Error::KeyRefused)?;
        let charged = self.charge_budget(key).await?;
        let claim = self.claim(key, fingerprint).await;
        let new_key = matches!(&claim, Ok(Claim::Won(won)) if !won.resumed);
        if new_key {
            observe::count_scoped(observe::NEW_KEYS, self.scope_label(key));
        } else if let Some(budget) = charged {
            budget.give_back(key.scope());
        }
        match claim? {
            // Boxed: the execution's state (the context, the work's future, the writes
            // after it) is then allocated only for a won claim, and the future a replay
            // allocates and copies holds the claim's state alone.
            Claim::Won(won) => {
                Box::pin(self.run_won::<W, F, Fut>(key, fingerprint, work, won)).await
            }
            Claim::Replay(response) => {
                observe::count(observe::REPLAYS);
                // The stored bytes whole, as the codec left them, are decoded from the
                // store's own buffer, given up, rather than a copy of it; a part of them
                // (a codec that strips a frame) is copied.
                let decoded = match self.decode(key, &fingerprint, ValuePart::Result, &response)? {
                    std::borrow::Cow::Owned(plain) => Some(plain),
                    std::borrow::Cow::Borrowed(plain)
                        if std::ptr::eq(plain.as_ptr(), response.as_ptr())
                            && plain.len() == response.len() =>
                    {
                        None
                    }
                    std::borrow::Cow::Borrowed(plain) => Some(plain.to_vec()),
                };
                let value =
                    W::decode_value_owned(decoded.unwrap_or(response)).map_err(Error::Decode)?;
                Ok(Outcome::Completed {
                    value,
                    replayed: true,
                })
            }
            Claim::ReplayFailure(response) => {
                observe::count(observe::REPLAYS);
                let plain = self.decode(key, &fingerprint, ValuePart::Failure, &response)?;
                let stored = W::decode_failure(&plain).map_err(Error::Decode)?;
                answer_failure(stored, true, None)
            }
        }
    }

    /// The execution once its claim is won: the work beside its heartbeat, then what
    /// stores its result.
    async fn run_won<W, F, Fut>(
        &self,
        key: &Key,
        fingerprint: Fingerprint,
        work: F,
        won: Won,
    ) -> Result<Outcome<W::Value, W::Failure>, Error>
    where
        W: Wire,
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<W::Value, WorkError<W::Failure>>>,
    {
        let Won {
            lease,
            deadline,
            settled: started,
            resumed,
            steps,
        } = won;
        let store = Arc::clone(&self.shared);
        let limits = self.limits();
        let codec = Arc::clone(&self.settings.codec);
        let context = Context::new(
            store,
            lease,
            deadline,
            self.settings.lease,
            fingerprint,
            resumed,
            steps,
            limits,
            codec,
            self.settings.store_timeout,
            self.settings.jitter.clone(),
            W::SERDE,
        );
        let every = self.settings.heartbeat.interval(self.settings.lease);
        // Boxed: the work's future (a whole handler, for idem-http) would otherwise be
        // part of this one, copied with it at every move and allocated even for replays.
        let work = Box::pin(work(context.clone()));
        let result = heartbeat::run(work, &context, every, self.settings.lease).await;
        observe::work_duration(started.elapsed());
        // An earlier owner started compensating: the failure is decided; finish undoing,
        // unless this run cannot write any more.
        if context.is_compensating() && !cannot_write(&result) {
            // The run went through the work as far as it goes (to the first step without
            // a checkpoint, or its end): every undo it did not register, it never will.
            let whole = matches!(
                result,
                Ok(_)
                    | Err(WorkError::Permanent(_))
                    | Err(WorkError::Interrupted(Interrupted(Reason::Compensating)))
            );
            drop(result);
            return Box::pin(self.compensate::<W>(&context, None, whole, every)).await;
        }
        // Every path but the completion is boxed: their futures would otherwise make
        // this one (and every future awaiting it) as large as the largest of them.
        match result {
            Err(WorkError::Permanent(error)) if context.has_undos() => {
                let failure = StoredFailure::Work(error);
                Box::pin(self.compensate::<W>(&context, Some(failure), true, every)).await
            }
            Ok(value) => self.complete::<W>(&context, value).await,
            Err(WorkError::Permanent(error)) => {
                Box::pin(self.fail::<W>(&context, StoredFailure::Work(error), None)).await
            }
            Err(WorkError::Retryable(error)) => {
                // A release of a record with no step ends its lifetime, and the next
                // lifetime derives other keys: one the work already sent elsewhere would
                // not be sent again. A checkpoint first keeps the record (and its keys) for
                // the retry; if it cannot be written, the lease is left to run out.
                if context.derived_without_steps() {
                    let marked = match super::error::step_name(super::saga::DERIVED_STEP) {
                        Ok(step) => Box::pin(context.checkpoint_own(&step, b"")).await.is_ok(),
                        Err(_) => false,
                    };
                    if !marked {
                        tracing::warn!(
                            "could not keep the derived keys' record; the lease will expire"
                        );
                        return Ok(Outcome::Retryable(error));
                    }
                }
                // Best effort, bounded like every store call (no lease deadline: a
                // release that fails just lets the lease run out).
                let release = durable::write(
                    Arc::clone(&self.shared),
                    context.lease(),
                    durable::Write::Release,
                    self.settings.store_timeout,
                    None,
                    self.settings.jitter.clone(),
                );
                if let Err(err) = Box::pin(release).await {
                    tracing::warn!(error = %err, "could not release the lease; it will expire");
                }
                Ok(Outcome::Retryable(error))
            }
            Err(WorkError::Unknown(error)) => Ok(Outcome::Unknown(error)),
            Err(WorkError::Interrupted(Interrupted(reason))) => match reason {
                Reason::LeaseLost => Err(Error::LeaseLost),
                Reason::Store(err) => Err(Error::Store(err)),
                Reason::Codec { what, source } => Err(Error::Codec {
                    key: key.short_hash(),
                    what,
                    source,
                }),
                Reason::Unstorable(unstorable) => {
                    // A permanent failure of the execution like any other: steps done
                    // before it are undone.
                    let marker = StoredFailure::Marker(Marker::from_unstorable(unstorable));
                    if context.has_undos() {
                        Box::pin(self.compensate::<W>(&context, Some(marker), true, every)).await
                    } else {
                        Box::pin(self.fail::<W>(&context, marker, None)).await
                    }
                }
                other => Err(Error::Interrupted(Interrupted(other))),
            },
        }
    }

    /// Takes a new key from the scope's budget. Out of budget, a key that already has a
    /// record goes ahead uncharged; a new one is refused.
    async fn charge_budget(&self, key: &Key) -> Result<Option<&Arc<dyn KeyBudget>>, Error> {
        let Some(budget) = &self.settings.budget else {
            return Ok(None);
        };
        match budget.take(key.scope()) {
            Ok(()) => Ok(Some(budget)),
            Err(retry_after) => {
                let timeout = self.settings.store_timeout;
                let jitter = &self.settings.jitter;
                let get = retry_store(Operation::Get, timeout, None, jitter, || {
                    self.store.get(key)
                });
                if Box::pin(get).await?.is_some() {
                    return Ok(None);
                }
                observe::count_scoped(observe::KEY_BUDGET_REJECTIONS, self.scope_label(key));
                Err(Error::KeyBudgetExhausted { retry_after })
            }
        }
    }

    fn scope_label(&self, key: &Key) -> Option<String> {
        let label = self.settings.scope_label.as_ref()?;
        Some((label.0)(key.scope()))
    }

    pub(super) fn limits(&self) -> Limits {
        Limits {
            response_cap: self.settings.max_response_bytes,
            record: self.store.max_record_bytes(),
        }
    }
}
