//! `DynamoDbStore`: conditional writes, one per transition.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use idem_core::record::ValuePart;
use idem_core::{
    Clock, Key, Record, State, Store, StoreError, SystemClock, Timestamp, key::StepName, machine,
    raw::duration_millis, raw::storage_name, record::Lease, store::ClaimOutcome,
    store::ClaimRequest, store::Expiry, store::Operation, store::RenewOutcome, store::WriteOutcome,
};

use crate::builder::DynamoDbStoreBuilder;
use crate::errors::{is_item_too_large, map};
use crate::expressions::{self as x, names};
use crate::item::{self, b, n, s};
use crate::refused::{ConditionFailure, Refused, UpdateError, condition_failed, refused_finish};
use crate::table::{TableName, TableNameError};

/// The most a record's response and checkpoints (names and values together) may hold:
/// DynamoDB refuses items over 400 KB (409 600 bytes), and the rest of the item (the
/// partition key, times, attribute names) needs room too.
pub const MAX_RECORD_BYTES: usize = 400_000;

/// The default skew margin: a takeover waits this long past the lease end, for the clocks
/// of the machines sharing the table to disagree by up to this much.
pub const DEFAULT_SKEW_MARGIN: Duration = Duration::from_secs(2);

/// How often a claim re-reads and retries when the item changed between its read and its
/// conditional write (a concurrent claimant won; the next read shows it).
const CLAIM_ATTEMPTS: usize = 8;

/// An idem [`Store`] in a DynamoDB table.
///
/// - `claim` is one conditional `UpdateItem` (fresh record when absent: expired and held
///   by no live lease), with `ReturnValuesOnConditionCheckFailure = ALL_OLD`, so a replay,
///   a mismatch or an in-flight answer costs one round trip; a takeover adds a second
///   conditional write (a compare-and-set on the token it read). When the server sends no
///   old item, one strongly consistent `GetItem` reads it. With
///   [`claim_reads_first`](crate::DynamoDbStoreBuilder::claim_reads_first), a
///   `GetItem` comes first and answers a finished record's replay or mismatch alone.
/// - Every fenced write is an `UpdateItem` conditioned on the token, the attempt, the
///   state and presence; a failed condition is an outcome, never an error. A renewal is
///   one conditional write; it also moves the TTL, in the same write, when the new lease
///   outlives it. A complete or fail stored late (past the retention, a live lease
///   holding the record) moves the expiry to one retention after now, and the TTL with
///   it, in the same conditional write.
/// - DynamoDB has no server clock, so the store reads the client's clock: a takeover
///   waits until `lease_until + skew_margin` (default 2 s). The margin protects a live
///   owner against clients whose clocks run ahead by up to the margin, at the price of
///   recovering that much later after a crash.
/// - Retention uses DynamoDB's TTL attribute (`ttl`, epoch seconds), set to the later of
///   the expiry and the lease end plus the skew margin, so DynamoDB never deletes a
///   record a live lease holds. TTL deletes lazily (typically within days), so every read
///   and claim checks presence itself: the [`Expiry`] is [`Expiry::Eventually`].
///   `purge_expired` hurries it with a `Scan` of the whole table (filtered to this
///   store's prefix): it reads every item, so run it rarely or not at all.
/// - A key prefix lets several applications share a table; prefixes that are prefixes of
///   each other (`app`, `app1`) never share an item, and a purge reaches only its own.
/// - A response or checkpoint that cannot fit in the item is refused before anything is
///   written ([`MAX_RECORD_BYTES`]; the driver checks the whole record, response and
///   checkpoints together, before writing).
///
/// ```no_run
/// use idem_core::Idempotency;
/// use idem_dynamodb::DynamoDbStore;
///
/// # async fn run(client: aws_sdk_dynamodb::Client) -> Result<(), Box<dyn std::error::Error>> {
/// idem_dynamodb::create_table(&client, "idem").await?; // development and tests
/// let store = DynamoDbStore::builder(client, "idem")?.prefix("billing")?.build();
/// let idem = Idempotency::new(store);
/// # let _ = idem;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct DynamoDbStore {
    client: Client,
    table: TableName,
    pub(crate) prefix: Arc<str>,
    /// `storage_name::namespace_prefix(prefix)`: what every partition key of this store
    /// begins with, and no other prefix's does.
    pub(crate) namespace: Arc<str>,
    pub(crate) skew_margin: Duration,
    pub(crate) clock: Arc<dyn Clock>,
    /// Whether a claim reads the item first and answers a finished one from the read.
    pub(crate) claim_reads_first: bool,
    /// Where the purge's `Scan` goes on from: the key of the last item it looked at, or
    /// `None` to start at the top. Shared by clones.
    purge_from: Arc<std::sync::Mutex<Option<HashMap<String, AttributeValue>>>>,
}

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

/// How often a write that also keeps the record (complete, fail, release, renew,
/// checkpoint) is sent again when the item was not as the write assumed: the expiry it
/// assumed, or the lease end it assumed.
const FINISH_ATTEMPTS: usize = 3;

/// Which write a renewal sends (see `Store::renew` below).
#[derive(Clone, Copy)]
enum RenewPlan {
    /// The expiry moves to the new end plus the retention, and the TTL with it.
    Expiry,
    /// The expiry (as seen) covers the new end plus the retention: the lease moves, and
    /// the TTL is set from the expiry seen and the new end.
    Ttl { seen_ea: Timestamp },
}

impl DynamoDbStore {
    /// A store on `table` with the defaults (no prefix, 2 s skew margin, system clock).
    ///
    /// # Errors
    /// [`TableNameError`] for a name DynamoDB would refuse (3 to 255 characters: ASCII
    /// letters, digits, `_`, `-`, `.`).
    pub fn new(client: Client, table: &str) -> Result<Self, TableNameError> {
        Ok(Self::builder(client, table)?.build())
    }

