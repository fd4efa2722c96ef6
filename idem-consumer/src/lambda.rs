//! AWS Lambda with SQS event sources (feature `lambda`): [`handle_sqs_event`] answers
//! partial batch failures, so that only the messages that failed come back.
//!
//! ```no_run
//! use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
//! use idem_consumer::{Consumer, lambda::handle_sqs_event};
//! use idem_core::{Idempotency, MemoryStore, done};
//!
//! // The function's handler, run by `lambda_runtime::run(service_fn(...))`; the consumer
//! // (on a shared store: DynamoDB, say) is built once, outside it.
//! async fn orders(consumer: &Consumer<MemoryStore>, event: SqsEvent) -> SqsBatchResponse {
//!     handle_sqs_event(consumer, event, |_ctx, payload| async move { done(payload.len()) }).await
//! }
//! # let _ = Consumer::new(Idempotency::new(MemoryStore::new()));
//! ```
//!
//! - Turn on `ReportBatchItemFailures` in the event source mapping
//!   (`FunctionResponseTypes`): without it, Lambda ignores the answer and deletes every
//!   record of a batch whose invocation succeeded, the failed ones included. For a mapping
//!   without it, use [`handle_sqs_event_or_fail`], which fails the invocation when any
//!   record failed, so that Lambda returns the whole batch (the records that succeeded
//!   replay).
//! - The records are handled by [`Consumer::handle_batch`]: keyed by a FIFO queue's
//!   `MessageDeduplicationId` or else the `messageId`, scoped by the queue's name (from
//!   the event source ARN) and a FIFO queue's message group, with the delivery count
//!   from `ApproximateReceiveCount`. Under content-based deduplication, equal bodies are
//!   then one message for the whole retention: producers that send equal bodies as
//!   distinct messages set deduplication ids of their own.
//! - A record that was acked (completed now or before) is a success; every other record
//!   (a retryable failure, work in flight elsewhere, a store outage, a dead letter) is a
//!   batch item failure: Lambda returns it to the queue, which delivers it again once its
//!   visibility timeout ends (a nak's own delay cannot be set from here).
//! - Dead letters (a permanent failure, a reused key) are failures too: the queue's
//!   redrive policy moves them to its dead-letter queue after `maxReceiveCount` receives,
//!   each receive answered from the stored failure without running the work again. Give
//!   the queue a redrive policy: without one, a dead letter comes back until the queue's
//!   retention ends. The reason is logged. Every receive counts toward
//!   `maxReceiveCount`, those answered "in flight" or failed by a store outage too: set it
//!   above what an outage can take.
//! - A FIFO queue's records run in order within each message group, and the records of a
//!   group after its first failure are failures without running, so that none overtakes
//!   it; other groups go on (Powertools' `skip_group_on_error`). A standard queue's batch
//!   runs concurrently, within [`Consumer::concurrency`].
//! - A record without a `messageId` that fails makes the whole batch fail (an empty
//!   identifier), so nothing is lost.
//! - Keep the function's timeout under the queue's visibility timeout, and the driver's
//!   lease under both: a retry after a timed-out invocation then finds the lease ended.

