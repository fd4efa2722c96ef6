//! What the work reports, and what `execute` answers when idem cannot give the work's
//! answer.

use std::fmt;
use std::time::Duration;

use crate::record::ValuePart;
use crate::{BoxError, StoreError, codec::CodecError, key::KeyError, key::ShortHash};

/// How the protected work failed; the kind decides what is stored.
///
/// Build one from any `Result` with [`WorkResultExt`] (`.permanent()`, `.retryable()`,
/// `.unknown()`), or with the variants directly.
///
/// ```
/// use idem_core::WorkError;
///
/// #[derive(Debug, serde::Serialize, serde::Deserialize)]
/// enum PaymentError { CardDeclined, ProviderDown, ProviderTimedOut }
///
/// fn classify(err: PaymentError) -> WorkError<PaymentError> {
///     match err {
///         // Replayed to every retry: the card will still be declined.
///         PaymentError::CardDeclined => WorkError::Permanent(err),
///         // Nothing happened: let the next retry run the work again.
///         PaymentError::ProviderDown => WorkError::Retryable(err),
///         // The charge may have gone through: hold the key until the lease ends.
///         PaymentError::ProviderTimedOut => WorkError::Unknown(err),
///     }
/// }
/// # let _ = classify(PaymentError::CardDeclined);
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum WorkError<E> {
    /// The operation failed for good: the error is stored and every retry gets it back.
    Permanent(E),
    /// Nothing took effect: the lease is released and nothing is stored, so the next retry
    /// runs the work again at once. With no step checkpointed and no key derived
    /// ([`Context::derive`](crate::Context::derive)), the key is forgotten: a different
    /// request under it runs too, instead of being a mismatch. A run that derived a key
    /// keeps the record (it checkpoints a mark of its own first), so its retry derives the
    /// same key.
    Retryable(E),
    /// The work may or may not have taken effect (a downstream call timed out). The lease is
    /// kept until it expires: duplicates see in-flight until then, and a later retry takes
    /// over (resuming through its checkpointed steps).
    Unknown(E),
    /// The driver stopped the work: raised by [`Context`](crate::Context) methods such as
    /// [`Context::step`](crate::Context::step), and impossible to build by hand. Propagate
    /// it with `?`.
    Interrupted(Interrupted),
}

impl<E> From<Interrupted> for WorkError<E> {
    fn from(interrupted: Interrupted) -> Self {
        WorkError::Interrupted(interrupted)
    }
}

/// Classifies any `Result`'s error as a [`WorkError`], so work reads as plain code.
///
/// ```
/// use idem_core::{Fingerprint, Idempotency, Key, MemoryStore, Outcome, WorkResultExt};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// async fn charge(cents: u64) -> Result<String, String> { Ok(format!("ch_{cents}")) }
///
/// let idem = Idempotency::new(MemoryStore::new());
/// let key = Key::new("acct_42/payments.create", "order-1")?;
/// let outcome = idem
///     .execute(&key, Fingerprint::of_bytes("500"), |_ctx| async { charge(500).await.permanent() })
///     .await?;
/// assert_eq!(outcome.into_result(), Ok("ch_500".to_string()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub trait WorkResultExt<T, E> {
    /// A failure is [`WorkError::Permanent`]: stored and replayed.
    fn permanent(self) -> Result<T, WorkError<E>>;
    /// A failure is [`WorkError::Retryable`]: nothing happened, run again.
    fn retryable(self) -> Result<T, WorkError<E>>;
    /// A failure is [`WorkError::Unknown`]: it may have taken effect.
    fn unknown(self) -> Result<T, WorkError<E>>;
}

impl<T, E> WorkResultExt<T, E> for Result<T, E> {
    fn permanent(self) -> Result<T, WorkError<E>> {
        self.map_err(WorkError::Permanent)
    }

    fn retryable(self) -> Result<T, WorkError<E>> {
        self.map_err(WorkError::Retryable)
    }

    fn unknown(self) -> Result<T, WorkError<E>> {
        self.map_err(WorkError::Unknown)
    }
}

/// What the work returns: its value, or how it failed. `E` defaults to `()` for work that
/// cannot fail.
pub type WorkResult<T, E = ()> = Result<T, WorkError<E>>;

/// The result of work that cannot fail, typed so that no annotation is needed.
///
/// ```
/// use idem_core::{done, Fingerprint, Idempotency, Key, MemoryStore};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let idem = Idempotency::new(MemoryStore::new());
/// let key = Key::new("jobs/nightly", "2026-11-30")?;
/// let outcome = idem.execute(&key, Fingerprint::of_bytes("run"), |_ctx| async { done(42) }).await?;
/// assert_eq!(outcome.into_result(), Ok(42));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub fn done<T>(value: T) -> WorkResult<T> {
    Ok(value)
}

