//! The release: a record without steps forgotten at once, one with steps left for a
//! takeover.

use idem_core::{
    StoreError, Timestamp, machine, record::Lease, store::Operation, store::WriteOutcome,
};

use super::{DynamoDbStore, FINISH_ATTEMPTS};
use crate::expressions as x;
use crate::item::{self, n};
use crate::refused::{UpdateError, condition_failed};

impl DynamoDbStore {
    /// `Store::release`: one write for a record without steps and a live lease,
    /// else the old item decides the next.
    pub(super) async fn conditional_release(
        &self,
        lease: &Lease,
    ) -> Result<WriteOutcome, StoreError> {
        let operation = Operation::Release;
        // Most releases find no step and a live lease: one write.
        let mut old = match self.forget(lease, true, self.now()).await {
            Ok(_) => return Ok(WriteOutcome::Applied),
            Err(err) => condition_failed(err, operation)?,
        };
        // Steps, or a fence that failed: the old item tells which, and whether the lease
        // has ended already.
        for _ in 0..FINISH_ATTEMPTS {
            let item = match old {
                Some(item) => Some(item),
                // Some servers send no old item: read it, strongly consistent.
                None => self.read(&lease.key, operation).await?,
            };
            let Some(item) = item else {
                return Ok(WriteOutcome::Fenced);
            };
            let (seen, _) = item::decode(&lease.key, &item)?;
            let now = self.now();
            let mut counted = seen.clone();
            counted.lease_until = counted.lease_until.saturating_add(self.skew_margin);
            if machine::release(Some(&counted), lease, now).write.is_none() {
                return Ok(WriteOutcome::Fenced);
            }
            // No step, and the fence holds: the lease ran out before the release (it
            // keeps its end), or the item changed since the first write was refused.
            if seen.steps.is_empty() {
                let live = seen.lease_until.as_unix_millis() > self.cutoff(now);
                match self.forget(lease, live, now).await {
                    Ok(_) => return Ok(WriteOutcome::Applied),
                    Err(err) => old = condition_failed(err, operation)?,
                }
                continue;
            }
            // A lease that ran out already keeps its end, and the expiry stays: the fence
            // held in the item just read, and there is nothing to write.
            if seen.lease_until <= now {
                return Ok(WriteOutcome::Applied);
            }
            let condition = format!("{} AND {}", x::FENCE, x::LEASE_NOT_ENDED);
            let builder = self.fenced(lease, x::RELEASE_UPDATE, &condition, now);
            match builder.send().await {
                Ok(_) => return Ok(WriteOutcome::Applied),
                Err(err) => old = condition_failed(err, operation)?,
            }
        }
        Err(StoreError::Busy {
            operation,
            source: "the item kept changing under the release; retry".into(),
        })
    }

    /// The release of a record without steps: its lifetime ends now, and its lease at the
    /// cutoff when `live`, or where it ended already (`min(lease_until, cutoff)`, each
    /// under the condition that makes it the right write).
    async fn forget(
        &self,
        lease: &Lease,
        live: bool,
        now: Timestamp,
    ) -> Result<aws_sdk_dynamodb::operation::update_item::UpdateItemOutput, UpdateError> {
        let (update, lease_state) = if live {
            (x::RELEASE_FORGET_UPDATE, x::LEASE_LIVE)
        } else {
            (x::RELEASE_FORGET_ENDED_UPDATE, x::LEASE_ENDED)
        };
        let condition = format!(
            "{} AND {} AND {lease_state}",
            x::FENCE,
            x::RELEASE_WITHOUT_STEPS
        );
        self.fenced(lease, update, &condition, now)
            .expression_attribute_values(":zero", n(0))
            .send()
            .await
    }
}