use std::sync::Mutex;
use std::time::Duration;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use bytes::Bytes;
use idem_core::{Context, Store, WorkError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::future::Future;

use crate::{Consumer, DeadLetterReason, Message, SettleError};

/// Handles every record of an SQS event through `consumer`, and answers the records that
/// must come back. See the [module docs](self).
pub async fn handle_sqs_event<S, T, E, F, Fut>(
    consumer: &Consumer<S>,
    event: SqsEvent,
    work: F,
) -> SqsBatchResponse
where
    S: Store + ?Sized + 'static,
    T: Serialize + DeserializeOwned + 'static,
    E: Serialize + DeserializeOwned + 'static,
    F: Fn(Context, Bytes) -> Fut,
    Fut: Future<Output = Result<T, WorkError<E>>>,
{
    let records: Vec<LambdaRecord> = event.records.into_iter().map(LambdaRecord::new).collect();
    let settled = consumer.handle_batch(&records, &work).await;
    let mut response = SqsBatchResponse::default();
    for (record, settled) in records.iter().zip(settled) {
        if !(settled.is_ok_and(|settled| settled.is_acked()) && record.succeeded()) {
            response.add_failure(record.identifier());
        }
    }
    response
}

/// One record of an SQS event, as a [`Message`]: settling it only records how.
struct LambdaRecord {
    message: SqsMessage,
    group: Option<String>,
    key: Option<String>,
    source: String,
    payload: Bytes,
    received: Option<u64>,
    succeeded: Mutex<Option<bool>>,
}

impl LambdaRecord {
    fn new(message: SqsMessage) -> Self {
        let group = message.attributes.get("MessageGroupId").cloned();
        let key = message
            .attributes
            .get("MessageDeduplicationId")
            .filter(|id| !id.is_empty())
            .or(message.message_id.as_ref())
            .cloned();
        // `arn:aws:sqs:<region>:<account>:<queue>`, and the message group: deduplication
        // may be per group.
        let queue = message
            .event_source_arn
            .as_deref()
            .and_then(|arn| arn.rsplit(':').next())
            .unwrap_or("sqs");
        let source = match &group {
            Some(group) => format!("{queue}/{group}"),
            None => queue.to_owned(),
        };
        let received = message
            .attributes
            .get("ApproximateReceiveCount")
            .and_then(|count| count.parse().ok());
        let payload = Bytes::from(message.body.clone().unwrap_or_default());
        Self {
            message,
            group,
            key,
            source,
            payload,
            received,
            succeeded: Mutex::new(None),
        }
    }

    /// The `messageId` Lambda knows the record by; empty (the whole batch fails) if absent.
    fn identifier(&self) -> String {
        self.message.message_id.clone().unwrap_or_default()
    }

    fn succeeded(&self) -> bool {
        self.succeeded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or(false)
    }

    fn settle(&self, succeeded: bool) {
        *self.succeeded.lock().unwrap_or_else(|e| e.into_inner()) = Some(succeeded);
    }
}

#[async_trait::async_trait]
impl Message for LambdaRecord {
    fn id(&self) -> Option<&str> {
        self.key.as_deref()
    }

    fn source(&self) -> &str {
        &self.source
    }

    fn payload(&self) -> &Bytes {
        &self.payload
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.message
            .message_attributes
            .get(name)?
            .string_value
            .as_deref()
    }

    fn delivery_count(&self) -> Option<u64> {
        self.received
    }

    fn ordering_key(&self) -> Option<&str> {
        self.group.as_deref()
    }

    async fn ack(&self) -> Result<(), SettleError> {
        self.settle(true);
        Ok(())
    }

    async fn nak(&self, _delay: Duration) -> Result<(), SettleError> {
        self.settle(false);
        Ok(())
    }

    async fn dead_letter(&self, reason: DeadLetterReason) -> Result<(), SettleError> {
        tracing::warn!(queue = %self.source, %reason, "idem-consumer: reporting a dead letter as a batch item failure, for the queue's redrive policy");
        self.settle(false);
        Ok(())
    }
}

/// Some records of a batch were not acked: the invocation fails, so that Lambda returns
/// the whole batch to the queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{failed} of the batch's records failed; the whole batch comes back")]
#[non_exhaustive]
pub struct BatchFailed {
    /// How many records failed.
    pub failed: usize,
}

/// [`handle_sqs_event`] for an event source mapping without `ReportBatchItemFailures`:
/// fails when any record failed, so that Lambda returns the whole batch, whose records
/// that succeeded replay.
///
/// # Errors
/// [`BatchFailed`] when a record was not acked.
pub async fn handle_sqs_event_or_fail<S, T, E, F, Fut>(
    consumer: &Consumer<S>,
    event: SqsEvent,
    work: F,
) -> Result<(), BatchFailed>
where
    S: Store + ?Sized + 'static,
    T: Serialize + DeserializeOwned + 'static,
    E: Serialize + DeserializeOwned + 'static,
    F: Fn(Context, Bytes) -> Fut,
    Fut: Future<Output = Result<T, WorkError<E>>>,
{
    let response = handle_sqs_event(consumer, event, work).await;
    match response.batch_item_failures.len() {
        0 => Ok(()),
        failed => Err(BatchFailed { failed }),
    }
}
