//! `DynamoDbStore`: conditional writes, one per transition.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use idem_core::{
    ClaimOutcome, ClaimRequest, Clock, Key, Lease, Operation, Record, RenewOutcome, State,
    StepName, Store, StoreError, SystemClock, Timestamp, WriteOutcome, machine,
};

use crate::errors::map;
use crate::expressions::{self as x, names};
use crate::item::{self, b, n, s};

/// The largest response the store accepts: DynamoDB refuses items over 400 KB, and the
/// rest of the item (key, times, checkpoints) needs room too.
pub const MAX_RESPONSE_BYTES: usize = 350_000;

/// The default skew margin: a takeover waits this long past the lease end, for the clocks
/// of the machines sharing the table to disagree by up to this much.
pub const DEFAULT_SKEW_MARGIN: Duration = Duration::from_secs(2);

/// How often a claim re-reads and retries when the item changed between its read and its
/// conditional write (a concurrent claimant won; the next read shows it).
const CLAIM_ATTEMPTS: usize = 8;

/// An idem [`Store`] in a DynamoDB table.
///
/// - `claim` is one conditional `UpdateItem` (fresh record when absent or expired), with
///   `ReturnValuesOnConditionCheckFailure = ALL_OLD`, so a replay, a mismatch or an
///   in-flight answer costs one round trip; a takeover adds a second conditional write
///   (a compare-and-set on the token it read). When the server sends no old item, one
///   strongly consistent `GetItem` reads it.
/// - Every fenced write is an `UpdateItem` conditioned on the token, the attempt, the
///   state and the expiry; a failed condition is an outcome, never an error.
/// - DynamoDB has no server clock, so the store reads the client's clock: a takeover
///   waits until `lease_until + skew_margin` (default 2 s). The margin protects a live
///   owner against clients whose clocks run ahead by up to the margin, at the price of
///   recovering that much later after a crash.
/// - Retention uses DynamoDB's TTL attribute (`ttl`, epoch seconds); since TTL deletes
///   lazily, every read and claim checks the expiry itself.
/// - Responses over [`MAX_RESPONSE_BYTES`] are refused before anything is written.
///
/// ```no_run
/// use idem_core::Idempotency;
/// use idem_dynamodb::DynamoDbStore;
///
/// # async fn run(client: aws_sdk_dynamodb::Client) -> Result<(), Box<dyn std::error::Error>> {
/// idem_dynamodb::create_table(&client, "idem").await?; // development and tests
/// let store = DynamoDbStore::builder(client, "idem").prefix("billing#")?.build();
/// let idem = Idempotency::new(store);
/// # let _ = idem;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct DynamoDbStore {
    client: Client,
    table: Arc<str>,
    prefix: Arc<str>,
    skew_margin: Duration,
    clock: Arc<dyn Clock>,
}

/// Settings for a [`DynamoDbStore`]; see [`DynamoDbStore::builder`].
#[must_use = "call build() to get the store"]
pub struct DynamoDbStoreBuilder {
    store: DynamoDbStore,
}

/// Why a key prefix was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PrefixError {
    /// The prefix was longer than 512 bytes (partition keys hold at most 2048).
    #[error("the key prefix is {len} bytes long, over the limit of 512")]
    TooLong {
        /// Its length.
        len: usize,
    },
}

impl DynamoDbStoreBuilder {
    /// Puts every record of this store under `prefix`, so several applications (or
    /// tests) can share one table; `purge_expired` only touches its own prefix.
    ///
    /// # Errors
    /// [`PrefixError`] when the prefix is over 512 bytes.
    pub fn prefix(mut self, prefix: &str) -> Result<Self, PrefixError> {
        if prefix.len() > 512 {
            return Err(PrefixError::TooLong { len: prefix.len() });
        }
        self.store.prefix = prefix.into();
        Ok(self)
    }

    /// How long past a lease's end a takeover waits (default 2 s); see the type's docs.
    pub fn skew_margin(mut self, margin: Duration) -> Self {
        self.store.skew_margin = margin;
        self
    }

    /// The clock the store reads (default: the system clock).
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.store.clock = Arc::new(clock);
        self
    }

    /// Builds the store.
    pub fn build(self) -> DynamoDbStore {
        self.store
    }
}

