//! The execution's result: the room it has in the record, and the result a store writes
//! inside the caller's own transaction.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Context, lock};
use crate::driver::error::{CannotStore, Interrupted, Reason};
use crate::record::ValuePart;
use crate::store::Completion;

impl Context {
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
    /// [`WorkError::Interrupted`](crate::WorkError::Interrupted) when `value` cannot be
    /// stored (too large, not serialisable); the driver stores that as the permanent
    /// failure. Also when the execution stores raw bytes
    /// ([`Idempotency::execute_bytes`](crate::Idempotency::execute_bytes)).
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
        crate::driver::wire::from_json::<T>(&plain).map_err(|_| unserializable())?;
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
