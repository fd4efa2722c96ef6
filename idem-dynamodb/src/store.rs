//! `DynamoDbStore`: conditional writes, one per transition.
//!
//! - this file: the store, its settings, the fenced writes every operation builds, `get`,
//!   and the [`Store`] implementation, which hands each operation to its file below.
//! - `claim.rs`, `finish.rs` (complete and fail), `release.rs`, `renew.rs`,
//!   `checkpoint.rs`, `purge.rs`: one operation each.

mod checkpoint;
mod claim;
mod finish;
mod purge;
mod release;
mod renew;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use idem_core::{
    Clock, Key, Record, State, Store, StoreError, SystemClock, Timestamp, key::StepName, machine,
    raw::duration_millis, raw::storage_name, record::Lease, store::ClaimOutcome,
    store::ClaimRequest, store::Expiry, store::Operation, store::RenewOutcome, store::WriteOutcome,
};

use crate::builder::DynamoDbStoreBuilder;
use crate::errors::map;
use crate::expressions::{self as x, names};
use crate::item::{self, b, n, s};
use crate::table::{TableName, TableNameError};

/// The most a record's response and checkpoints (names and values together) may hold:
/// DynamoDB refuses items over 400 KB (409 600 bytes), and the rest of the item (the
/// partition key, times, attribute names) needs room too.
pub const MAX_RECORD_BYTES: usize = 400_000;

/// The default skew margin: a takeover waits this long past the lease end, for the clocks
/// of the machines sharing the table to disagree by up to this much.
pub const DEFAULT_SKEW_MARGIN: Duration = Duration::from_secs(2);

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

/// How often a write that also keeps the record (complete, fail, release, renew,
/// checkpoint) is sent again when the item was not as the write assumed: the expiry it
/// assumed, or the lease end it assumed.
const FINISH_ATTEMPTS: usize = 3;

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
        self.conditional_claim(request).await
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
        self.conditional_release(lease).await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        self.conditional_renew(lease, extend).await
    }

    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        self.conditional_checkpoint(lease, step, value).await
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
        self.conditional_purge(limit).await
    }

    fn expiry(&self) -> Expiry {
        Expiry::Eventually
    }

    fn max_record_bytes(&self) -> Option<usize> {
        Some(MAX_RECORD_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::config::{BehaviorVersion, Region};

    fn offline_client() -> Client {
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .build();
        Client::from_conf(config)
    }

    #[test]
    fn debug_shows_the_settings_and_no_client() {
        let builder = DynamoDbStore::builder(offline_client(), "idem_records")
            .unwrap()
            .prefix("app1")
            .unwrap()
            .skew_margin(Duration::from_millis(1500))
            .claim_reads_first(true);
        let shown = format!("{builder:?}");
        let store = builder.build();
        assert_eq!(shown, format!("DynamoDbStoreBuilder({store:?})"));
        assert_eq!(
            format!("{store:?}"),
            "DynamoDbStore { table: idem_records, prefix: \"app1\", skew_margin: 1.5s, \
             claim_reads_first: true, clock: SystemClock }"
        );
    }

    #[test]
    fn the_store_declares_its_expiry_and_item_limit() {
        let store = DynamoDbStore::new(offline_client(), "idem_records").unwrap();
        assert_eq!(store.expiry(), Expiry::Eventually);
        assert_eq!(store.max_record_bytes(), Some(MAX_RECORD_BYTES));
        assert_eq!(store.table_name(), "idem_records");
        // The defaults: no prefix, the documented margin, claims that write first.
        assert_eq!(store.prefix(), "");
        assert_eq!(store.skew_margin_value(), DEFAULT_SKEW_MARGIN);
        assert!(!store.claim_reads_first);
    }
}
