//! The work's answer, as `execute` returns it: this run's, or the one stored by an earlier
//! run.

/// The work's answer for a key: its value or its error, from this run or replayed from
/// the run that stored it.
///
/// `execute` answers an `Outcome` whenever the work has an answer; when it cannot give one
/// (a duplicate in flight, a reused key, a store failure) it answers an
/// [`Error`](crate::Error) instead.
///
/// ```
/// use idem_core::{Fingerprint, Idempotency, Key, MemoryStore, Outcome, WorkError};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let idem = Idempotency::new(MemoryStore::new());
/// let key = Key::new("acct_42/payments.create", "order-1187")?;
/// for _ in 0..2 {
///     let outcome = idem
///         .execute(&key, Fingerprint::of_bytes("500"), |_ctx| async {
///             Err::<String, _>(WorkError::Permanent("card declined".to_string()))
///         })
///         .await?;
///     match outcome {
///         Outcome::Completed { value, .. } => println!("charged: {value}"),
///         // The same failure, replayed to the retry.
///         Outcome::Failed { error, replayed } => println!("{error} (replayed: {replayed})"),
///         Outcome::Retryable(error) | Outcome::Unknown(error) => println!("retry later: {error}"),
///         _ => {}
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome<T, E> {
    /// The work succeeded. `value` is what the store holds, decoded: a retry gets exactly
    /// the same value.
    Completed {
        /// The result.
        value: T,
        /// True when the work did not run now and `value` is an earlier run's.
        replayed: bool,
    },
    /// The work failed permanently ([`WorkError::Permanent`](crate::WorkError::Permanent)):
    /// the error is stored and every retry gets it back.
    Failed {
        /// The stored error, decoded.
        error: E,
        /// True when the work did not run now and `error` is an earlier run's.
        replayed: bool,
    },
    /// The work failed permanently after steps registered with
    /// [`Context::step_with_undo`](crate::Context::step_with_undo) took effect; their undos
    /// ran in reverse order, and `compensation` says which. Stored and replayed like
    /// [`Outcome::Failed`].
    Compensated {
        /// The stored error, decoded.
        error: E,
        /// Which steps were undone, and any undo that failed.
        compensation: crate::Compensation,
        /// True when the work did not run now and this is an earlier run's answer.
        replayed: bool,
    },
    /// The work said nothing happened ([`WorkError::Retryable`](crate::WorkError::Retryable)):
    /// nothing is stored and the key is free; retrying runs the work again.
    Retryable(E),
    /// The work may have taken effect ([`WorkError::Unknown`](crate::WorkError::Unknown)):
    /// the key stays held until the lease ends, then a retry takes over and resumes.
    Unknown(E),
}

impl<T, E> Outcome<T, E> {
    /// True when the work did not run now: the answer is an earlier run's.
    pub fn replayed(&self) -> bool {
        matches!(
            self,
            Outcome::Completed { replayed: true, .. }
                | Outcome::Failed { replayed: true, .. }
                | Outcome::Compensated { replayed: true, .. }
        )
    }

    /// The value, or the work's error whatever its kind.
    pub fn into_result(self) -> Result<T, E> {
        match self {
            Outcome::Completed { value, .. } => Ok(value),
            Outcome::Failed { error, .. }
            | Outcome::Compensated { error, .. }
            | Outcome::Retryable(error)
            | Outcome::Unknown(error) => Err(error),
        }
    }

    /// The value when the work succeeded.
    pub fn value(self) -> Option<T> {
        self.into_result().ok()
    }
}
