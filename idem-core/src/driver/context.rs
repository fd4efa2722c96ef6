//! What the protected work receives: its lease, its steps, and the means to act on them.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use super::durable::{self, Write};
use super::error::{CannotStore, Interrupted, Reason, WorkError};
use super::saga::{self, Undo};
use super::{Limits, observe};
use crate::record::ValuePart;
use crate::store::Completion;
use crate::{
    Codec, Fingerprint, Key, Store, StoreError, codec::CodecError, codec::StoredAt, key::StepName,
    record::Lease, record::Steps, store::WriteOutcome,
};

/// Handed to the work by [`Idempotency::execute`](crate::Idempotency::execute).
///
/// Cheap to clone; clones share the same lease and steps.
#[derive(Clone)]
pub struct Context {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    /// The lease's key, which no renewal changes: read without a lock.
    key: Key,
    held: Mutex<Held>,
    /// How much earlier than the lease's end on this process's clock (`Held::deadline`)
    /// the owner stops starting effects (see `policy::LOCAL_EXPIRY_FRACTION`).
    lease_margin: std::time::Duration,
    fingerprint: Fingerprint,
    resumed: bool,
    steps: Mutex<Steps>,
    limits: Limits,
    codec: Arc<dyn Codec>,
    store_timeout: std::time::Duration,
    /// Where the backoff of its writes' retries draws its jitter.
    jitter: super::policy::Jitter,
    serde: bool,
    lost: AtomicBool,
    lost_notify: Notify,
    /// The result a store wrote inside the caller's own transaction, if any.
    completion: Mutex<Option<Vec<u8>>>,
    /// Undos registered by steps, in the order the steps finished.
    undos: Mutex<Vec<Undo>>,
    /// An earlier owner started compensating: no new step may run.
    compensating: bool,
    /// Not backed by a claimed record: steps run every time and nothing is written.
    detached: bool,
    /// The work derived a key for another system ([`Context::derive`]).
    derived: AtomicBool,
}

/// The lease as last renewed, and its end on this process's clock: changed together.
struct Held {
    lease: Lease,
    /// When the lease ends on this process's clock, counted from when the claim or the
    /// last renewal was sent (never later than the store's own end of the lease): the
    /// store's `lease_until` is on the store's clock, which this process cannot read.
    deadline: tokio::time::Instant,
}

