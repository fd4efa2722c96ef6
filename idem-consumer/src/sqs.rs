//! The Amazon SQS adapter (feature `sqs`): [`SqsQueue`], a queue's reader, and
//! [`SqsMessage`].
//!
//! ```no_run
//! use idem_consumer::Consumer;
//! use idem_consumer::sqs::{DeadLetters, SqsQueue};
//! use idem_core::{Idempotency, MemoryStore, done};
//! use std::time::Duration;
//!
//! # async fn consume(config: aws_sdk_sqs::Config) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = aws_sdk_sqs::Client::from_conf(config);
//! let orders = SqsQueue::new(
//!     client,
//!     "https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
//!     DeadLetters::send_to("https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dead"),
//! );
//! let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
//! loop {
//!     // Long polling: up to 10 messages, waiting up to 20 s for the first.
//!     let batch = orders.next_batch(10, Duration::from_secs(20)).await?;
//!     for settled in consumer.handle_batch(&batch, |_ctx, payload| async move { done(payload.len()) }).await {
//!         if let Err(err) = settled {
//!             tracing::warn!(error = %err, "not settled; SQS delivers it again when its visibility ends");
//!         }
//!     }
//! }
//! # }
//! ```
//!
//! - The key is a FIFO queue's `MessageDeduplicationId` (the producer's id, or the
//!   content hash under content-based deduplication), in the scope `<queue>/<group>`
//!   (deduplication may be per message group): a producer's
//!   resend beyond SQS's own five-minute window is still caught. Under content-based
//!   deduplication, equal bodies are then one message for the whole retention: for
//!   producers that send equal bodies as distinct messages, key by the message id
//!   ([`SqsQueue::key_by_message_id`]). On a standard queue it is the `MessageId`, the
//!   same on every receive of one sent message; a producer's own resend is a new message
//!   and runs twice, so producers that resend put an id in the body and the consumer keys
//!   by it ([`Consumer::key_from_payload`](crate::Consumer::key_from_payload)).
//! - The scope is the queue's name (the URL's last segment), and a FIFO queue's message
//!   group after a `/`.
//! - The delivery count is `ApproximateReceiveCount`.
//! - A FIFO queue's message group is the ordering key: a batch runs each group's
//!   messages in order, and holds back (nak'd at once) the ones behind a message that was
//!   not acked, so none overtakes it.
//! - An ack deletes the message (`DeleteMessage`). A nak sets its visibility timeout to the
//!   delay (`ChangeMessageVisibility`, in whole seconds, at most 12 hours), so it comes
//!   back then.
//! - Messages are received with the reader's [`visibility`](SqsQueue::visibility) (30 s
//!   by default), and while the work runs, and while a message waits in a batch, the
//!   visibility is extended every third of it: work longer than the visibility timeout is
//!   not delivered again meanwhile. SQS caps a message's total visibility at 12 hours.
//! - A dead letter is sent to the queue of [`DeadLetters::send_to`] with the reason and
//!   the original's queue and id as message attributes (a FIFO dead-letter queue gets the
//!   original's group and a deduplication id of its own), then deleted: a crash between
//!   the two can send a copy twice. A queue's own redrive policy (`maxReceiveCount`)
//!   counts every receive, naks and in-flight answers included: set it above what a store
//!   outage can take, or bound the work with
//!   [`Consumer::max_attempts`](crate::Consumer::max_attempts) instead.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName};
use bytes::Bytes;

use crate::{DeadLetterReason, Message, SettleError, Settlement};

/// The message attribute that carries the reason on a dead-lettered copy.
pub const DEAD_LETTER_REASON: &str = "idem-dead-letter-reason";
/// The message attribute that carries the original's queue on a dead-lettered copy.
pub const ORIGINAL_QUEUE: &str = "idem-original-queue";
/// The message attribute that carries the original's key (its deduplication id or message
/// id) on a dead-lettered copy.
pub const ORIGINAL_ID: &str = "idem-original-id";

/// The visibility timeout messages are received with, unless set.
pub const DEFAULT_VISIBILITY: Duration = Duration::from_secs(30);

/// SQS's longest visibility timeout.
const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 60 * 60);

/// Where dead letters go: a choice made once, so that none is dropped unawares.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadLetters {
    /// Sent to this queue with the reason, then deleted from the original queue.
    Send {
        /// The dead-letter queue's URL.
        queue_url: String,
    },
}

impl DeadLetters {
    /// [`DeadLetters::Send`] to `queue_url`.
    pub fn send_to(queue_url: impl Into<String>) -> Self {
        DeadLetters::Send {
            queue_url: queue_url.into(),
        }
    }
}

