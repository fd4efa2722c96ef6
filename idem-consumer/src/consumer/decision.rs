//! What a delivery comes to: the work run under its key, its answer read as the settle
//! table in [`Consumer`]'s docs says, the attempt limit, and the broker told.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use idem_core::codec::CodecError;
use idem_core::key::{KeyError, KeyPart};
use idem_core::{Context, Error, Fingerprint, Outcome, Store, WorkError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Consumer, UNREADABLE_AFTER};
use crate::deadline::WorkDeadline;
use crate::{Cause, DeadLetterReason, Message, SettleError, Settled};

/// What a delivery comes to before the broker is told.
pub(super) enum Decision<T, E> {
    Ack {
        value: T,
        replayed: bool,
    },
    Nak {
        delay: Duration,
        cause: Cause<E>,
    },
    DeadLetter {
        reason: DeadLetterReason,
        cause: Cause<E>,
    },
}

impl<S: Store + ?Sized + 'static> Consumer<S> {
    /// What a delivery comes to, a panic anywhere in the user's code (the key and
    /// fingerprint functions, the work) included.
    pub(super) async fn decide<M, T, E, F, Fut>(&self, message: &M, work: F) -> Decision<T, E>
    where
        M: Message + ?Sized,
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: FnOnce(Context, Bytes) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let decided = AssertUnwindSafe(self.decide_unguarded(message, work))
            .catch_unwind()
            .await;
        decided.unwrap_or_else(|_panic| {
            // A panic in the work leaves `execute` dropped mid-work: the lease is kept, so
            // a redelivery takes over once it ends.
            tracing::error!(
                "idem-consumer: the work (or a key or fingerprint function) panicked; the message is delivered again once the lease ends"
            );
            self.limit_attempts(
                Decision::Nak {
                    delay: self.idem.lease(),
                    cause: Cause::Panicked,
                },
                message.delivery_count(),
            )
        })
    }

    async fn decide_unguarded<M, T, E, F, Fut>(&self, message: &M, work: F) -> Decision<T, E>
    where
        M: Message + ?Sized,
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: FnOnce(Context, Bytes) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let key = match self.key_of(message) {
            Ok(key) => key,
            Err(Cause::BadKey(err)) if key_part(&err) == Some(KeyPart::Scope) => {
                // The consumer's scope, not the message, is at fault: fixing the setting
                // must find the message still there.
                tracing::error!(error = %err, "idem-consumer: the scope is not a valid idem scope; fix the consumer's source or scope setting");
                return Decision::Nak {
                    delay: self.backoff.delay(message.delivery_count()),
                    cause: Cause::BadKey(err),
                };
            }
            Err(Cause::BadKey(err)) => {
                return Decision::DeadLetter {
                    reason: DeadLetterReason::BadKey,
                    cause: Cause::BadKey(err),
                };
            }
            Err(_) => {
                return Decision::DeadLetter {
                    reason: DeadLetterReason::NoKey,
                    cause: Cause::NoKey,
                };
            }
        };
        let payload = message.payload();
        let fingerprint = match &self.fingerprint {
            Some(fingerprint) => fingerprint(payload),
            None => Fingerprint::of_bytes(payload),
        };
        let payload = payload.clone();
        // The limit runs from the work's start to its end only: the store calls before
        // and after it (the claim, the result's write) always finish, so a slow store is
        // never taken for a hung work, and a result the work returned is always stored.
        let deadline = WorkDeadline::default();
        let run = self
            .idem
            .execute(&key, fingerprint, |ctx| deadline.wrap(work(ctx, payload)));
        let decision = tokio::select! {
            biased;
            answer = run => self.decision(answer, message.delivery_count()),
            limit = deadline.expired(self.work_timeout) => {
                // `execute` dropped mid-work: the lease is kept, so a redelivery takes
                // over once it ends.
                let cause = Cause::TimedOut { limit };
                tracing::warn!(key = %key.short_hash(), error = %cause, "idem-consumer: stopped a delivery's work; the message is delivered again once the lease ends");
                Decision::Nak {
                    delay: self.idem.lease(),
                    cause,
                }
            }
        };
        let decision = self.limit_attempts(decision, message.delivery_count());
        match &decision {
            Decision::DeadLetter { reason, .. } => {
                tracing::warn!(key = %key.short_hash(), %reason, "idem-consumer: dead-lettering a message");
            }
            // Naks that no redelivery of the message itself will cure: say so.
            Decision::Nak {
                cause:
                    Cause::Idem(
                        err @ (Error::Store(_)
                        | Error::Interrupted(_)
                        | Error::CompensationPending { .. }
                        | Error::Codec { .. }),
                    ),
                delay,
            } => {
                tracing::warn!(key = %key.short_hash(), error = %err, ?delay, "idem-consumer: redelivering a message after a failure on the consumer's side");
            }
            _ => {}
        }
        decision
    }

    /// The table in [`Consumer`]'s docs.
    fn decision<T, E>(
        &self,
        answer: Result<Outcome<T, E>, Error>,
        delivered: Option<u64>,
    ) -> Decision<T, E> {
        let backoff = self.backoff.delay(delivered);
        let lease = self.idem.lease();
        let nak = |delay, cause| Decision::Nak { delay, cause };
        let dead = |reason, cause| Decision::DeadLetter { reason, cause };
        match answer {
            Ok(Outcome::Completed { value, replayed }) => Decision::Ack { value, replayed },
            Ok(Outcome::Failed { error, .. }) | Ok(Outcome::Compensated { error, .. }) => {
                dead(DeadLetterReason::Failed, Cause::Work(error))
            }
            Ok(Outcome::Retryable(error)) => nak(backoff, Cause::Work(error)),
            Ok(Outcome::Unknown(error)) => nak(lease, Cause::Work(error)),
            // A kind of outcome this version does not know: the safe side is to leave the
            // message to the broker until the lease ends.
            Ok(_) => nak(lease, Cause::Unrecognised),
            Err(err) => match &err {
                Error::InFlight { retry_after } | Error::KeyBudgetExhausted { retry_after } => nak(
                    (*retry_after).max(Duration::from_millis(1)),
                    Cause::Idem(err),
                ),
                Error::CompensationPending { .. } | Error::Interrupted(_) => {
                    nak(lease, Cause::Idem(err))
                }
                Error::Mismatch => dead(DeadLetterReason::KeyReused, Cause::Idem(err)),
                Error::KeyRefused(_) => dead(DeadLetterReason::KeyRefused, Cause::Idem(err)),
                Error::Unstorable { .. } => dead(DeadLetterReason::Unstorable, Cause::Idem(err)),
                // Altered or malformed bytes never read back, whoever reads them.
                Error::Codec {
                    source: CodecError::Unauthentic { .. } | CodecError::Malformed { .. },
                    ..
                } => dead(DeadLetterReason::Unreadable, Cause::Idem(err)),
                // A stored result that no longer decodes as its type. During a rolling
                // deploy a replica of the other release can read it: wait a lease, a few
                // deliveries. After that the type changed for good, and naking would only
                // repeat this until the record expires and the work runs again.
                Error::Decode(_)
                    if delivered.is_some_and(|delivered| delivered < UNREADABLE_AFTER) =>
                {
                    nak(lease, Cause::Idem(err))
                }
                Error::Decode(_) => dead(DeadLetterReason::Unreadable, Cause::Idem(err)),
                // A key id this process lacks (a rotation half rolled out), no randomness:
                // another consumer, or this one later, can read it. Half-done work under
                // it must not be dropped.
                Error::Codec { .. } => nak(lease, Cause::Idem(err)),
                // The store failing, a lost lease: the message waits for a redelivery,
                // never the dead-letter path for a failure of our own.
                _ if err.is_retryable() || matches!(err, Error::Store(_)) => {
                    nak(backoff, Cause::Idem(err))
                }
                // An error this version does not know: the safe side, as for outcomes.
                _ => nak(lease, Cause::Idem(err)),
            },
        }
    }

    /// The wait after the `failures`th failure in a row of the consumer's own side.
    pub(crate) fn retry_delay(&self, failures: u64) -> Duration {
        self.backoff.delay(Some(failures))
    }

    /// A nak for the work's own failure on the last allowed delivery becomes a dead letter.
    fn limit_attempts<T, E>(
        &self,
        decision: Decision<T, E>,
        delivered: Option<u64>,
    ) -> Decision<T, E> {
        let (Some(limit), Some(delivered)) = (self.max_attempts, delivered) else {
            return decision;
        };
        match decision {
            Decision::Nak { cause, .. }
                if delivered >= limit.get()
                    && matches!(
                        cause,
                        Cause::Work(_) | Cause::TimedOut { .. } | Cause::Panicked
                    ) =>
            {
                Decision::DeadLetter {
                    reason: DeadLetterReason::AttemptsExhausted,
                    cause,
                }
            }
            decision => decision,
        }
    }

    pub(super) async fn settle<M: Message + ?Sized, T, E>(
        &self,
        message: &M,
        decision: Decision<T, E>,
    ) -> Result<Settled<T, E>, SettleError> {
        Ok(match decision {
            Decision::Ack { value, replayed } => {
                message.ack().await?;
                Settled::Acked { value, replayed }
            }
            Decision::Nak { delay, cause } => {
                message.nak(delay).await?;
                Settled::Retried { delay, cause }
            }
            Decision::DeadLetter { reason, cause } => {
                message.dead_letter(reason).await?;
                Settled::DeadLettered { reason, cause }
            }
        })
    }
}

/// Which part of a key a [`KeyError`] is about.
fn key_part(err: &KeyError) -> Option<KeyPart> {
    match err {
        KeyError::Empty { part }
        | KeyError::TooLong { part, .. }
        | KeyError::Reserved { part, .. }
        | KeyError::ControlCharacter { part, .. } => Some(*part),
        _ => None,
    }
}
