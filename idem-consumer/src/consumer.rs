//! [`Consumer`]: one message, one key, the effect once, the broker told what happened.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::num::{NonZeroU64, NonZeroUsize};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use idem_core::codec::CodecError;
use idem_core::key::{KeyError, KeyPart};
use idem_core::{Context, Error, Fingerprint, Idempotency, Key, Outcome, Store, WorkError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;
use tracing::Instrument;

use crate::deadline::WorkDeadline;
use crate::{Backoff, Cause, DeadLetterReason, Message, SettleError, Settled};

type KeyFn = dyn Fn(&[u8]) -> Option<String> + Send + Sync;
type FingerprintFn = dyn Fn(&[u8]) -> Fingerprint + Send + Sync;

/// The delivery on which a stored result that does not decode as its type is
/// dead-lettered; the deliveries before it are nak'd for a lease, so that a replica of
/// another release (a rolling deploy) can take them.
pub const UNREADABLE_AFTER: u64 = 3;

/// The default bound on a batch's messages in flight at once.
pub const DEFAULT_CONCURRENCY: NonZeroUsize = NonZeroUsize::new(16).unwrap();

/// Handles each delivery of a message under one idempotency key, and settles it with the
/// broker only once its answer is stored.
///
/// Each delivery is keyed by the message's id (or a function of its payload), scoped by
/// its source (stream or queue), and fingerprinted by its payload. The work runs through
/// [`Idempotency::execute`]: once per key, whatever the redeliveries, and its result is
/// stored before the message is acknowledged. How each answer is settled:
///
/// | answer | settled |
/// |---|---|
/// | completed, now or before | ack |
/// | failed permanently, now or before | dead letter (`failed`) |
/// | retryable failure | nak after the [`Backoff`] |
/// | effect unknown, interrupted, compensation pending | nak after the lease, when a redelivery can take over |
/// | another delivery in flight | nak after its `retry_after` (or a wait, with [`InFlightPolicy::Wait`](idem_core::InFlightPolicy::Wait) on the driver) |
/// | key reused for another payload | dead letter (`key-reused`) |
/// | no key, an invalid key, a refused key | dead letter (`no-key`, `bad-key`, `key-refused`) |
/// | an invalid scope (the consumer's setting, not the message's fault) | nak after the backoff, logged as an error |
/// | unstorable result; a stored answer altered or malformed | dead letter (`unstorable`, `unreadable`): the work ran before and never runs again |
/// | a stored answer of a type this release cannot read | nak after the lease before the [`UNREADABLE_AFTER`]th delivery (a replica of another release may read it), then dead letter (`unreadable`); a broker that does not count deliveries dead-letters a redelivery |
/// | a stored answer sealed under a codec key id this process lacks (a rotation half rolled out) | nak after the lease |
/// | the store failed, the lease was lost | nak after the backoff |
/// | the key budget ran out | nak after the budget's `retry_after` |
/// | the work took longer than the [`work_timeout`](Consumer::work_timeout), or panicked (the work, or the key or fingerprint function; under `panic = "abort"` the process ends instead) | nak after the lease (the lease is kept, so the redelivery takes over then) |
/// | a retryable, unknown, timed-out or panicked attempt on the [`max_attempts`](Consumer::max_attempts)th delivery | dead letter (`attempts-exhausted`) |
///
/// Only answers that redelivery cannot change go to the dead-letter path; a failure of the
/// consumer's own side (store, codec keys, configuration) is always a nak, and logged.
/// Brokers stop redelivering after a limit of their own (JetStream `max_deliver`, a
/// quorum queue's `x-delivery-limit`): leave those unlimited, or above what a store outage
/// can take, so that our own failure never drops a message.
///
/// A crash anywhere loses nothing: before the result is stored, the redelivery takes over
/// once the lease ends (resuming through [`Context::step`] checkpoints); after, it replays
/// the result and acks.
///
/// ```
/// use bytes::Bytes;
/// use idem_consumer::{Consumer, DeadLetterReason, Message, SettleError};
/// use idem_core::{Idempotency, MemoryStore, done};
/// # use std::time::Duration;
/// # struct Delivery(Bytes);
/// # #[async_trait::async_trait]
/// # impl Message for Delivery {
/// #     fn id(&self) -> Option<&str> { Some("msg-1") }
/// #     fn source(&self) -> &str { "payments" }
/// #     fn payload(&self) -> &Bytes { &self.0 }
/// #     async fn ack(&self) -> Result<(), SettleError> { Ok(()) }
/// #     async fn nak(&self, _: Duration) -> Result<(), SettleError> { Ok(()) }
/// #     async fn dead_letter(&self, _: DeadLetterReason) -> Result<(), SettleError> { Ok(()) }
/// # }
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
/// let delivery = Delivery(Bytes::from_static(b"{\"cents\":500}"));
/// // Redelivered: the second time the work does not run, and the message is acked.
/// for _ in 0..2 {
///     let settled = consumer
///         .handle(&delivery, |_ctx, payload| async move { done(payload.len()) })
///         .await?;
///     assert!(settled.is_acked());
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct Consumer<S: ?Sized = dyn Store> {
    idem: Idempotency<S>,
    key: KeySource,
    fingerprint: Option<Arc<FingerprintFn>>,
    scope: Option<String>,
    backoff: Backoff,
    concurrency: NonZeroUsize,
    max_attempts: Option<NonZeroU64>,
    work_timeout: Option<Duration>,
}

impl<S: ?Sized> Clone for Consumer<S> {
    fn clone(&self) -> Self {
        Self {
            idem: self.idem.clone(),
            key: self.key.clone(),
            fingerprint: self.fingerprint.clone(),
            scope: self.scope.clone(),
            backoff: self.backoff,
            concurrency: self.concurrency,
            max_attempts: self.max_attempts,
            work_timeout: self.work_timeout,
        }
    }
}

impl<S: ?Sized> fmt::Debug for Consumer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field(
                "key",
                &match &self.key {
                    KeySource::Id => "message id".to_owned(),
                    KeySource::Payload(_) => "payload".to_owned(),
                    KeySource::Header(name) => format!("header {name}"),
                },
            )
            .field("scope", &self.scope)
            .field("backoff", &self.backoff)
            .field("concurrency", &self.concurrency)
            .field("max_attempts", &self.max_attempts)
            .field("work_timeout", &self.work_timeout)
            .finish_non_exhaustive()
    }
}