/// Receiving from a queue failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiveError {
    /// SQS answered an error, or could not be reached; nothing was lost: a message
    /// received but not handled comes back when its visibility ends.
    #[error("SQS did not answer ReceiveMessage: {source}")]
    Sqs {
        /// The SDK's error.
        #[source]
        source: idem_core::BoxError,
    },
}

#[derive(Clone)]
struct Setup {
    client: Client,
    queue_url: String,
    /// The queue's name: the scope.
    queue: String,
    visibility: Duration,
    dead_letters: DeadLetters,
    key_by_deduplication_id: bool,
}

/// An SQS queue's reader: the source of [`SqsMessage`]s. See the [module docs](self).
#[derive(Clone)]
pub struct SqsQueue {
    setup: Arc<Setup>,
}

impl fmt::Debug for SqsQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsQueue")
            .field("queue_url", &self.setup.queue_url)
            .field("visibility", &self.setup.visibility)
            .field("dead_letters", &self.setup.dead_letters)
            .finish_non_exhaustive()
    }
}

impl SqsQueue {
    /// The queue at `queue_url`, read with `client`.
    pub fn new(client: Client, queue_url: impl Into<String>, dead_letters: DeadLetters) -> Self {
        let queue_url = queue_url.into();
        let queue = queue_url
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        Self {
            setup: Arc::new(Setup {
                client,
                queue_url,
                queue,
                visibility: DEFAULT_VISIBILITY,
                dead_letters,
                key_by_deduplication_id: true,
            }),
        }
    }

    /// The visibility timeout messages are received with, and extended by while handled:
    /// longer than a pause of the process, and longer than the driver's lease makes a
    /// redelivery find the lease ended. Whole seconds, from 1 s to 12 hours.
    pub fn visibility(mut self, visibility: Duration) -> Self {
        let visibility = visibility.clamp(Duration::from_secs(1), MAX_VISIBILITY);
        Arc::make_mut(&mut self.setup).visibility = visibility;
        self
    }

    /// Keys a FIFO queue's messages by their message id instead of their deduplication
    /// id: for queues under content-based deduplication whose producers send equal bodies
    /// that are distinct messages (SQS drops such a repeat within five minutes, and the
    /// deduplication id would make it one message for the whole retention).
    pub fn key_by_message_id(mut self) -> Self {
        Arc::make_mut(&mut self.setup).key_by_deduplication_id = false;
        self
    }

    /// Up to `max` messages (1 to 10, as SQS allows), waiting up to `wait` (at most 20 s,
    /// SQS's long polling) for the first.
    ///
    /// # Errors
    /// [`ReceiveError::Sqs`] when SQS answers an error or cannot be reached.
    pub async fn next_batch(
        &self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<SqsMessage>, ReceiveError> {
        let setup = &self.setup;
        let received = setup
            .client
            .receive_message()
            .queue_url(&setup.queue_url)
            .max_number_of_messages(max.clamp(1, 10) as i32)
            // A wait under a second is a second: zero alone means a short poll.
            .wait_time_seconds(seconds(wait.min(Duration::from_secs(20))))
            .visibility_timeout(seconds(setup.visibility))
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|err| ReceiveError::Sqs {
                source: Box::new(err),
            })?;
        Ok(received
            .messages
            .unwrap_or_default()
            .into_iter()
            .filter_map(|message| SqsMessage::new(Arc::clone(&self.setup), message))
            .collect())
    }
}

/// Batches of up to 10 messages, long-polling up to 20 s for the first (SQS's limits).
#[async_trait::async_trait]
impl crate::Source for SqsQueue {
    type Message = SqsMessage;
    type Error = ReceiveError;

    async fn next_batch(&self) -> Result<Vec<SqsMessage>, ReceiveError> {
        SqsQueue::next_batch(self, 10, Duration::from_secs(20)).await
    }
}

/// A duration in whole seconds, rounded up, within SQS's visibility range.
fn seconds(duration: Duration) -> i32 {
    let duration = duration.min(MAX_VISIBILITY);
    let whole = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    i32::try_from(whole).unwrap_or(i32::MAX)
}

/// A message received from a queue, as a [`Message`].
pub struct SqsMessage {
    setup: Arc<Setup>,
    message: aws_sdk_sqs::types::Message,
    /// A FIFO queue's message group.
    group: Option<String>,
    /// The scope: the queue, and a FIFO queue's message group.
    source: String,
    key: String,
    receipt: String,
    payload: Bytes,
    received: Option<u64>,
}

impl fmt::Debug for SqsMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsMessage")
            .field("queue", &self.setup.queue)
            .field("message_id", &self.message.message_id())
            .field("received", &self.received)
            .field("payload_len", &self.payload.len())
            .finish_non_exhaustive()
    }
}

