//! Complete and fail: the result stored under the fence, the record kept at least one
//! retention past now.

use idem_core::record::ValuePart;
use idem_core::{
    State, StoreError, Timestamp, machine, record::Lease, store::Operation, store::WriteOutcome,
};

use super::{DynamoDbStore, FINISH_ATTEMPTS, MAX_RECORD_BYTES};
use crate::errors::is_item_too_large;
use crate::expressions as x;
use crate::item::{self, b, s};
use crate::refused::{Refused, condition_failed, refused_finish};

impl DynamoDbStore {
    pub(super) async fn finish(
        &self,
        operation: Operation,
        lease: &Lease,
        response: &[u8],
        terminal: State,
    ) -> Result<WriteOutcome, StoreError> {
        let part = if terminal == State::Failed {
            ValuePart::Failure
        } else {
            ValuePart::Result
        };
        let too_large = || StoreError::TooLarge {
            part: part.clone(),
            size: response.len(),
            limit: MAX_RECORD_BYTES,
        };
        if response.len() > MAX_RECORD_BYTES {
            return Err(too_large());
        }
        // The first write assumes the expiry falls short of one retention from now: so it
        // does for a record no checkpoint or renewal moved (most work, stored within its
        // first lease). A record that one did moved one retention past the lease, and
        // the second write is the other one.
        let mut covers = false;
        for _ in 0..FINISH_ATTEMPTS {
            let now = self.now();
            let ea = machine::kept_past(now, now, lease.retention);
            let result = self
                .expiry_write(
                    lease,
                    now,
                    (ea, Timestamp::from_unix_millis(0)),
                    covers,
                    (x::FENCE, (x::FINISH_UPDATE, x::FINISH_AND_EXPIRY_UPDATE)),
                )
                .expression_attribute_values(":terminal", s(terminal.as_str()))
                .expression_attribute_values(":response", b(response))
                .send()
                .await;
            let Err(err) = result else {
                return Ok(WriteOutcome::Applied);
            };
            if is_item_too_large(&err) {
                // The response fits alone, not beside the checkpoints the item holds.
                return Err(too_large());
            }
            let old = match condition_failed(err, operation)? {
                Some(old) => Some(old),
                // Some servers send no old item: read it, strongly consistent.
                None => self.read(&lease.key, operation).await?,
            };
            let seen = old
                .map(|item| item::decode(&lease.key, &item))
                .transpose()?
                .map(|(record, _)| record);
            match refused_finish(seen, lease, terminal, now, self.skew_margin) {
                Refused::Landed => return Ok(WriteOutcome::Applied),
                Refused::Fenced => return Ok(WriteOutcome::Fenced),
                Refused::Again { expires_at } => covers = expires_at >= ea,
            }
        }
        Err(StoreError::Busy {
            operation,
            source: "the item kept changing under the write; retry".into(),
        })
    }
}