/// Where a delivery's key comes from.
#[derive(Clone)]
enum KeySource {
    /// The message's id ([`Message::id`]).
    Id,
    /// A function of the payload.
    Payload(Arc<KeyFn>),
    /// A header ([`Message::header`]).
    Header(Arc<str>),
}

/// What a delivery comes to before the broker is told.
enum Decision<T, E> {
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
    /// A consumer keyed by message id, scoped by source, retrying with the default
    /// [`Backoff`] and running batches [`DEFAULT_CONCURRENCY`] at a time.
    pub fn new(idem: Idempotency<S>) -> Self {
        Self {
            idem,
            key: KeySource::Id,
            fingerprint: None,
            scope: None,
            backoff: Backoff::default(),
            concurrency: DEFAULT_CONCURRENCY,
            max_attempts: None,
            work_timeout: None,
        }
    }

    /// Keys messages by a function of their payload instead of their id: for publishers
    /// that set no id, or whose ids change across resends (an order number in the body,
    /// a webhook's event id). `None` dead-letters the message ([`DeadLetterReason::NoKey`]).
    ///
    /// ```
    /// # use idem_core::{Idempotency, MemoryStore};
    /// let consumer = idem_consumer::Consumer::new(Idempotency::new(MemoryStore::new()))
    ///     .key_from_payload(|payload| {
    ///         let event: serde_json::Value = serde_json::from_slice(payload).ok()?;
    ///         Some(event.get("event_id")?.as_str()?.to_owned())
    ///     });
    /// # let _ = consumer;
    /// ```
    pub fn key_from_payload(
        mut self,
        key: impl Fn(&[u8]) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.key = KeySource::Payload(Arc::new(key));
        self
    }

    /// Keys messages by a header their publisher sets (an `Idempotency-Key`, an event id)
    /// instead of their id ([`Message::header`]); a message without it is dead-lettered
    /// ([`DeadLetterReason::NoKey`]).
    ///
    /// ```
    /// # use idem_core::{Idempotency, MemoryStore};
    /// let consumer = idem_consumer::Consumer::new(Idempotency::new(MemoryStore::new()))
    ///     .key_from_header("Idempotency-Key");
    /// # let _ = consumer;
    /// ```
    pub fn key_from_header(mut self, name: impl Into<String>) -> Self {
        self.key = KeySource::Header(Arc::from(name.into()));
        self
    }