/// Why the driver stopped the work (see [`WorkError::Interrupted`]). Only the driver
/// builds one; [`Interrupted::kind`] tells which it is.
#[derive(Debug)]
pub struct Interrupted(pub(crate) Reason);

/// Which interruption an [`Interrupted`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum InterruptedKind {
    /// Another attempt took the key over; this run's writes no longer count.
    LeaseLost,
    /// Writing a checkpoint failed in the store (after retrying what could be retried).
    Store,
    /// A step name broke the naming rules.
    InvalidStepName,
    /// A stored step no longer decodes as the type asked for.
    StepUndecodable,
    /// The codec could not decode a stored checkpoint, or encode a new one (see
    /// [`Error::Codec`]).
    Codec,
    /// A value the work produced cannot be stored (too large, or not serialisable); the
    /// driver stores this as a permanent failure, since the work's effect may have
    /// happened.
    Unstorable,
    /// [`Context::prepare_completion`](crate::Context::prepare_completion) was called in an
    /// execution that stores raw bytes.
    WrongEncoding,
    /// The execution is compensating (an earlier owner's step failed permanently): steps
    /// without a checkpoint no longer run. The driver finishes the compensation.
    Compensating,
}

#[derive(Debug)]
pub(crate) enum Reason {
    LeaseLost,
    Store(StoreError),
    InvalidStepName(KeyError),
    StepUndecodable { step: String, source: BoxError },
    Codec { what: ValuePart, source: CodecError },
    Unstorable(CannotStore),
    WrongEncoding,
    Compensating,
}

/// A value the work produced that the driver cannot store; stored as a marker instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CannotStore {
    ResultTooLarge {
        size: usize,
        limit: usize,
    },
    Unserializable {
        what: ValuePart,
    },
    StepTooLarge {
        step: String,
        size: usize,
        limit: usize,
    },
}

/// Why a value the work produced cannot be stored (see [`Error::Unstorable`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unstorable {
    /// Its encoded form is larger than the room it has: the size cap, or what the
    /// store holds beside the record's checkpoints.
    TooLarge {
        /// The encoded size in bytes.
        size: usize,
        /// The room it had.
        limit: usize,
    },
    /// It does not serialise, or does not read back as its own type (`f64::NAN`, a
    /// `#[serde(skip)]` field without a default, a lossy serializer).
    Unserializable,
}

impl fmt::Display for Unstorable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unstorable::TooLarge { size, limit } => {
                write!(f, "is {size} bytes, over the {limit} bytes it may take")
            }
            Unstorable::Unserializable => {
                f.write_str("does not serialise, or does not read back as its type")
            }
        }
    }
}

impl Interrupted {
    pub(crate) fn lease_lost() -> Self {
        Self(Reason::LeaseLost)
    }

    /// Which interruption this is.
    pub fn kind(&self) -> InterruptedKind {
        match &self.0 {
            Reason::LeaseLost => InterruptedKind::LeaseLost,
            Reason::Store(_) => InterruptedKind::Store,
            Reason::InvalidStepName(_) => InterruptedKind::InvalidStepName,
            Reason::StepUndecodable { .. } => InterruptedKind::StepUndecodable,
            Reason::Codec { .. } => InterruptedKind::Codec,
            Reason::Unstorable(_) => InterruptedKind::Unstorable,
            Reason::WrongEncoding => InterruptedKind::WrongEncoding,
            Reason::Compensating => InterruptedKind::Compensating,
        }
    }

    /// The step concerned, when there is one.
    pub fn step(&self) -> Option<&str> {
        match &self.0 {
            Reason::StepUndecodable { step, .. }
            | Reason::Codec {
                what: ValuePart::Step(step),
                ..
            } => Some(step),
            Reason::Unstorable(CannotStore::StepTooLarge { step, .. })
            | Reason::Unstorable(CannotStore::Unserializable {
                what: ValuePart::Step(step),
            }) => Some(step),
            _ => None,
        }
    }
}

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Reason::LeaseLost => f.write_str("the lease was lost to another attempt"),
            Reason::Store(_) => f.write_str("a checkpoint could not be written"),
            Reason::InvalidStepName(_) => f.write_str("a step name breaks the naming rules"),
            Reason::StepUndecodable { step, .. } => write!(
                f,
                "the stored value of step `{step}` does not decode as the type asked for: \
                 give a step whose type changed a new name (`{step}.v2`), or delete the \
                 record to start over"
            ),
            Reason::Codec { what, source } => write!(f, "{what} {source}"),
            Reason::Unstorable(unstorable) => fmt::Display::fmt(unstorable, f),
            Reason::WrongEncoding => f.write_str(
                "prepare_completion is for executions that store serde values; \
                 this one stores raw bytes",
            ),
            Reason::Compensating => {
                f.write_str("the execution is compensating a permanent failure; no new step runs")
            }
        }
    }
}

