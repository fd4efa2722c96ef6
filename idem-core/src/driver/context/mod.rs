//! What the protected work receives: its lease, its steps, and the means to act on them.
//!
//! - this file: [`Context`], what it holds, the key it derives, the stored form of values.
//! - `steps.rs`: steps, their checkpoints, and the undos they register.
//! - `lease.rs`: the lease as the owner holds it, and the fenced writes made under it.
//! - `result.rs`: the room a result has, and a result stored in the caller's transaction.

mod lease;
mod result;
mod steps;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use super::Limits;
use super::error::{Interrupted, Reason};
use super::saga::{self, Undo};
use crate::record::ValuePart;
use crate::{
    Codec, Fingerprint, Key, Store, codec::CodecError, codec::StoredAt, record::Lease,
    record::Steps,
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
                // Never read: a detached context has no lease to run out (see
                // `lease_ended_locally` and `lease_lost`).
                held: Mutex::new(Held {
                    lease,
                    deadline: tokio::time::Instant::now(),
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
    /// that expired and was deleted (or expired at the last token,
    /// [`MAX_TOKEN`](crate::raw::MAX_TOKEN)) starts a new lifetime whose tokens start
    /// again, and whose derived keys differ.
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

    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
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
}

fn codec_interruption(part: ValuePart, source: CodecError) -> Interrupted {
    Interrupted(Reason::Codec { what: part, source })
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
