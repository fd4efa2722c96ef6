//! The purge: a `Scan` of this prefix's absent items that goes on where the last call
//! stopped, and a conditional delete of each.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use idem_core::{State, StoreError, Timestamp, store::Operation};

use super::DynamoDbStore;
use crate::errors::map;
use crate::expressions::{self as x, names};
use crate::item::{self, n, s};

/// How many conditional deletes a purge has in flight at once: one at a time, a purge
/// runs at one item per round trip.
const PURGE_CONCURRENCY: usize = 16;

/// Puts the purge's position back when a call ends, however it ends (a return, an error,
/// a dropped future): at the page it was working on, or where it stopped.
struct ResumeGuard<'a> {
    store: &'a DynamoDbStore,
    at: Option<HashMap<String, AttributeValue>>,
}

impl Drop for ResumeGuard<'_> {
    fn drop(&mut self) {
        *self.store.purge_position() = self.at.take();
    }
}

impl DynamoDbStore {
    /// `Store::purge_expired`: a `Scan` of the absent items of this prefix, going on
    /// from where the last call stopped, and a conditional delete of each.
    pub(super) async fn conditional_purge(&self, limit: usize) -> Result<usize, StoreError> {
        // A call goes on from where the last one stopped, so that a purge in batches reads
        // the table once per pass (a page again when a call stopped inside it) instead of
        // again from the top for every batch. A call that reaches the end of the table
        // stops there, and the next starts at the top: a record that became absent behind
        // the position waits for the next pass. A call that stops inside a page, fails or
        // is dropped leaves the position at the start of that page: never at an item it
        // deleted, which DynamoDB Local does not always scan on from.
        let now = self.now();
        let cutoff = self.cutoff(now);
        let filter_names = names(&[x::PURGEABLE, "#tk"]);
        let mut purged = 0;
        let mut resume = ResumeGuard {
            store: self,
            at: self.purge_position().take(),
        };
        while purged < limit {
            let page_start = resume.at.clone();
            let page = self
                .client
                .scan()
                .table_name(self.table.as_str())
                .filter_expression(x::PURGEABLE)
                .projection_expression("#pk, #tk")
                .set_expression_attribute_names(Some(filter_names.clone()))
                .expression_attribute_values(":prefix", s(&self.namespace))
                .expression_attribute_values(":now", n(now.as_unix_millis()))
                .expression_attribute_values(":in_progress", s(State::InProgress.as_str()))
                .expression_attribute_values(":cutoff", n(cutoff))
                .consistent_read(true)
                .set_exclusive_start_key(resume.at.clone())
                .send()
                .await
                .map_err(|err| map(Operation::PurgeExpired, err))?;
            let found: Vec<(&AttributeValue, &AttributeValue)> = page
                .items()
                .iter()
                .filter_map(|item| Some((item.get(item::PK)?, item.get(item::TOKEN)?)))
                .collect();
            let mut looked_at = 0;
            for batch in found.chunks(PURGE_CONCURRENCY) {
                let batch = &batch[..batch.len().min(limit - purged)];
                if batch.is_empty() {
                    break;
                }
                let deletes = batch.iter().map(|(pk, token)| {
                    self.delete_if_purgeable(Operation::PurgeExpired, pk, token, now, cutoff)
                });
                for deleted in futures_util::future::join_all(deletes).await {
                    if deleted? {
                        purged += 1;
                    }
                }
                looked_at += batch.len();
            }
            if looked_at < found.len() {
                // Stopped inside this page: the next call reads it again from its start,
                // where what this one deleted is gone and the rest is still there.
                resume.at = page_start;
                return Ok(purged);
            }
            match page.last_evaluated_key() {
                Some(last) => resume.at = Some(last.clone()),
                None => {
                    resume.at = None; // the end: the next call starts at the top
                    return Ok(purged);
                }
            }
        }
        Ok(purged)
    }

    fn purge_position(&self) -> std::sync::MutexGuard<'_, Option<HashMap<String, AttributeValue>>> {
        self.purge_from
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Deletes the item `pk` if it is still absent and was not claimed again since the
    /// scan (or the claim: `operation`) saw `token`; answers whether it did.
    pub(super) async fn delete_if_purgeable(
        &self,
        operation: Operation,
        pk: &AttributeValue,
        token: &AttributeValue,
        now: Timestamp,
        cutoff: u64,
    ) -> Result<bool, StoreError> {
        let condition = x::PURGEABLE_UNCHANGED;
        let deleted = self
            .client
            .delete_item()
            .table_name(self.table.as_str())
            .key(item::PK, pk.clone())
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names(&[condition])))
            .expression_attribute_values(":token", token.clone())
            .expression_attribute_values(":prefix", s(&self.namespace))
            .expression_attribute_values(":now", n(now.as_unix_millis()))
            .expression_attribute_values(":in_progress", s(State::InProgress.as_str()))
            .expression_attribute_values(":cutoff", n(cutoff))
            .send()
            .await;
        match deleted {
            Ok(_) => Ok(true),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Ok(false)
            }
            Err(err) => Err(map(operation, err)),
        }
    }
}