impl SqsMessage {
    /// A received message; `None` for one without a receipt handle or an id, which SQS
    /// never sends.
    fn new(setup: Arc<Setup>, message: aws_sdk_sqs::types::Message) -> Option<Self> {
        let attributes = message.attributes();
        let attribute =
            |name: MessageSystemAttributeName| attributes.and_then(|all| all.get(&name)).cloned();
        let group = attribute(MessageSystemAttributeName::MessageGroupId);
        let deduplication = attribute(MessageSystemAttributeName::MessageDeduplicationId)
            .filter(|id| !id.is_empty() && setup.key_by_deduplication_id);
        let key = match deduplication {
            Some(id) => id,
            None => message.message_id()?.to_owned(),
        };
        // Deduplication may be scoped by group (`DeduplicationScope=messageGroup`): the
        // same id in two groups is two messages, so the group is in the scope. Queue names
        // hold no `/`, so `<queue>/<group>` names one group of one queue.
        let source = match &group {
            Some(group) => format!("{}/{group}", setup.queue),
            None => setup.queue.clone(),
        };
        let receipt = message.receipt_handle()?.to_owned();
        let received = attribute(MessageSystemAttributeName::ApproximateReceiveCount)
            .and_then(|count| count.parse().ok());
        let payload = Bytes::from(message.body().unwrap_or_default().to_owned());
        Some(Self {
            setup,
            message,
            group,
            source,
            key,
            receipt,
            payload,
            received,
        })
    }

    /// The message as SQS sent it (its attributes, its group).
    pub fn get_ref(&self) -> &aws_sdk_sqs::types::Message {
        &self.message
    }

    async fn set_visibility(
        &self,
        action: Settlement,
        visibility: Duration,
    ) -> Result<(), SettleError> {
        self.setup
            .client
            .change_message_visibility()
            .queue_url(&self.setup.queue_url)
            .receipt_handle(&self.receipt)
            .visibility_timeout(seconds(visibility))
            .send()
            .await
            .map_err(|err| SettleError::broker(action, err))?;
        Ok(())
    }

    async fn delete(&self, action: Settlement) -> Result<(), SettleError> {
        self.setup
            .client
            .delete_message()
            .queue_url(&self.setup.queue_url)
            .receipt_handle(&self.receipt)
            .send()
            .await
            .map_err(|err| SettleError::broker(action, err))?;
        Ok(())
    }
}

fn string_attribute(value: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .expect("a data type is set")
}

#[async_trait::async_trait]
impl Message for SqsMessage {
    fn id(&self) -> Option<&str> {
        Some(&self.key)
    }

    fn source(&self) -> &str {
        &self.source
    }

    fn payload(&self) -> &Bytes {
        &self.payload
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.message.message_attributes()?.get(name)?.string_value()
    }

    fn delivery_count(&self) -> Option<u64> {
        self.received
    }

    fn ordering_key(&self) -> Option<&str> {
        self.group.as_deref()
    }

    fn progress_interval(&self) -> Option<Duration> {
        Some(self.setup.visibility / 3)
    }

    async fn in_progress(&self) -> Result<(), SettleError> {
        self.set_visibility(Settlement::InProgress, self.setup.visibility)
            .await
    }

    async fn ack(&self) -> Result<(), SettleError> {
        self.delete(Settlement::Ack).await
    }

    async fn nak(&self, delay: Duration) -> Result<(), SettleError> {
        self.set_visibility(Settlement::Nak, delay).await
    }

    async fn dead_letter(&self, reason: DeadLetterReason) -> Result<(), SettleError> {
        let action = Settlement::DeadLetter;
        let DeadLetters::Send { queue_url } = &self.setup.dead_letters;
        let mut send = self
            .setup
            .client
            .send_message()
            .queue_url(queue_url)
            .message_body(self.message.body().unwrap_or_default())
            .message_attributes(DEAD_LETTER_REASON, string_attribute(reason.as_str()))
            .message_attributes(ORIGINAL_QUEUE, string_attribute(&self.setup.queue))
            .message_attributes(ORIGINAL_ID, string_attribute(&self.key));
        if queue_url.ends_with(".fifo") {
            let group = self
                .group
                .clone()
                .unwrap_or_else(|| self.setup.queue.clone());
            // The original's message id (within SQS's 128 characters): a repeated
            // dead-lettering within the window is dropped.
            let id = self.message.message_id().unwrap_or(&self.key);
            send = send.message_group_id(group).message_deduplication_id(id);
        }
        send.send()
            .await
            .map_err(|err| SettleError::broker(action, err))?;
        self.delete(action).await
    }
}
