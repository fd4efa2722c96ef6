//! The `Store` trait: one method per transition, each one atomic native operation.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    ClaimOutcome, ClaimRequest, Key, Lease, Record, RenewOutcome, StepName, StoreError,
    WriteOutcome,
};

/// Where idempotency records live.
///
/// **The contract.** Every method is one atomic operation on the backend (one statement,
/// one script, one conditional write, one transaction) whose answer equals what the pure
/// state machine in [`crate::machine`] answers for the record as it was just before,
/// at the store's clock. Expected outcomes are values; only backend failures are errors.
/// Run `idem-testkit`'s conformance suite to check an implementation.
///
/// **Fencing.** Every write after a claim carries the [`Lease`] and applies only while the
/// record is unexpired, in progress, and carries the lease's token *and* attempt id;
/// otherwise it answers [`WriteOutcome::Fenced`] and changes nothing.
///
/// **Time.** `now` is the store's clock: the database server's where it has one.
/// A lease is live while `now < lease_until`; a record is expired once `now >= expires_at`
/// and then counts as absent everywhere.
///
/// Usable as `Arc<dyn Store>`:
///
/// ```
/// use std::sync::Arc;
/// use idem_core::{MemoryStore, Store};
///
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// # let _ = store;
/// ```
#[async_trait]
pub trait Store: Send + Sync {
    /// Claims `request.key` for `request.attempt`.
    ///
    /// - No record, or an expired one: writes a fresh in-progress record (token = the
    ///   expired record's token + 1, or 1; steps cleared; `expires_at = now + retention`;
    ///   `lease_until = now + lease`) and answers [`ClaimOutcome::Claimed`] with
    ///   `resumed: false`.
    /// - An unexpired record with another fingerprint: [`ClaimOutcome::Mismatch`], whatever
    ///   its state.
    /// - Completed: [`ClaimOutcome::Replay`] with the stored response, byte for byte.
    /// - Failed: [`ClaimOutcome::ReplayFailure`] with the stored response, byte for byte.
    /// - In progress with a live lease held by the same attempt id: the same lease again
    ///   (`Claimed`, `resumed: false`, stored steps), writing nothing.
    /// - In progress with a live lease: [`ClaimOutcome::InFlight`] with the time left.
    /// - In progress with an expired lease: takeover: token + 1, the new attempt id,
    ///   `lease_until = now + lease`, steps kept, `Claimed` with `resumed: true`.
    /// - Exactly one of any number of concurrent claims on a fresh key (or of a takeover)
    ///   is `Claimed`.
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError>;

    /// Stores `response` as the result of the work and marks the record Completed.
    ///
    /// - Applies only while the fence holds (see the trait docs); otherwise `Fenced`.
    /// - Keeps the fingerprint, token, steps and times.
    /// - Retried by the same owner after the first call landed (record Completed with the
    ///   lease's token and attempt): `Applied`, writing nothing.
    /// - A response larger than the store can hold is [`StoreError::ResponseTooLarge`] and
    ///   writes nothing.
    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError>;

    /// Stores `response` as a permanent failure and marks the record Failed.
    ///
    /// - Exactly as [`Store::complete`], with the state Failed.
    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError>;

    /// Ends the lease now so that the next claim takes over at once.
    ///
    /// - Applies only while the fence holds; otherwise `Fenced`.
    /// - Sets `lease_until = now`; keeps the token, attempt and steps.
    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError>;

    /// Extends the lease (a heartbeat).
    ///
    /// - Applies only while the fence holds; otherwise [`RenewOutcome::Fenced`].
    /// - Sets `lease_until = now + extend` and answers the lease with its new end.
    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError>;

    /// Records a named checkpoint for multi-step work.
    ///
    /// - Applies only while the fence holds; otherwise `Fenced`.
    /// - Sets `steps[step] = value`, replacing an earlier value of the same step.
    /// - Steps survive takeovers and are cleared when an expired record is claimed afresh.
    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError>;

    /// Reads a record for inspection.
    ///
    /// - `None` when there is no record or it is expired.
    /// - Changes nothing.
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError>;

    /// Deletes up to `limit` expired records and answers how many it deleted.
    ///
    /// - Deletes only records with `now >= expires_at`.
    /// - Never deletes an in-progress record whose lease is live.
    /// - Safe to run from many processes at once.
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError>;

    /// The largest response this store can hold, when it has a limit below the driver's.
    ///
    /// - `None` (the default): no limit of its own.
    fn max_response_bytes(&self) -> Option<usize> {
        None
    }
}

macro_rules! forward_store {
    ($($pointer:ty),*) => {$(
        #[async_trait]
        impl<S: Store + ?Sized> Store for $pointer {
            async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
                (**self).claim(request).await
            }
            async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
                (**self).complete(lease, response).await
            }
            async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
                (**self).fail(lease, response).await
            }
            async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
                (**self).release(lease).await
            }
            async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
                (**self).renew(lease, extend).await
            }
            async fn checkpoint(&self, lease: &Lease, step: &StepName, value: &[u8]) -> Result<WriteOutcome, StoreError> {
                (**self).checkpoint(lease, step, value).await
            }
            async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
                (**self).get(key).await
            }
            async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
                (**self).purge_expired(limit).await
            }
            fn max_response_bytes(&self) -> Option<usize> {
                (**self).max_response_bytes()
            }
        }
    )*};
}

forward_store!(Arc<S>, Box<S>, &S);