impl Context {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        store: Arc<dyn Store>,
        lease: Lease,
        lease_deadline: tokio::time::Instant,
        lease_length: std::time::Duration,
        fingerprint: Fingerprint,
        resumed: bool,
        steps: Steps,
        limits: Limits,
        codec: Arc<dyn Codec>,
        store_timeout: std::time::Duration,
        jitter: super::policy::Jitter,
        serde: bool,
    ) -> Self {
        let compensating = steps.contains_key(saga::SAGA_STEP);
        Self {
            inner: Arc::new(Inner {
                store,
                key: lease.key.clone(),
                held: Mutex::new(Held {
                    lease,
                    deadline: lease_deadline,
                }),
                lease_margin: lease_length / super::policy::LOCAL_EXPIRY_FRACTION,
                fingerprint,
                resumed,
                steps: Mutex::new(steps),
                limits,
                codec,
                store_timeout,
                jitter,
                serde,
                lost: AtomicBool::new(false),
                lost_notify: Notify::new(),
                completion: Mutex::new(None),
                undos: Mutex::new(Vec::new()),
                compensating,
                detached: false,
                derived: AtomicBool::new(false),
            }),
        }
    }

    /// A context backed by no record (see [`Idempotency::detached_context`]).
    pub(crate) fn detached(
        store: Arc<dyn Store>,
        lease: Lease,
        fingerprint: Fingerprint,
        limits: Limits,
        codec: Arc<dyn Codec>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                key: lease.key.clone(),
                held: Mutex::new(Held {
                    lease,
                    deadline: tokio::time::Instant::now()
                        + std::time::Duration::from_secs(86_400 * 365),
                }),
                lease_margin: std::time::Duration::ZERO,
                fingerprint,
                resumed: false,
                steps: Mutex::new(Steps::new()),
                limits,
                codec,
                store_timeout: std::time::Duration::from_secs(1),
                jitter: super::policy::Jitter::default(),
                serde: false,
                lost: AtomicBool::new(false),
                lost_notify: Notify::new(),
                completion: Mutex::new(None),
                undos: Mutex::new(Vec::new()),
                compensating: false,
                detached: true,
                derived: AtomicBool::new(false),
            }),
        }
    }

    /// The fingerprint of the request being executed.
    pub(crate) fn fingerprint(&self) -> Fingerprint {
        self.inner.fingerprint
    }

    /// The key being executed.
    pub fn key(&self) -> Key {
        self.inner.key.clone()
    }

    /// The fencing token: strictly greater for every later owner of this key within the
    /// record's lifetime. Pass it to downstream systems that reject writes carrying a lower
    /// token than they have seen, for a resource named with [`Context::derive`]: a record
    /// that expired and was deleted starts a new lifetime whose tokens start again, and
    /// whose derived keys differ.
    pub fn token(&self) -> u64 {
        self.lease().token
    }

    /// True when this run took over from an earlier attempt whose lease ended: part of the
    /// work may already have happened (see [`Context::step`]).
    pub fn resumed(&self) -> bool {
        self.inner.resumed
    }

    /// The lease this run holds, as last renewed.
    pub fn lease(&self) -> Lease {
        lock(&self.inner.held).lease.clone()
    }

    /// The names of the steps checkpointed so far, by earlier owners or by this run,
    /// idem's own included (named `idem.`: the saga's, the undos' marks, and
    /// `idem.derived`, left by a run that derived a key and released).
    pub fn completed_steps(&self) -> Vec<String> {
        lock(&self.inner.steps).keys().cloned().collect()
    }

    /// A stable idempotency key for calling another system on behalf of this execution.
    ///
    /// - The same for every retry and takeover of this request within the record's
    ///   lifetime, so the downstream system deduplicates them. A run that derived a key
    ///   and then fails with [`WorkError::Retryable`](crate::WorkError::Retryable) keeps
    ///   the record for its retry (a release would otherwise end the lifetime of a record
    ///   with no step), so the retry derives the same key.
    /// - Different for each `label`, for another request (fingerprint) under the same key,
    ///   and for another lifetime of the key (after the record expired and was deleted,
    ///   told apart by its creation time): a downstream system never merges two different
    ///   requests.
    /// - Reveals neither the key nor the request.
    ///
    /// ```
    /// # use idem_core::{done, Idempotency, Key, Fingerprint, MemoryStore};
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let idem = Idempotency::new(MemoryStore::new());
    /// # let key = Key::new("acct_42/payments.create", "order-1187")?;
    /// let derived = idem
    ///     .execute(&key, Fingerprint::of_bytes("req"), |ctx| async move {
    ///         // Send this as the Idempotency-Key header of the ledger's debit call.
    ///         done(ctx.derive("debit"))
    ///     })
    ///     .await?;
    /// assert!(derived.value().unwrap().starts_with("idem-"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn derive(&self, label: &str) -> String {
        let lease = self.lease();
        if self.inner.detached {
            // No record ties two runs together: each detached context derives keys of
            // its own, so two requests never share a downstream key.
            let label = format!("{label}\u{0}{:?}", lease.attempt.as_bytes());
            return crate::key::derive_key(
                &lease.key,
                &self.inner.fingerprint,
                lease.created_at,
                &label,
            );
        }
        self.inner.derived.store(true, Ordering::Relaxed);
        crate::key::derive_key(&lease.key, &self.inner.fingerprint, lease.created_at, label)
    }

    /// Whether a release would end the record's lifetime (no step is recorded) although
    /// the work derived a key for another system, which the next lifetime would derive
    /// anew.
    pub(crate) fn derived_without_steps(&self) -> bool {
        self.inner.derived.load(Ordering::Relaxed) && lock(&self.inner.steps).is_empty()
    }

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
            let value = serde_json::from_slice(&plain).map_err(|source| {
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
        let value: T = serde_json::from_slice(&plain).map_err(|_| unserializable())?;
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
        self.checkpoint_within(step, plain, super::MARKER_RESERVE)
            .await
    }

    /// [`Context::checkpoint`] for idem's own checkpoints (the saga's, the undos' marks),
    /// which may use most of the room kept for the failure marker: a record the work's
    /// steps filled still records what to undo.
    pub(crate) async fn checkpoint_own(
        &self,
        step: &StepName,
        plain: &[u8],
    ) -> Result<(), Interrupted> {
        self.checkpoint_within(step, plain, super::OWN_RESERVE)
            .await
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

    /// Prepares `value` as this execution's result, for stores that complete inside the
    /// caller's own database transaction (`SqliteStore::complete_in`,
    /// `PostgresStore::complete_in`).
    ///
    /// - The bytes are exactly those the driver would store for `value`: the same
    ///   encoding, the same size limit, the same check that they read back as `T`.
    /// - Once the store wrote them and your transaction commits, the driver answers the
    ///   execution with exactly that value, even if a heartbeat meanwhile found the
    ///   record completed, or the work ran on past the result's retention and the record
    ///   expired; return the same value from the work. Return it only if that
    ///   transaction committed: on a rollback return an error (the driver, finding
    ///   another owner's record, would answer `LeaseLost`, but a record that expired
    ///   meanwhile cannot tell it a rollback from a commit).
    ///
    /// # Errors
    /// [`WorkError::Interrupted`] when `value` cannot be stored (too large, not
    /// serialisable); the driver stores that as the permanent failure. Also when the
    /// execution stores raw bytes ([`Idempotency::execute_bytes`](crate::Idempotency::execute_bytes)).
    pub fn prepare_completion<T: Serialize + DeserializeOwned>(
        &self,
        value: &T,
    ) -> Result<Completion, Interrupted> {
        if !self.inner.serde {
            return Err(Interrupted(Reason::WrongEncoding));
        }
        let unserializable = || {
            Interrupted(Reason::Unstorable(CannotStore::Unserializable {
                what: ValuePart::Result,
            }))
        };
        let plain = serde_json::to_vec(value).map_err(|_| unserializable())?;
        serde_json::from_slice::<T>(&plain).map_err(|_| unserializable())?;
        let bytes = self.encode(ValuePart::Result, plain)?;
        let limit = self.room_for_response();
        if bytes.len() > limit {
            return Err(Interrupted(Reason::Unstorable(
                CannotStore::ResultTooLarge {
                    size: bytes.len(),
                    limit,
                },
            )));
        }
        let context = self.clone();
        Ok(Completion::new(self.lease(), bytes, move |bytes| {
            *lock(&context.inner.completion) = Some(bytes.to_vec());
        }))
    }

    /// True while the lease counts as lost: the store fenced one of this owner's writes
    /// (another attempt took the key over: for good), or the lease has ended on this
    /// process's own clock with no renewal confirmed since (a partition, an overloaded
    /// store, a pause longer than the heartbeat). While it is, [`Context::step`] starts no
    /// new effect.
    ///
    /// The owner cannot tell "taken over" from "cut off": a lease it last confirmed and
    /// that has ended may be another attempt's by now, so it stops either way, a fiftieth
    /// of the lease early to allow for clock drift. A renewal sent before that end and
    /// answered after it proves the lease never lapsed (the store renews live leases
    /// only), and the lease counts as held again.
    pub fn is_lease_lost(&self) -> bool {
        self.inner.lost.load(Ordering::SeqCst) || self.lease_ended_locally()
    }

    /// Completes once the lease counts as lost (see [`Context::is_lease_lost`]): `select!`
    /// on it to stop work that no longer counts. Completes by itself, with no store call,
    /// a fiftieth of the lease before its end on this process's clock when no renewal
    /// confirmed since moved that end. A renewal still on its way may then land and
    /// restore the lease: the owner could not know, and stopping was the safe side.
    pub async fn lease_lost(&self) {
        loop {
            let notified = self.inner.lost_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_lease_lost() {
                return;
            }
            if self.inner.detached {
                // No lease to run out: only a fence ends it.
                notified.await;
                continue;
            }
            let end = self.local_end();
            tokio::select! {
                () = notified => {}
                // A renewal may have moved the end meanwhile: checked again at the top.
                () = tokio::time::sleep_until(end) => {}
            }
        }
    }

    /// When this owner stops starting effects: the lease's end on this process's clock,
    /// less the margin.
    fn local_end(&self) -> tokio::time::Instant {
        let deadline = self.lease_deadline();
        deadline
            .checked_sub(self.inner.lease_margin)
            .unwrap_or(deadline)
    }

    /// True once the lease has ended on this process's clock (less the margin).
    fn lease_ended_locally(&self) -> bool {
        !self.inner.detached && tokio::time::Instant::now() >= self.local_end()
    }

    /// True once the store fenced one of this owner's writes: lost for good.
    pub(crate) fn is_fenced(&self) -> bool {
        self.inner.lost.load(Ordering::SeqCst)
    }

    pub(crate) fn mark_lost(&self) {
        if !self.inner.lost.swap(true, Ordering::SeqCst) {
            observe::count(observe::LEASE_LOSSES);
        }
        self.inner.lost_notify.notify_waiters();
    }

    /// A renewal landed: the lease as renewed, and its end on this process's clock.
    pub(crate) fn set_lease(&self, lease: Lease, deadline: tokio::time::Instant) {
        *lock(&self.inner.held) = Held { lease, deadline };
    }

    /// When the lease ends, on this process's clock (see `Held::deadline`).
    pub(crate) fn lease_deadline(&self) -> tokio::time::Instant {
        lock(&self.inner.held).deadline
    }

    /// Runs a fenced write under this lease, retried while the lease lasts, finished in a
    /// task of its own if the caller drops `execute` first.
    pub(crate) async fn durable(&self, write: Write) -> Result<WriteOutcome, StoreError> {
        if self.inner.detached {
            return Ok(WriteOutcome::Applied);
        }
        let owner = self.clone();
        durable::Survive::new(async move { owner.durable_in_place(write).await }).await
    }

    /// [`Context::durable`] for a caller that already survives being dropped
    /// ([`durable::finish`]): the write runs in its future, not in one of its own.
    pub(crate) async fn durable_in_place(&self, write: Write) -> Result<WriteOutcome, StoreError> {
        if self.inner.detached {
            return Ok(WriteOutcome::Applied);
        }
        let (lease, deadline) = {
            let held = lock(&self.inner.held);
            (held.lease.clone(), held.deadline)
        };
        durable::in_place(
            Arc::clone(&self.inner.store),
            lease,
            write,
            self.inner.store_timeout,
            Some(deadline),
            self.inner.jitter.clone(),
        )
        .await
    }

    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    pub(crate) fn take_completion(&self) -> Option<Vec<u8>> {
        lock(&self.inner.completion).take()
    }

    /// Whether the result the work's own transaction wrote (`bytes`) stands, once the
    /// driver's confirming write was fenced: the record is still this lease's completed
    /// one with these bytes, or it is absent (that result outlived its retention while the
    /// work ran on; the work returned success, so it committed). Another owner's record, an
    /// unanswered read or an error says no: the work's transaction did not commit what it
    /// wrote (it rolled back), and the caller is told to retry.
    pub(crate) async fn committed_result_stands(&self, bytes: &[u8]) -> bool {
        let lease = self.lease();
        let read =
            tokio::time::timeout(self.inner.store_timeout, self.inner.store.get(&lease.key)).await;
        match read {
            Ok(Ok(None)) => true,
            Ok(Ok(Some(record))) => {
                record.state == crate::State::Completed
                    && record.token == lease.token
                    && record.attempt == lease.attempt
                    && record.response.as_deref() == Some(bytes)
            }
            Ok(Err(_)) | Err(_) => false,
        }
    }

    /// The plain bytes of a stored value of this record.
    fn decode<'a>(
        &self,
        part: ValuePart,
        stored: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [u8]>, Interrupted> {
        let key = self.key();
        let at = StoredAt {
            key: &key,
            fingerprint: &self.inner.fingerprint,
            part,
        };
        self.inner
            .codec
            .decode(&at, stored)
            .map_err(|source| codec_interruption(at.part, source))
    }

    /// The stored form of a value of this record.
    pub(crate) fn encode(&self, part: ValuePart, plain: Vec<u8>) -> Result<Vec<u8>, Interrupted> {
        let key = self.key();
        let at = StoredAt {
            key: &key,
            fingerprint: &self.inner.fingerprint,
            part,
        };
        self.inner
            .codec
            .encode(&at, plain)
            .map_err(|source| codec_interruption(at.part, source))
    }

    /// Bytes the record's checkpoints take (names and values).
    fn steps_size(&self) -> usize {
        lock(&self.inner.steps)
            .iter()
            .map(|(name, value)| name.len() + value.len())
            .sum()
    }

    /// The most bytes the result may take now, as stored (after the codec): the driver's
    /// cap, and what the store's record has left beside the checkpoints. Work that
    /// streams a large result checks against it before buffering more.
    ///
    /// ```
    /// use idem_core::{done, Fingerprint, Idempotency, Key, MemoryStore};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let idem = Idempotency::builder(MemoryStore::new()).max_response_bytes(4096).build()?;
    /// let key = Key::new("reports", "r-1")?;
    /// let room = idem
    ///     .execute(&key, Fingerprint::of_bytes("q"), |ctx| async move { done(ctx.room_for_response()) })
    ///     .await?;
    /// assert_eq!(room.value(), Some(4096));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn room_for_response(&self) -> usize {
        self.inner.limits.room(self.steps_size(), 0)
    }

    /// Whether a result of these plain bytes fits the record as stored, after the codec:
    /// what the driver checks when the work returns it, asked beforehand so that work
    /// can store something smaller instead of failing.
    ///
    /// ```
    /// use idem_core::{done, Fingerprint, Idempotency, Key, MemoryStore};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let idem = Idempotency::builder(MemoryStore::new()).max_response_bytes(4096).build()?;
    /// let key = Key::new("reports", "r-1")?;
    /// let fits = idem
    ///     .execute(&key, Fingerprint::of_bytes("q"), |ctx| async move {
    ///         done((ctx.fits_response(&[0; 4096]), ctx.fits_response(&[0; 4097])))
    ///     })
    ///     .await?;
    /// assert_eq!(fits.value(), Some((true, false)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn fits_response(&self, plain: &[u8]) -> bool {
        let room = self.room_for_response();
        let overhead = self
            .encode(ValuePart::Result, Vec::new())
            .map_or(0, |empty| empty.len());
        // A codec that at most doubles a value (hex, base64, a cipher's nonce and tag)
        // needs no trial when twice the value still fits; only values near the room
        // are encoded to know.
        if plain.len().saturating_mul(2).saturating_add(overhead) <= room {
            return true;
        }
        self.encode(ValuePart::Result, plain.to_vec())
            .is_ok_and(|stored| stored.len() <= room)
    }

    /// [`Context::room_for_response`] less what the codec adds to an empty value
    /// (AES-GCM's nonce and tag; nothing for the plain codec): the room to buffer a
    /// result in before [`Context::fits_response`] checks it.
    ///
    /// ```
    /// use idem_core::{done, Fingerprint, Idempotency, Key, MemoryStore};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let idem = Idempotency::builder(MemoryStore::new()).max_response_bytes(4096).build()?;
    /// let key = Key::new("reports", "r-1")?;
    /// let room = idem
    ///     .execute(&key, Fingerprint::of_bytes("q"), |ctx| async move { done(ctx.room_for_plain_response()) })
    ///     .await?;
    /// assert_eq!(room.value(), Some(4096)); // the plain codec adds nothing
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn room_for_plain_response(&self) -> usize {
        let overhead = self
            .encode(ValuePart::Result, Vec::new())
            .map_or(0, |empty| empty.len());
        self.room_for_response().saturating_sub(overhead)
    }
}

fn codec_interruption(part: ValuePart, source: CodecError) -> Interrupted {
    Interrupted(Reason::Codec { what: part, source })
}

fn too_large(step: &str, size: usize, limit: usize) -> Interrupted {
    Interrupted(Reason::Unstorable(CannotStore::StepTooLarge {
        step: step.to_owned(),
        size,
        limit,
    }))
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing here is left half-written by a panic: a poisoned lock is still consistent.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("key", &self.key())
            .field("token", &self.token())
            .field("resumed", &self.resumed())
            .field("lease_lost", &self.is_lease_lost())
            .finish()
    }
}
