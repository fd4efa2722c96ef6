//! The operator's side of the DynamoDB store: a paged `Scan` of the store's prefix for
//! listing and counting, conditional writes for the release and the deletion.
//!
//! Cost: `list` and `stats` read the whole table, a page of `Scan` at a time, holding no
//! more than a page, the listing being chosen and a count per scope. The scan returns
//! each item without its response and steps, but still consumes read capacity for every
//! whole item (DynamoDB bills what it reads, not what it returns); a listing then reads
//! its page's items whole. Fine for an operator's occasional look; when a table holds
//! millions of items or many prefixes, a global secondary index keyed by the prefix (and
//! sorted by creation) would make listing read only the store's own items.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use idem_core::{
    Admin, Key, Record, State, StoreError, admin::ListQuery, admin::Page, admin::ReleaseKeyOutcome,
    admin::Stats, machine, raw::MAX_TOKEN, raw::PageSelector, raw::Tally, raw::storage_name,
    record::AttemptId, store::Operation,
};

use crate::errors::map;
use crate::expressions::names;
use crate::item::{self, b, n, s};
use crate::store::DynamoDbStore;

/// How often a release re-reads when the item changed between its read and its write.
const RELEASE_ATTEMPTS: usize = 8;

impl DynamoDbStore {
    /// Calls `each` with every record under the prefix, read without its response and
    /// steps (a paged, consistent `Scan`). Answers how many items of this store's layout
    /// could not be read as a record: they are skipped, so that one odd item does not
    /// hide the rest.
    async fn each_summary(
        &self,
        operation: Operation,
        mut each: impl FnMut(Record),
    ) -> Result<u64, StoreError> {
        const PROJECTION: &str = "#pk, #fp, #st, #tk, #at, #lu, #ca, #ea";
        const FILTER: &str = "begins_with(#pk, :prefix)";
        let mut unreadable = 0;
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let page = self
                .client()
                .scan()
                .table_name(self.table_name())
                .filter_expression(FILTER)
                .projection_expression(PROJECTION)
                .set_expression_attribute_names(Some(names(&[FILTER, PROJECTION])))
                .expression_attribute_values(":prefix", s(self.namespace()))
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|err| map(operation, err))?;
            for found in page.items() {
                let Some(AttributeValue::S(pk)) = found.get(item::PK) else {
                    continue;
                };
                let Ok(key) = storage_name::parse_namespaced_key_name(self.prefix(), pk) else {
                    continue;
                };
                match item::decode(&key, found) {
                    Ok((record, _)) => each(record),
                    Err(err) => {
                        unreadable += 1;
                        tracing::warn!(error = %err, "skipped an item that is not a readable record");
                    }
                }
            }
            match page.last_evaluated_key() {
                Some(last) => start = Some(last.clone()),
                None => return Ok(unreadable),
            }
        }
    }
}

#[async_trait]
impl Admin for DynamoDbStore {
    async fn list(&self, query: &ListQuery) -> Result<Page, StoreError> {
        let now = self.clock_now();
        let mut selector = PageSelector::new(query, now)?;
        self.each_summary(Operation::List, |record| selector.offer(record))
            .await?;
        // The page's items whole (responses and steps); the cursor stays the one the
        // selection found, so an item that changed or went since the scan is left out of
        // this page without ending the listing.
        let plan = selector.plan();
        let mut whole = Vec::with_capacity(plan.keys().len());
        for key in plan.keys() {
            if let Some(found) = self.read(key, Operation::List).await? {
                match item::decode(key, &found) {
                    Ok((record, _)) => whole.push(record),
                    Err(err) => {
                        tracing::warn!(error = %err, "skipped an item that is not a readable record")
                    }
                }
            }
        }
        Ok(plan.page(whole))
    }

    async fn stats(&self, top_scopes: usize) -> Result<Stats, StoreError> {
        let mut tally = Tally::new(self.clock_now());
        let unreadable = self
            .each_summary(Operation::Stats, |record| tally.add(&record))
            .await?;
        let mut stats = tally.finish(top_scopes);
        stats.unreadable = unreadable;
        Ok(stats)
    }