    /// Fingerprints messages by a function of their payload instead of its bytes, so that
    /// resends that differ only in what does not matter (a timestamp, field order) are the
    /// same message, not a reused key.
    pub fn fingerprint_with(
        mut self,
        fingerprint: impl Fn(&[u8]) -> Fingerprint + Send + Sync + 'static,
    ) -> Self {
        self.fingerprint = Some(Arc::new(fingerprint));
        self
    }

    /// One scope for every message instead of each message's source: for one logical
    /// consumer reading several queues or streams that carry the same messages.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// The delay before a retryable failure is delivered again.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How many messages of a batch run at once ([`Consumer::handle_batch`]).
    pub fn concurrency(mut self, concurrency: NonZeroUsize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// Dead-letters a message ([`DeadLetterReason::AttemptsExhausted`]) whose work failed
    /// retryably, with an unknown effect, past the [`work_timeout`](Consumer::work_timeout)
    /// or by a panic on its `max_attempts`th delivery or later, instead of asking for it
    /// again. The default is no limit.
    ///
    /// - Counts the broker's deliveries ([`Message::delivery_count`]), so a message the
    ///   broker does not count (a redelivery on a RabbitMQ classic queue) is never limited:
    ///   use a quorum queue. Deliveries answered "in flight" or nak'd for a failure of the
    ///   consumer's own side (the store, its configuration) count, but never dead-letter
    ///   a message themselves: only a failing attempt of the work does.
    /// - A work whose effect is unknown keeps its record held until its lease ends; a
    ///   dead letter re-driven later takes over from its checkpointed steps.
    ///
    /// ```
    /// # use idem_core::{Idempotency, MemoryStore};
    /// use std::num::NonZeroU64;
    /// let consumer = idem_consumer::Consumer::new(Idempotency::new(MemoryStore::new()))
    ///     .max_attempts(NonZeroU64::new(10).unwrap());
    /// # let _ = consumer;
    /// ```
    pub fn max_attempts(mut self, attempts: NonZeroU64) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// Stops a delivery's work that runs longer than `limit`, so a hung handler cannot
    /// hold a sequential consumer. The default is no limit.
    ///
    /// - The stopped work's lease is kept ([`Idempotency::execute`] dropped mid-work): the
    ///   message is nak'd until the lease ends ([`Cause::TimedOut`]), and the redelivery
    ///   then takes over, resuming at its checkpointed steps. Work that had returned still
    ///   has its answer stored.
    /// - The limit runs from the work's start to its end: the store calls before and
    ///   after it (the claim, the result's write) always finish, so a slow store is
    ///   never taken for a hung work, and a result the work returned is always stored.
    /// - Counts as a failed attempt for [`Consumer::max_attempts`].
    /// - Set one where the adapter marks deliveries in progress
    ///   ([`Message::progress_interval`]): the marks keep a hung work's message from
    ///   being delivered again, so only this limit ends it.
    /// - It stops work that awaits; work that blocks its thread stops everything on that
    ///   thread, this limit and the marks included.
    /// - A zero `limit` is taken as no limit.
    pub fn work_timeout(mut self, limit: Duration) -> Self {
        self.work_timeout = Some(limit).filter(|limit| !limit.is_zero());
        self
    }

    /// The driver.
    pub fn idempotency(&self) -> &Idempotency<S> {
        &self.idem
    }

    /// The key a delivery is handled under.
    ///
    /// # Errors
    /// [`Cause::NoKey`] or [`Cause::BadKey`].
    pub fn key_of<M: Message + ?Sized>(&self, message: &M) -> Result<Key, Cause<()>> {
        let key = match &self.key {
            KeySource::Id => message.id().map(str::to_owned),
            KeySource::Payload(key) => key(message.payload()),
            KeySource::Header(name) => message.header(name).map(str::to_owned),
        }
        .ok_or(Cause::NoKey)?;
        let scope = self.scope.as_deref().unwrap_or(message.source());
        Key::new(scope, key).map_err(Cause::BadKey)
    }

    /// Runs `work` for one delivery, at most once per key across all deliveries, and
    /// settles the delivery with the broker as the table above says.
    ///
    /// - `work` gets the driver's [`Context`] (steps, derived keys, the fencing token)
    ///   and the payload.
    /// - The delivery is settled exactly once, after the answer is stored.
    /// - Everything runs in an `idem_consumer.handle` span (info level) with the
    ///   message's source and delivery count, and the `trace_id` and `parent_span_id` of
    ///   a valid W3C `traceparent` header the publisher set.
    /// - Dropping the returned future while `work` runs settles nothing, and the lease is
    ///   kept. A crash is the same. JetStream redelivers once its `ack_wait` ends, and that
    ///   delivery takes over when the lease ends. RabbitMQ has no acknowledgement timeout:
    ///   the delivery stays unacknowledged until its channel closes, so drop the channel,
    ///   or end the process, when you abandon a delivery.
    ///
    /// # Errors
    /// [`SettleError`] when the broker did not take the settlement; what was stored stays
    /// stored, and the broker's redelivery is answered from it.
    pub async fn handle<M, T, E, F, Fut>(
        &self,
        message: &M,
        work: F,
    ) -> Result<Settled<T, E>, SettleError>
    where
        M: Message + ?Sized,
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: FnOnce(Context, Bytes) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let span = crate::trace::delivery_span(message);
        async {
            let decision = while_in_progress(message, self.decide(message, work)).await;
            self.settle(message, decision).await
        }
        .instrument(span)
        .await
    }

