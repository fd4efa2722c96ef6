//! The claim: a fresh record in one conditional write, a takeover in a second, and a
//! finished record answered from a read first when asked to.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use idem_core::{
    Record, State, StoreError, Timestamp, machine, raw::MAX_TOKEN, store::ClaimOutcome,
    store::ClaimRequest, store::Operation,
};

use super::DynamoDbStore;
use crate::expressions as x;
use crate::item::{self, b, n, s};
use crate::refused::{ConditionFailure, condition_failed};

/// How often a claim re-reads and retries when the item changed between its read and its
/// conditional write (a concurrent claimant won; the next read shows it).
const CLAIM_ATTEMPTS: usize = 8;

impl DynamoDbStore {
    /// `Store::claim`: a fresh record in one conditional write, else the old item
    /// through the state machine, and a takeover when it says so.
    pub(super) async fn conditional_claim(
        &self,
        request: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        if self.claim_reads_first
            && let Some(answer) = self.answer_from_read(request).await?
        {
            return Ok(answer);
        }
        for _ in 0..CLAIM_ATTEMPTS {
            let now = self.now();
            let old = match self.fresh(request, now).await? {
                Ok(claimed) => return Ok(claimed),
                Err(Some(old)) => old,
                // Some servers send no old item: read it, strongly consistent.
                Err(None) => match self.read(&request.key, Operation::Claim).await? {
                    Some(old) => old,
                    None => continue,
                },
            };
            let (mut seen, _) = item::decode(&request.key, &old)?;
            let lease_until = seen.lease_until;
            // The skew margin: to the state machine, the lease lasts that much longer.
            seen.lease_until = seen.lease_until.saturating_add(self.skew_margin);
            let answer = machine::claim(Some(&seen), request, now)
                .map_err(|refusal| StoreError::from(refusal).for_key(&request.key))?;
            match (answer.outcome, answer.write) {
                (ClaimOutcome::Claimed { resumed: true, .. }, Some(_)) => {
                    seen.lease_until = lease_until;
                    if let Some(claimed) = self.take_over(request, &seen, now).await? {
                        return Ok(claimed);
                    }
                }
                // The same attempt asking again: its lease, with its real end.
                (
                    ClaimOutcome::Claimed {
                        lease,
                        resumed,
                        steps,
                        ..
                    },
                    None,
                ) => {
                    return Ok(ClaimOutcome::claimed(
                        lease.with_lease_until(lease_until),
                        resumed,
                        steps,
                    ));
                }
                // An absent record at the last token, which `ADD` cannot start again at
                // 1: deleted first, as a purge would (unless it changed meanwhile), so
                // that the fresh write on the next turn starts at 1.
                (ClaimOutcome::Claimed { resumed: false, .. }, Some(_))
                    if seen.token >= MAX_TOKEN =>
                {
                    let cutoff = self.cutoff(now);
                    self.delete_if_purgeable(
                        Operation::Claim,
                        &self.pk(&request.key),
                        &n(seen.token),
                        now,
                        cutoff,
                    )
                    .await?;
                }
                // A fresh claim was due, yet the condition failed: the item changed.
                (_, Some(_)) => {}
                (outcome, None) => return Ok(outcome),
            }
        }
        Err(StoreError::Busy {
            operation: Operation::Claim,
            source: "the item kept changing under concurrent claims; retry".into(),
        })
    }

    /// A claim's answer from a strongly consistent read, when the item is a finished
    /// record still present: its replay, or a mismatch. A finished record never changes
    /// until it is absent, so the read is as good as the conditional write, and costs read
    /// units sized by the item instead of write units. Anything else (no item, one in
    /// progress, one absent) is `None`: the conditional write decides.
    async fn answer_from_read(
        &self,
        request: &ClaimRequest,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let Some(found) = self.read(&request.key, Operation::Claim).await? else {
            return Ok(None);
        };
        // An item that does not decode is the conditional write's to judge (it claims one
        // that is absent), so that both paths answer alike.
        let Ok((mut seen, _)) = item::decode(&request.key, &found) else {
            return Ok(None);
        };
        if seen.state == State::InProgress {
            return Ok(None);
        }
        seen.lease_until = seen.lease_until.saturating_add(self.skew_margin);
        // A finished record: never refused (only a takeover is).
        let Ok(answer) = machine::claim(Some(&seen), request, self.now()) else {
            return Ok(None);
        };
        Ok(match (answer.outcome, answer.write) {
            (
                outcome @ (ClaimOutcome::Replay { .. }
                | ClaimOutcome::ReplayFailure { .. }
                | ClaimOutcome::Mismatch),
                None,
            ) => Some(outcome),
            _ => None,
        })
    }

