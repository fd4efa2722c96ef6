//! The checkpoint: a step's value stored under the fence, the record kept one retention
//! past the end of its lease.

use idem_core::record::ValuePart;
use idem_core::{
    StoreError, key::StepName, machine, record::Lease, store::Operation, store::WriteOutcome,
};

use super::{DynamoDbStore, FINISH_ATTEMPTS, MAX_RECORD_BYTES};
use crate::errors::is_item_too_large;
use crate::expressions as x;
use crate::item::{self, b, n};
use crate::refused::condition_failed;

impl DynamoDbStore {
    /// `Store::checkpoint`: the step and the expiry in one conditional write, the
    /// old item deciding which.
    pub(super) async fn conditional_checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        let size = step.as_str().len() + value.len();
        let too_large = || StoreError::TooLarge {
            part: ValuePart::Step(step.as_str().to_owned()),
            size,
            limit: MAX_RECORD_BYTES,
        };
        if size > MAX_RECORD_BYTES {
            return Err(too_large());
        }
        let operation = Operation::Checkpoint;
        // The record is kept one retention past its lease's end, the item's: the lease's
        // end as the owner knows it is the guess of the first write (its renewals moved
        // the expiry with it), which holds only while the item's end is the same. An
        // older copy of the lease (the same attempt claimed the key again after it was
        // purged: same token, later end) must not keep the record short of its own end.
        let fence = format!("{} AND {}", x::FENCE, x::LEASE_END_IS);
        let mut lease_until = lease.lease_until;
        let mut covers = true;
        for _ in 0..FINISH_ATTEMPTS {
            let now = self.now();
            let ea = machine::kept_past(lease_until, lease_until, lease.retention);
            let builder = self
                .expiry_write(
                    lease,
                    now,
                    (ea, lease_until),
                    covers,
                    (
                        &fence,
                        (x::CHECKPOINT_UPDATE, x::CHECKPOINT_AND_EXPIRY_UPDATE),
                    ),
                )
                .expression_attribute_values(":lu", n(lease_until.as_unix_millis()))
                .expression_attribute_names("#step", step.as_str())
                .expression_attribute_values(":value", b(value));
            let old = match builder.send().await {
                Ok(_) => return Ok(WriteOutcome::Applied),
                Err(err) if is_item_too_large(&err) => return Err(too_large()),
                Err(err) => condition_failed(err, operation)?,
            };
            let old = match old {
                Some(old) => Some(old),
                // Some servers send no old item: read it, strongly consistent.
                None => self.read(&lease.key, operation).await?,
            };
            let Some(old) = old else {
                return Ok(WriteOutcome::Fenced);
            };
            let (seen, _) = item::decode(&lease.key, &old)?;
            let mut counted = seen.clone();
            counted.lease_until = counted.lease_until.saturating_add(self.skew_margin);
            if machine::checkpoint(Some(&counted), lease, step, value, now)
                .write
                .is_none()
            {
                return Ok(WriteOutcome::Fenced);
            }
            lease_until = seen.lease_until;
            covers =
                seen.expires_at >= machine::kept_past(lease_until, lease_until, lease.retention);
        }
        Err(StoreError::Busy {
            operation,
            source: "the item kept changing under the checkpoint; retry".into(),
        })
    }
}