    /// [`Consumer::handle`] for each message of a batch, at most
    /// [`concurrency`](Consumer::concurrency) at a time, each under its own key; answers
    /// in the batch's order.
    ///
    /// - Each message is settled on its own: one failure never holds back, acks or
    ///   redelivers another, and a slow message never keeps the next from starting.
    /// - A message waiting for its turn is marked in progress with the broker
    ///   ([`Message::in_progress`]) as one that runs is, so it is not delivered again
    ///   while it waits.
    /// - Two deliveries of one message in a batch run it once: the second waits or is
    ///   retried as in flight, and a later delivery replays.
    /// - Messages of one ordering group ([`Message::ordering_key`]: an SQS FIFO queue's
    ///   message group) run one after another, in the batch's order; once one of them is
    ///   not acked, the ones after it are nak'd at once without running
    ///   ([`Cause::BehindUnacked`]), so that none overtakes it. Other groups go on.
    ///
    /// ```
    /// # use bytes::Bytes;
    /// # use idem_consumer::{Consumer, DeadLetterReason, Message, SettleError};
    /// # use idem_core::{Idempotency, MemoryStore, done};
    /// # use std::time::Duration;
    /// # struct Delivery(String, Bytes);
    /// # #[async_trait::async_trait]
    /// # impl Message for Delivery {
    /// #     fn id(&self) -> Option<&str> { Some(&self.0) }
    /// #     fn source(&self) -> &str { "payments" }
    /// #     fn payload(&self) -> &Bytes { &self.1 }
    /// #     async fn ack(&self) -> Result<(), SettleError> { Ok(()) }
    /// #     async fn nak(&self, _: Duration) -> Result<(), SettleError> { Ok(()) }
    /// #     async fn dead_letter(&self, _: DeadLetterReason) -> Result<(), SettleError> { Ok(()) }
    /// # }
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
    /// let batch: Vec<Delivery> = (0..10)
    ///     .map(|i| Delivery(format!("msg-{i}"), Bytes::from(format!("{i}"))))
    ///     .collect();
    /// let settled = consumer.handle_batch(&batch, |_ctx, payload| async move { done(payload.len()) }).await;
    /// assert!(settled.iter().all(|s| matches!(s, Ok(s) if s.is_acked())));
    /// # });
    /// ```
    pub async fn handle_batch<'m, M, T, E, F, Fut>(
        &self,
        messages: impl IntoIterator<Item = &'m M>,
        work: F,
    ) -> Vec<Result<Settled<T, E>, SettleError>>
    where
        M: Message + ?Sized + 'm,
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: Fn(Context, Bytes) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        // `FuturesUnordered` of a method's futures rather than stream combinators over
        // closures: those make the future unprovably `Send` (rustc's "FnOnce is not
        // general enough"), and a consumer loop must be spawnable. Every message's future
        // starts at once, so each is marked in progress while it waits; the semaphore
        // bounds how many run.
        // A message behind an earlier one of its ordering group waits for that one's
        // settlement: a oneshot per message says whether it was acked.
        let permits = tokio::sync::Semaphore::new(self.concurrency.get());
        let mut last_of_group: std::collections::HashMap<String, oneshot::Receiver<bool>> =
            std::collections::HashMap::new();
        let mut running: futures_util::stream::FuturesUnordered<_> = messages
            .into_iter()
            .enumerate()
            .map(|(index, message)| {
                let (acked, turn) = oneshot::channel();
                let after = match message.ordering_key() {
                    Some(group) => last_of_group.insert(group.to_owned(), turn),
                    None => None,
                };
                self.handle_queued(index, message, &work, &permits, after, acked)
            })
            .collect();
        let mut settled = Vec::with_capacity(running.len());
        while let Some(answer) = running.next().await {
            settled.push(answer);
        }
        settled.sort_unstable_by_key(|(index, _)| *index);
        settled.into_iter().map(|(_, settled)| settled).collect()
    }

    /// [`Consumer::handle`] once a permit is free, marked in progress from the start,
    /// answered with the message's place in its batch.
    async fn handle_queued<M, T, E, F, Fut>(
        &self,
        index: usize,
        message: &M,
        work: &F,
        permits: &tokio::sync::Semaphore,
        after: Option<oneshot::Receiver<bool>>,
        acked: oneshot::Sender<bool>,
    ) -> (usize, Result<Settled<T, E>, SettleError>)
    where
        M: Message + ?Sized,
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: Fn(Context, Bytes) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let span = crate::trace::delivery_span(message);
        let handled = async {
            let run = async {
                // Behind an earlier message of its ordering group: its turn comes once
                // that one is acked; if it was not, this one must not overtake it.
                if let Some(after) = after
                    && !after.await.unwrap_or(false)
                {
                    let behind = Decision::Nak {
                        delay: Duration::ZERO,
                        cause: Cause::BehindUnacked,
                    };
                    return (None, behind);
                }
                // Never closed: the semaphore lives as long as the batch.
                let permit = permits.acquire().await.ok();
                (permit, self.decide(message, work).await)
            };
            let (_permit, decision) = while_in_progress(message, run).await;
            let settled = self.settle(message, decision).await;
            let _ = acked.send(matches!(settled, Ok(Settled::Acked { .. })));
            settled
        };
        (index, handled.instrument(span).await)
    }

    /// What a delivery comes to, a panic anywhere in the user's code (the key and
    /// fingerprint functions, the work) included.
    async fn decide<M, T, E, F, Fut>(&self, message: &M, work: F) -> Decision<T, E>
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

    async fn settle<M: Message + ?Sized, T, E>(
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

impl<S: Store + 'static> Consumer<S> {
    /// The same consumer over `dyn Store`: one type whatever the store.
    pub fn into_dyn(self) -> Consumer {
        Consumer {
            idem: self.idem.into_dyn(),
            key: self.key,
            fingerprint: self.fingerprint,
            scope: self.scope,
            backoff: self.backoff,
            concurrency: self.concurrency,
            max_attempts: self.max_attempts,
            work_timeout: self.work_timeout,
        }
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

/// `run`, with the message marked in progress with the broker every
/// [`Message::progress_interval`] until it ends. A mark sent when `run` ends is let
/// finish (for at most one interval), so that it never lands after the settlement.
async fn while_in_progress<M, F>(message: &M, run: F) -> F::Output
where
    M: Message + ?Sized,
    F: Future,
{
    let Some(every) = message.progress_interval().filter(|every| !every.is_zero()) else {
        return run.await;
    };
    let marking = AtomicBool::new(false);
    let beat = mark_in_progress(message, every, &marking);
    tokio::pin!(run);
    tokio::pin!(beat);
    let output = tokio::select! {
        biased;
        output = &mut run => output,
        never = &mut beat => match never {},
    };
    if marking.load(Ordering::SeqCst) {
        let landed = std::future::poll_fn(|cx| match beat.as_mut().poll(cx) {
            Poll::Ready(never) => match never {},
            Poll::Pending if marking.load(Ordering::SeqCst) => Poll::Pending,
            Poll::Pending => Poll::Ready(()),
        });
        let _ = tokio::time::timeout(every, landed).await;
    }
    output
}

/// Marks the message in progress every `every`, for as long as it is polled; `marking`
/// is set while a mark is on its way.
async fn mark_in_progress<M: Message + ?Sized>(
    message: &M,
    every: Duration,
    marking: &AtomicBool,
) -> Infallible {
    // A period too long to add to now never ticks.
    let Some(first) = tokio::time::Instant::now().checked_add(every) else {
        return std::future::pending().await;
    };
    let mut ticks = tokio::time::interval_at(first, every);
    // A tick missed while the broker was slow is not made up in a burst.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        marking.store(true, Ordering::SeqCst);
        if let Err(err) = message.in_progress().await {
            tracing::debug!(error = %err, "idem-consumer: the broker did not take an in-progress mark");
        }
        marking.store(false, Ordering::SeqCst);
    }
}