impl fmt::Debug for DynamoDbStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DynamoDbStoreBuilder")
            .field(&self.store)
            .finish()
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The conditional-check failure's old item, if this error is one; `Err` otherwise.
type ConditionFailure = Option<HashMap<String, AttributeValue>>;

fn condition_failed(
    err: aws_sdk_dynamodb::error::SdkError<
        UpdateItemError,
        aws_sdk_dynamodb::config::http::HttpResponse,
    >,
    operation: Operation,
) -> Result<ConditionFailure, StoreError> {
    match err.as_service_error() {
        Some(UpdateItemError::ConditionalCheckFailedException(failure)) => {
            Ok(failure.item().cloned())
        }
        _ => Err(map(operation, err)),
    }
}

impl DynamoDbStore {
    /// A store on `table` with the defaults (no prefix, 2 s skew margin, system clock).
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self::builder(client, table).build()
    }

    /// Starts a builder.
    pub fn builder(client: Client, table: impl Into<String>) -> DynamoDbStoreBuilder {
        DynamoDbStoreBuilder {
            store: Self {
                client,
                table: table.into().into(),
                prefix: "".into(),
                skew_margin: DEFAULT_SKEW_MARGIN,
                clock: Arc::new(SystemClock),
            },
        }
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn pk(&self, key: &Key) -> AttributeValue {
        s(&item::partition_key(&self.prefix, key))
    }

    /// An `UpdateItem` on `key` with these expressions and the names they use.
    fn update(&self, key: &Key, update: &str, condition: &str) -> UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(self.table.as_ref())
            .key(item::PK, self.pk(key))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names(&[update, condition])))
    }

    /// A fenced update: the lease's token, attempt, in progress and unexpired.
    fn fenced(&self, lease: &Lease, update: &str, now: Timestamp) -> UpdateItemFluentBuilder {
        self.update(&lease.key, update, x::FENCE)
            .expression_attribute_values(":token", n(lease.token))
            .expression_attribute_values(":at", b(lease.attempt.as_bytes()))
            .expression_attribute_values(":in_progress", s(State::InProgress.as_str()))
            .expression_attribute_values(":now", n(now.as_unix_millis()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
    }

    async fn read(
        &self,
        key: &Key,
        operation: Operation,
    ) -> Result<Option<HashMap<String, AttributeValue>>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(self.table.as_ref())
            .key(item::PK, self.pk(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|err| map(operation, err))?;
        Ok(output.item().cloned())
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    async fn fresh(
        &self,
        request: &ClaimRequest,
        now: Timestamp,
    ) -> Result<Result<ClaimOutcome, ConditionFailure>, StoreError> {
        let lease_until = now.saturating_add(request.lease);
        let expires_at = now.saturating_add(request.retention);
        let result = self
            .update(&request.key, x::FRESH_UPDATE, x::FRESH_CONDITION)
            .expression_attribute_values(":now", n(now.as_unix_millis()))
            .expression_attribute_values(":fp", b(request.fingerprint.as_bytes()))
            .expression_attribute_values(":in_progress", s(State::InProgress.as_str()))
            .expression_attribute_values(":at", b(request.attempt.as_bytes()))
            .expression_attribute_values(":lu", n(lease_until.as_unix_millis()))
            .expression_attribute_values(":ea", n(expires_at.as_unix_millis()))
            .expression_attribute_values(":ttl", n(item::ttl_seconds(expires_at, lease_until)))
            .expression_attribute_values(":no_steps", AttributeValue::M(HashMap::new()))
            .expression_attribute_values(":false", AttributeValue::Bool(false))
            .expression_attribute_values(":one", n(1))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(output) => {
                let item = output.attributes().ok_or_else(|| StoreError::Corrupt {
                    what: "a claim that returned no item",
                    source: None,
                })?;
                let (record, _) = item::decode(&request.key, item)?;
                Ok(Ok(ClaimOutcome::Claimed {
                    lease: machine::lease_of(&record),
                    resumed: false,
                    steps: record.steps,
                }))
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
        let lease_until = now.saturating_add(request.lease);
        let cutoff = Timestamp::from_unix_millis(
            now.as_unix_millis()
                .saturating_sub(millis(self.skew_margin)),
        );
        let token = seen.token.saturating_add(1);
        let result = self
            .update(&request.key, x::TAKEOVER_UPDATE, x::TAKEOVER_CONDITION)
            .expression_attribute_values(":seen_token", n(seen.token))
            .expression_attribute_values(":seen_attempt", b(seen.attempt.as_bytes()))
            .expression_attribute_values(":in_progress", s(State::InProgress.as_str()))
            .expression_attribute_values(":fp", b(request.fingerprint.as_bytes()))
            .expression_attribute_values(":cutoff", n(cutoff.as_unix_millis()))
            .expression_attribute_values(":now", n(now.as_unix_millis()))
            .expression_attribute_values(":token", n(token))
            .expression_attribute_values(":at", b(request.attempt.as_bytes()))
            .expression_attribute_values(":lu", n(lease_until.as_unix_millis()))
            .expression_attribute_values(":ttl", n(item::ttl_seconds(seen.expires_at, lease_until)))
            .expression_attribute_values(":true", AttributeValue::Bool(true))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match result {
            Ok(output) => {
                let item = output.attributes().ok_or_else(|| StoreError::Corrupt {
                    what: "a takeover that returned no item",
                    source: None,
                })?;
                let (record, _) = item::decode(&request.key, item)?;
                Ok(Some(ClaimOutcome::Claimed {
                    lease: machine::lease_of(&record),
                    resumed: true,
                    steps: record.steps,
                }))
            }
            // Another claimant changed the item first: read it again.
            Err(err) => condition_failed(err, Operation::Claim).map(|_| None),
        }
    }

    async fn finish(
        &self,
        operation: Operation,
        lease: &Lease,
        response: &[u8],
        terminal: State,
    ) -> Result<WriteOutcome, StoreError> {
        if response.len() > MAX_RESPONSE_BYTES {
            return Err(StoreError::ResponseTooLarge {
                size: response.len(),
                limit: MAX_RESPONSE_BYTES,
            });
        }
        let now = self.now();
        let result = self
            .fenced(lease, x::FINISH_UPDATE, now)
            .expression_attribute_values(":terminal", s(terminal.as_str()))
            .expression_attribute_values(":response", b(response))
            .send()
            .await;
        let Err(err) = result else {
            return Ok(WriteOutcome::Applied);
        };
        // The same owner retrying after its first try landed is not fenced.
        let old = condition_failed(err, operation)?;
        let landed = old
            .map(|item| item::decode(&lease.key, &item))
            .transpose()?
            .is_some_and(|(record, _)| {
                record.token == lease.token
                    && record.attempt == lease.attempt
                    && record.state == terminal
                    && !record.is_expired(now)
            });
        Ok(if landed {
            WriteOutcome::Applied
        } else {
            WriteOutcome::Fenced
        })
    }

    async fn fenced_write(
        &self,
        operation: Operation,
        builder: UpdateItemFluentBuilder,
    ) -> Result<WriteOutcome, StoreError> {
        match builder.send().await {
            Ok(_) => Ok(WriteOutcome::Applied),
            Err(err) => condition_failed(err, operation).map(|_| WriteOutcome::Fenced),
        }
    }
}

impl fmt::Debug for DynamoDbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbStore")
            .field("table", &self.table)
            .field("prefix", &self.prefix)
            .field("skew_margin", &self.skew_margin)
            .field("clock", &self.clock)
            .finish()
    }
}

#[async_trait]
impl Store for DynamoDbStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
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
            let answer = machine::claim(Some(&seen), request, now);
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
                    },
                    None,
                ) => {
                    return Ok(ClaimOutcome::Claimed {
                        lease: Lease {
                            lease_until,
                            ..lease
                        },
                        resumed,
                        steps,
                    });
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

    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.finish(Operation::Complete, lease, response, State::Completed)
            .await
    }

    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.finish(Operation::Fail, lease, response, State::Failed)
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        let builder = self.fenced(lease, x::RELEASE_UPDATE, self.now());
        self.fenced_write(Operation::Release, builder).await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        let now = self.now();
        let lease_until = now.saturating_add(extend);
        let result = self
            .fenced(lease, x::RENEW_UPDATE, now)
            .expression_attribute_values(":lu", n(lease_until.as_unix_millis()))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        let output = match result {
            Ok(output) => output,
            Err(err) => {
                return condition_failed(err, Operation::Renew).map(|_| RenewOutcome::Fenced);
            }
        };
        // A lease renewed past the record's TTL moves the TTL too, so DynamoDB never
        // deletes a record under a live lease (a second write, only in that case).
        let ttl = output
            .attributes()
            .and_then(|item| match item.get(item::TTL) {
                Some(AttributeValue::N(text)) => text.parse::<u64>().ok(),
                _ => None,
            })
            .unwrap_or(0);
        let wanted = item::ttl_seconds(lease_until, lease_until);
        if ttl < wanted {
            let raise = self
                .update(&lease.key, x::RAISE_TTL_UPDATE, x::RAISE_TTL_CONDITION)
                .expression_attribute_values(":token", n(lease.token))
                .expression_attribute_values(":at", b(lease.attempt.as_bytes()))
                .expression_attribute_values(":ttl", n(wanted));
            if self.fenced_write(Operation::Renew, raise).await? == WriteOutcome::Fenced {
                return Ok(RenewOutcome::Fenced);
            }
        }
        Ok(RenewOutcome::Renewed(Lease {
            lease_until,
            ..lease.clone()
        }))
    }

    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        let builder = self
            .fenced(lease, x::CHECKPOINT_UPDATE, self.now())
            .expression_attribute_names("#step", step.as_str())
            .expression_attribute_values(":value", b(value));
        self.fenced_write(Operation::Checkpoint, builder).await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let Some(found) = self.read(key, Operation::Get).await? else {
            return Ok(None);
        };
        let (record, _) = item::decode(key, &found)?;
        Ok(machine::visible(Some(&record), self.now()).cloned())
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let now = self.now();
        let cutoff = now
            .as_unix_millis()
            .saturating_sub(millis(self.skew_margin));
        let filter_names = names(&[x::PURGEABLE, "#tk"]);
        let mut purged = 0;
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let page = self
                .client
                .scan()
                .table_name(self.table.as_ref())
                .filter_expression(x::PURGEABLE)
                .projection_expression("#pk, #tk")
                .set_expression_attribute_names(Some(filter_names.clone()))
                .expression_attribute_values(":prefix", s(&self.prefix))
                .expression_attribute_values(":now", n(now.as_unix_millis()))
                .expression_attribute_values(":in_progress", s(State::InProgress.as_str()))
                .expression_attribute_values(":cutoff", n(cutoff))
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|err| map(Operation::PurgeExpired, err))?;
            for found in page.items() {
                if purged >= limit {
                    return Ok(purged);
                }
                let (Some(pk), Some(token)) = (found.get(item::PK), found.get(item::TOKEN)) else {
                    continue;
                };
                // Deleted only if still purgeable and not claimed again since the scan.
                let condition = format!("#tk = :token AND {}", x::PURGEABLE);
                let deleted = self
                    .client
                    .delete_item()
                    .table_name(self.table.as_ref())
                    .key(item::PK, pk.clone())
                    .condition_expression(condition.clone())
                    .set_expression_attribute_names(Some(names(&[condition.as_str()])))
                    .expression_attribute_values(":token", token.clone())
                    .expression_attribute_values(":prefix", s(&self.prefix))
                    .expression_attribute_values(":now", n(now.as_unix_millis()))
                    .expression_attribute_values(":in_progress", s(State::InProgress.as_str()))
                    .expression_attribute_values(":cutoff", n(cutoff))
                    .send()
                    .await;
                match deleted {
                    Ok(_) => purged += 1,
                    Err(err)
                        if err
                            .as_service_error()
                            .is_some_and(|e| e.is_conditional_check_failed_exception()) => {}
                    Err(err) => return Err(map(Operation::PurgeExpired, err)),
                }
            }
            match page.last_evaluated_key() {
                Some(last) if purged < limit => start = Some(last.clone()),
                _ => return Ok(purged),
            }
        }
    }

    fn max_response_bytes(&self) -> Option<usize> {
        Some(MAX_RESPONSE_BYTES)
    }
}