    /// Starts a builder.
    ///
    /// # Errors
    /// [`TableNameError`] for a name DynamoDB would refuse.
    pub fn builder(client: Client, table: &str) -> Result<DynamoDbStoreBuilder, TableNameError> {
        Ok(DynamoDbStoreBuilder {
            store: Self {
                client,
                table: TableName::parse(table)?,
                prefix: "".into(),
                namespace: storage_name::namespace_prefix("").into(),
                skew_margin: DEFAULT_SKEW_MARGIN,
                clock: Arc::new(SystemClock),
                claim_reads_first: false,
                purge_from: Arc::default(),
            },
        })
    }

    fn purge_position(&self) -> std::sync::MutexGuard<'_, Option<HashMap<String, AttributeValue>>> {
        self.purge_from
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Deletes the item `pk` if it is still absent and was not claimed again since the
    /// scan saw `token`; answers whether it did.
    async fn delete_if_purgeable(
        &self,
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
            Err(err) => Err(map(Operation::PurgeExpired, err)),
        }
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub(crate) fn table_name(&self) -> &str {
        self.table.as_str()
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn namespace(&self) -> &str {
        &self.namespace
    }

    pub(crate) fn clock_now(&self) -> Timestamp {
        self.clock.now()
    }

    pub(crate) fn skew_margin_value(&self) -> Duration {
        self.skew_margin
    }

    pub(crate) fn cutoff_at(&self, now: Timestamp) -> u64 {
        self.cutoff(now)
    }

    fn pk(&self, key: &Key) -> AttributeValue {
        s(&item::partition_key(&self.prefix, key))
    }

    /// `now - skew_margin`: a lease that ended after it may still be live on a client
    /// whose clock runs ahead.
    fn cutoff(&self, now: Timestamp) -> u64 {
        now.as_unix_millis()
            .saturating_sub(duration_millis(self.skew_margin))
    }

    fn ttl(&self, expires_at: Timestamp, lease_until: Timestamp) -> AttributeValue {
        n(item::ttl_seconds(expires_at, lease_until, self.skew_margin))
    }

    /// An `UpdateItem` on `key` with these expressions and the names they use.
    fn update(&self, key: &Key, update: &str, condition: &str) -> UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(self.table.as_str())
            .key(item::PK, self.pk(key))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names(&[update, condition])))
    }

    /// A fenced update: the lease's token, attempt, in progress and present.
    fn fenced(
        &self,
        lease: &Lease,
        update: &str,
        condition: &str,
        now: Timestamp,
    ) -> UpdateItemFluentBuilder {
        self.update(&lease.key, update, condition)
            .expression_attribute_values(":token", n(lease.token))
            .expression_attribute_values(":at", b(lease.attempt.as_bytes()))
            .expression_attribute_values(":in_progress", s(State::InProgress.as_str()))
            .expression_attribute_values(":now", n(now.as_unix_millis()))
            .expression_attribute_values(":cutoff", n(self.cutoff(now)))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
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

    pub(crate) async fn read(
        &self,
        key: &Key,
        operation: Operation,
    ) -> Result<Option<HashMap<String, AttributeValue>>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(self.table.as_str())
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
        let answer = machine::claim(Some(&seen), request, self.now());
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

    async fn finish(
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

    /// A fenced write that also keeps the record until `ea` at least (`expires_at =
    /// max(expires_at, ea)`), `(ea, lease_until)` being the expiry and the lease end the
    /// TTL must cover: `updates.0` beside the condition that the expiry covers `ea` when
    /// `covers`, else `updates.1` (which sets `:ea` and `:ttl`) beside the condition that
    /// it does not. DynamoDB has no `max`; a refused write tells the caller which to send
    /// next.
    fn expiry_write(
        &self,
        lease: &Lease,
        now: Timestamp,
        (ea, lease_until): (Timestamp, Timestamp),
        covers: bool,
        (fence, updates): (&str, (&str, &str)),
    ) -> UpdateItemFluentBuilder {
        let (update, expiry) = if covers {
            (updates.0, x::EXPIRY_COVERS)
        } else {
            (updates.1, x::EXPIRY_SHORT)
        };
        let builder = self
            .fenced(lease, update, &format!("{fence} AND {expiry}"), now)
            .expression_attribute_values(":ea", n(ea.as_unix_millis()));
        if covers {
            builder
        } else {
            builder.expression_attribute_values(":ttl", self.ttl(ea, lease_until))
        }
    }
}

impl fmt::Debug for DynamoDbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoDbStore")
            .field("table", &self.table)
            .field("prefix", &self.prefix)
            .field("skew_margin", &self.skew_margin)
            .field("claim_reads_first", &self.claim_reads_first)
            .field("clock", &self.clock)
            .finish()
    }
}

#[async_trait]
impl Store for DynamoDbStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
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

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
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

    async fn checkpoint(
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

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let Some(found) = self.read(key, Operation::Get).await? else {
            return Ok(None);
        };
        let (record, _) = item::decode(key, &found)?;
        let mut seen = record.clone();
        seen.lease_until = seen.lease_until.saturating_add(self.skew_margin);
        Ok(machine::visible(Some(&seen), self.now()).map(|_| record))
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
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
                let deletes = batch
                    .iter()
                    .map(|(pk, token)| self.delete_if_purgeable(pk, token, now, cutoff));
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

    fn expiry(&self) -> Expiry {
        Expiry::Eventually
    }

    fn max_record_bytes(&self) -> Option<usize> {
        Some(MAX_RECORD_BYTES)
    }
}
