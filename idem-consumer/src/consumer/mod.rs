//! [`Consumer`]: one message, one key, the effect once, the broker told what happened.
//!
//! - this file: [`Consumer`], its settings, the key a delivery is handled under.
//! - Handling one delivery and a batch: `handle.rs`.
//! - What an answer comes to (the settle table) and telling the broker: `decision.rs`.
//! - In-progress marks while a delivery waits or runs: `progress.rs`.

mod decision;
mod handle;
mod progress;

use std::fmt;
use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Fingerprint, Idempotency, Key, Store};

use crate::{Backoff, Cause, Message};

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
/// [`Context::step`]: idem_core::Context::step
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
    /// [`DeadLetterReason::NoKey`]: crate::DeadLetterReason::NoKey
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
    /// [`DeadLetterReason::NoKey`]: crate::DeadLetterReason::NoKey
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
    /// [`DeadLetterReason::AttemptsExhausted`]: crate::DeadLetterReason::AttemptsExhausted
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