impl fmt::Display for CannotStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CannotStore::ResultTooLarge { size, limit } => {
                write!(f, "the result is {size} bytes, over the {limit} byte limit")
            }
            CannotStore::Unserializable { what } => {
                write!(
                    f,
                    "{what} could not be serialised, or did not read back as its type"
                )
            }
            CannotStore::StepTooLarge { step, size, limit } => write!(
                f,
                "the value of step `{step}` is {size} bytes, over the {limit} bytes left for it"
            ),
        }
    }
}

impl std::error::Error for Interrupted {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            Reason::Store(err) => Some(err),
            Reason::InvalidStepName(err) => Some(err),
            Reason::StepUndecodable { source, .. } => Some(source.as_ref()),
            Reason::Codec { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Why `execute` could not give the work's answer.
///
/// Expected answers (a duplicate in flight, a reused key, a lost lease) are variants too,
/// so a caller can map each to its protocol (HTTP 409, 422, 503 ...). The work's own
/// answers, fresh or replayed, are an [`Outcome`](crate::Outcome), never an `Error`.
/// [`Error::is_retryable`] says whether the caller's retry can help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another attempt holds the key; retry after `retry_after`.
    #[error("a request with this key is in flight; retry in {retry_after:?}")]
    InFlight {
        /// How long the other attempt's lease still runs.
        retry_after: Duration,
    },
    /// The key broke the driver's [`KeyPolicy`](crate::KeyPolicy). Nothing was stored;
    /// the client must send an acceptable key.
    #[error("the idempotency key was refused: {0}")]
    KeyRefused(#[source] crate::driver::KeyPolicyError),
    /// The scope created as many new keys as its [`KeyBudget`](crate::driver::KeyBudget) allows.
    /// Nothing was stored; keys that already have a record still replay.
    #[error("this scope created too many new idempotency keys; retry in {retry_after:?}")]
    KeyBudgetExhausted {
        /// When the budget has room again.
        retry_after: Duration,
    },
    /// The key was used before for a request with a different fingerprint.
    #[error("this idempotency key was already used for a different request; use a new key")]
    Mismatch,
    /// Another attempt took over while the work ran, so its result was not stored; the
    /// other attempt's result is what retries get.
    #[error("the lease was lost to another attempt; retry to get that attempt's result")]
    LeaseLost,
    /// A value the work produced (its result, its permanent error or a step's value)
    /// cannot be stored: it is too large ([`Unstorable::TooLarge`]: over the size cap, or
    /// over what the store holds beside the work's checkpoints), or it does not serialise
    /// or read back as its own type ([`Unstorable::Unserializable`]). The work ran once;
    /// this failure is stored so retries get it back instead of running the work again.
    #[error("{part} cannot be stored: it {reason}{}{}", advice(reason), replay_note(*replayed))]
    Unstorable {
        /// Which value.
        part: ValuePart,
        /// Why.
        reason: Unstorable,
        /// The serialiser's error (on the run that stored the failure only).
        #[source]
        source: Option<BoxError>,
        /// True when this is a replay of an earlier attempt's failure.
        replayed: bool,
    },
    /// A stored result could not be read back as the expected type (the type changed since
    /// it was stored?). Not retryable.
    #[error("a stored result could not be decoded as the expected type")]
    Decode(#[source] BoxError),
    /// The codec ([`IdempotencyBuilder::codec`](crate::IdempotencyBuilder::codec)) could
    /// not decode a stored value (altered, copied from another record, a retired key) or
    /// encode a new one. Nothing is replayed and the work does not run again: the record
    /// stays as it is for an operator to inspect (`idem inspect`), and an in-progress key
    /// stays held until its lease ends.
    #[error("{what} of key #{key} {source}")]
    Codec {
        /// The key's short hash, as in logs.
        key: ShortHash,
        /// Which value.
        what: ValuePart,
        /// What the codec found.
        #[source]
        source: CodecError,
    },
    /// Undoing a step ([`Context::step_with_undo`](crate::Context::step_with_undo)) failed
    /// with a retryable error, or a takeover's run of the work stopped before it
    /// registered a step's undo again. The compensation is checkpointed so far; the key
    /// stays held until its lease ends, then a retry takes over and goes on compensating.
    #[error(
        "undoing step `{step}` did not finish; retry after the lease ends to go on compensating"
    )]
    CompensationPending {
        /// The step whose undo did not finish.
        step: String,
    },
    /// The driver interrupted the work (an invalid step name, or a stored step that no
    /// longer decodes). The lease is kept until it expires.
    #[error("the work was interrupted: {0}")]
    Interrupted(#[source] Interrupted),
    /// The store failed. The work did not run if the claim failed; if storing the result
    /// failed after the work ran, the key stays held until its lease ends.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn advice(reason: &Unstorable) -> &'static str {
    match reason {
        Unstorable::TooLarge { .. } => "; raise the cap or store less",
        Unstorable::Unserializable => "",
    }
}

fn replay_note(replayed: bool) -> &'static str {
    if replayed { " (replayed)" } else { "" }
}

impl Error {
    /// Whether the caller retrying the same request (same key) can get a better answer.
    ///
    /// ```
    /// use idem_core::Error;
    /// use std::time::Duration;
    ///
    /// assert!(Error::InFlight { retry_after: Duration::from_secs(1) }.is_retryable());
    /// assert!(!Error::Mismatch.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::InFlight { .. }
            | Error::LeaseLost
            | Error::KeyBudgetExhausted { .. }
            | Error::CompensationPending { .. } => true,
            Error::Store(err) => err.is_retryable(),
            Error::Mismatch
            | Error::KeyRefused(_)
            | Error::Unstorable { .. }
            | Error::Decode(_)
            | Error::Codec { .. }
            | Error::Interrupted(_) => false,
        }
    }

    /// True when this answer is a replay of an earlier attempt's stored failure.
    pub fn is_replay(&self) -> bool {
        matches!(self, Error::Unstorable { replayed: true, .. })
    }
}

