//! The renewal: the lease moved under the fence, and the expiry and the TTL with it.

use std::time::Duration;

use idem_core::{
    StoreError, Timestamp, machine, record::Lease, store::Operation, store::RenewOutcome,
};

use super::{DynamoDbStore, FINISH_ATTEMPTS};
use crate::expressions as x;
use crate::item::{self, n};
use crate::refused::condition_failed;

/// Which write a renewal sends (see `conditional_renew` below).
#[derive(Clone, Copy)]
enum RenewPlan {
    /// The expiry moves to the new end plus the retention, and the TTL with it.
    Expiry,
    /// The expiry (as seen) covers the new end plus the retention: the lease moves, and
    /// the TTL is set from the expiry seen and the new end.
    Ttl { seen_ea: Timestamp },
}

impl DynamoDbStore {
    /// `Store::renew`: the lease, the expiry and the TTL moved in one conditional
    /// write, the old item deciding which.
    pub(super) async fn conditional_renew(
        &self,
        lease: &Lease,
        extend: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let operation = Operation::Renew;
        let now = self.now();
        let lease_until = now.saturating_add(idem_core::raw::clamp_duration(extend));
        let renewed = RenewOutcome::Renewed(lease.clone().with_lease_until(lease_until));
        // The record is kept one retention past the new end.
        let ea = machine::kept_past(lease_until, lease_until, lease.retention);
        // What the first write assumes: the expiry falls short of `ea` (every renewal moves
        // the lease end forward, and the expiry must follow). A refused write's old item
        // tells what to write instead.
        let mut plan = RenewPlan::Expiry;
        for _ in 0..FINISH_ATTEMPTS {
            let live = format!("{} AND {}", x::FENCE, x::LEASE_LIVE);
            let builder = match plan {
                RenewPlan::Expiry => {
                    let condition = format!("{live} AND {}", x::EXPIRY_SHORT);
                    self.fenced(lease, x::RENEW_AND_EXPIRY_UPDATE, &condition, now)
                        .expression_attribute_values(":ea", n(ea.as_unix_millis()))
                        .expression_attribute_values(":ttl", self.ttl(ea, lease_until))
                }
                // The TTL is computed from the expiry the condition checks, so it covers
                // both that expiry and the new end plus the margin.
                RenewPlan::Ttl { seen_ea } => {
                    let condition = format!("{live} AND #ea = :ea");
                    self.fenced(lease, x::RENEW_AND_TTL_UPDATE, &condition, now)
                        .expression_attribute_values(":ea", n(seen_ea.as_unix_millis()))
                        .expression_attribute_values(":ttl", self.ttl(seen_ea, lease_until))
                }
            };
            let old = match builder
                .expression_attribute_values(":lu", n(lease_until.as_unix_millis()))
                .send()
                .await
            {
                Ok(_) => return Ok(renewed),
                Err(err) => condition_failed(err, operation)?,
            };
            let old = match old {
                Some(old) => Some(old),
                // Some servers send no old item: read it, strongly consistent.
                None => self.read(&lease.key, operation).await?,
            };
            let Some(old) = old else {
                return Ok(RenewOutcome::Fenced);
            };
            let (mut seen, _) = item::decode(&lease.key, &old)?;
            seen.lease_until = seen.lease_until.saturating_add(self.skew_margin);
            if machine::renew(Some(&seen), lease, extend, now).outcome == RenewOutcome::Fenced {
                return Ok(RenewOutcome::Fenced);
            }
            plan = if seen.expires_at < ea {
                RenewPlan::Expiry
            } else {
                RenewPlan::Ttl {
                    seen_ea: seen.expires_at,
                }
            };
        }
        Err(StoreError::Busy {
            operation,
            source: "the item kept changing under the renewal; retry".into(),
        })
    }
}