    async fn fresh(
        &self,
        request: &ClaimRequest,
        now: Timestamp,
    ) -> Result<Result<ClaimOutcome, ConditionFailure>, StoreError> {
        let lease_until = now.saturating_add(idem_core::raw::clamp_duration(request.lease));
        let expires_at = now.saturating_add(idem_core::raw::clamp_duration(request.retention));
        let result = self
            .update(&request.key, x::FRESH_UPDATE, x::FRESH_CONDITION)
            .expression_attribute_values(":now", n(now.as_unix_millis()))
            .expression_attribute_values(":cutoff", n(self.cutoff(now)))
            .expression_attribute_values(":fp", b(request.fingerprint.as_bytes()))
            .expression_attribute_values(":in_progress", s(State::InProgress.as_str()))
            .expression_attribute_values(":at", b(request.attempt.as_bytes()))
            .expression_attribute_values(":lu", n(lease_until.as_unix_millis()))
            .expression_attribute_values(":ea", n(expires_at.as_unix_millis()))
            .expression_attribute_values(":ttl", self.ttl(expires_at, lease_until))
            .expression_attribute_values(":no_steps", AttributeValue::M(HashMap::new()))
            .expression_attribute_values(":false", AttributeValue::Bool(false))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":max_token", n(MAX_TOKEN))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(output) => {
                let item = output.attributes().ok_or_else(|| StoreError::Corrupt {
                    key: None,
                    what: "a claim that returned no item",
                    source: None,
                })?;
                let (record, _) = item::decode(&request.key, item)?;
                Ok(Ok(ClaimOutcome::claimed(
                    machine::lease_of(&record, request.retention),
                    false,
                    record.steps,
                )))
            }
            Err(err) => Ok(Err(condition_failed(err, Operation::Claim)?)),
        }
    }

    async fn take_over(
        &self,
        request: &ClaimRequest,
        seen: &Record,
        now: Timestamp,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let lease_until = now.saturating_add(idem_core::raw::clamp_duration(request.lease));
        let expires_at = machine::kept_past(seen.expires_at, lease_until, request.retention);
        let token = seen.token.saturating_add(1);
        let result = self
            .update(&request.key, x::TAKEOVER_UPDATE, x::TAKEOVER_CONDITION)
            .expression_attribute_values(":seen_token", n(seen.token))
            .expression_attribute_values(":seen_attempt", b(seen.attempt.as_bytes()))
            .expression_attribute_values(":seen_ea", n(seen.expires_at.as_unix_millis()))
            .expression_attribute_values(":ea", n(expires_at.as_unix_millis()))
            .expression_attribute_values(":in_progress", s(State::InProgress.as_str()))
            .expression_attribute_values(":fp", b(request.fingerprint.as_bytes()))
            .expression_attribute_values(":cutoff", n(self.cutoff(now)))
            .expression_attribute_values(":now", n(now.as_unix_millis()))
            .expression_attribute_values(":token", n(token))
            .expression_attribute_values(":at", b(request.attempt.as_bytes()))
            .expression_attribute_values(":lu", n(lease_until.as_unix_millis()))
            .expression_attribute_values(":ttl", self.ttl(expires_at, lease_until))
            .expression_attribute_values(":true", AttributeValue::Bool(true))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match result {
            Ok(output) => {
                let item = output.attributes().ok_or_else(|| StoreError::Corrupt {
                    key: None,
                    what: "a takeover that returned no item",
                    source: None,
                })?;
                let (record, _) = item::decode(&request.key, item)?;
                Ok(Some(ClaimOutcome::claimed(
                    machine::lease_of(&record, request.retention),
                    true,
                    record.steps,
                )))
            }
            // Another claimant changed the item first: read it again.
            Err(err) => condition_failed(err, Operation::Claim).map(|_| None),
        }
    }
}