/// A driver setting that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The lease was zero: every duplicate could take over at once.
    #[error("the lease must be longer than zero")]
    ZeroLease,
    /// The retention was shorter than the lease, so a result could be forgotten the moment
    /// it is stored.
    #[error("the retention ({retention:?}) must be at least the lease ({lease:?})")]
    RetentionShorterThanLease {
        /// The retention asked for.
        retention: Duration,
        /// The lease asked for.
        lease: Duration,
    },
    /// A duration longer than [`MAX_DURATION`](crate::raw::MAX_DURATION).
    #[error(
        "the {setting} ({value:?}) is longer than idem supports ({max:?}); use MAX_DURATION for \"as long as possible\""
    )]
    DurationTooLong {
        /// Which setting: `lease`, `retention` or `heartbeat interval`.
        setting: &'static str,
        /// The duration asked for.
        value: Duration,
        /// [`MAX_DURATION`](crate::raw::MAX_DURATION).
        max: Duration,
    },
    /// The response cap was zero.
    #[error("the response size cap must be at least one byte")]
    ZeroResponseCap,
    /// A heartbeat interval of zero, or too close to the lease for a renewal to land
    /// before the owner stops itself, cannot keep it alive.
    #[error(
        "the heartbeat interval ({every:?}) must be above zero and at most nine tenths of the lease ({lease:?}) less a fiftieth, when the owner stops starting work, so that a renewal lands before (the default renews every third)"
    )]
    HeartbeatNotShorterThanLease {
        /// The interval asked for.
        every: Duration,
        /// The lease asked for.
        lease: Duration,
    },
    /// A zero store timeout would fail every store call.
    #[error("the store timeout must be longer than zero")]
    ZeroStoreTimeout,
    /// `Heartbeat::Auto` renews every third of the lease, which needs a lease of 3 ms or
    /// more.
    #[error(
        "a lease of {lease:?} is too short for the automatic heartbeat (3 ms at least); use a longer lease or Heartbeat::Off"
    )]
    LeaseTooShortForHeartbeat {
        /// The lease asked for.
        lease: Duration,
    },
}

/// One of idem's own checkpoint names, checked like any step name.
pub(crate) fn step_name(name: &str) -> Result<crate::key::StepName, Interrupted> {
    crate::key::StepName::new(name).map_err(|err| Interrupted(Reason::InvalidStepName(err)))
}

/// The caller's error for an interruption met by the driver itself.
pub(crate) fn interruption_error(key: &crate::Key, interrupted: Interrupted) -> Error {
    match interrupted.0 {
        Reason::LeaseLost => Error::LeaseLost,
        Reason::Store(err) => Error::Store(err),
        Reason::Codec { what, source } => Error::Codec {
            key: key.short_hash(),
            what,
            source,
        },
        other => Error::Interrupted(Interrupted(other)),
    }
}