    async fn release_key(&self, key: &Key) -> Result<ReleaseKeyOutcome, StoreError> {
        let attempt = AttemptId::random();
        // The fence's presence test, without the owner's token: any in-progress owner.
        // Below the last token, which no release can pass.
        let condition = "#st = :in_progress AND (#ea > :now OR #lu > :cutoff) AND #tk < :max_token";
        let update = "SET #tk = #tk + :one, #at = :at, #lu = :now";
        for _ in 0..RELEASE_ATTEMPTS {
            let now = self.clock_now();
            let result = self
                .client()
                .update_item()
                .table_name(self.table_name())
                .key(item::PK, s(&item::partition_key(self.prefix(), key)))
                .update_expression(update)
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names(&[update, condition])))
                .expression_attribute_values(":in_progress", s(State::InProgress.as_str()))
                .expression_attribute_values(":now", n(now.as_unix_millis()))
                .expression_attribute_values(":cutoff", n(self.cutoff_at(now)))
                .expression_attribute_values(":one", n(1))
                .expression_attribute_values(":max_token", n(MAX_TOKEN))
                .expression_attribute_values(":at", b(attempt.as_bytes()))
                .return_values(ReturnValue::AllNew)
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            let old = match result {
                Ok(output) => {
                    let token = match output.attributes().and_then(|a| a.get(item::TOKEN)) {
                        Some(AttributeValue::N(text)) => text.parse().ok(),
                        _ => None,
                    };
                    return token
                        .map(|token| ReleaseKeyOutcome::Released { token })
                        .ok_or(StoreError::Corrupt {
                            key: None,
                            what: "a release that returned no token",
                            source: None,
                        });
                }
                Err(err) => match err.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(failure)) => {
                        failure.item().cloned()
                    }
                    _ => return Err(map(Operation::ReleaseKey, err)),
                },
            };
            // A server may leave the old item out of a failed condition's answer (as the
            // fenced writes find): read it, so a finished record is not called missing.
            let old = match old {
                Some(old) => Some(old),
                None => self.read(key, Operation::ReleaseKey).await?,
            };
            let Some(old) = old else {
                return Ok(ReleaseKeyOutcome::NotFound);
            };
            let (mut record, _) = item::decode(key, &old)?;
            record.lease_until = record.lease_until.saturating_add(self.skew_margin_value());
            match machine::release_key(Some(&record), attempt, now)
                .map_err(|refusal| StoreError::from(refusal).for_key(key))?
                .outcome
            {
                // In progress and present after all: the item changed under the condition.
                ReleaseKeyOutcome::Released { .. } => {}
                answer => return Ok(answer),
            }
        }
        Err(StoreError::Busy {
            operation: Operation::ReleaseKey,
            source: "the item kept changing under the release; retry".into(),
        })
    }

    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        let output = self
            .client()
            .delete_item()
            .table_name(self.table_name())
            .key(item::PK, s(&item::partition_key(self.prefix(), key)))
            .return_values(ReturnValue::AllOld)
            .send()
            .await
            .map_err(|err| map(Operation::Delete, err))?;
        Ok(output.attributes().is_some_and(|a| !a.is_empty()))
    }

    async fn raw(&self, key: &Key) -> Result<Option<idem_core::admin::RawRecord>, StoreError> {
        let Some(found) = self.read(key, Operation::Get).await? else {
            return Ok(None);
        };
        let mut fields: idem_core::admin::RawRecord = found
            .iter()
            .filter(|(name, _)| name.as_str() != item::PK)
            .map(|(name, value)| {
                let shown = match value {
                    AttributeValue::B(blob) if name.as_str() == item::RESPONSE => {
                        format!("{} bytes", blob.as_ref().len())
                    }
                    AttributeValue::B(blob) => idem_core::raw::raw_text(blob.as_ref()),
                    AttributeValue::S(text) => format!("S {text:?}"),
                    AttributeValue::N(number) => format!("N {number}"),
                    AttributeValue::M(map) => format!("M with {} entries", map.len()),
                    other => format!("{other:?}"),
                };
                (name.clone(), shown)
            })
            .collect();
        fields.sort();
        Ok(Some(fields))
    }
}
