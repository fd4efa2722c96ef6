//! The RabbitMQ adapter (feature `rabbitmq`): [`RabbitMessage`].
//!
//! ```no_run
//! use futures_util::StreamExt;
//! use idem_consumer::{Consumer, rabbitmq::RabbitMessage};
//! use idem_core::{Idempotency, MemoryStore, done};
//! use lapin::{options::BasicConsumeOptions, types::FieldTable};
//!
//! # async fn consume() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let connection = lapin::Connection::connect("amqp://127.0.0.1:5672/%2f", Default::default()).await?;
//! let channel = connection.create_channel().await?;
//! let mut deliveries = channel
//!     .basic_consume("orders".into(), "billing".into(), BasicConsumeOptions::default(), FieldTable::default())
//!     .await?;
//! let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
//! while let Some(delivery) = deliveries.next().await {
//!     let message = RabbitMessage::new(delivery?, "orders");
//!     // A settlement the broker refused is delivered again: log it and go on.
//!     if let Err(err) = consumer.handle(&message, |_ctx, payload| async move { done(payload.len()) }).await {
//!         tracing::warn!(error = %err, "not settled");
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! - The key is the AMQP `message_id` property; the scope is the queue's name, given
//!   with the delivery (AMQP does not repeat it on each one).
//! - The delivery count is a quorum queue's `x-delivery-count` plus one, else 1 for a
//!   first delivery, unknown for a redelivery.
//! - AMQP has no delayed redelivery: a nak waits its delay in a task of its own, then
//!   requeues (`basic.nack`, requeue). The delivery stays unacknowledged meanwhile, so a
//!   crash requeues it anyway, and it holds one prefetch slot (`basic.qos`): give the
//!   channel room for the naks in waiting. RabbitMQ closes a channel whose delivery
//!   stays unacknowledged past its `consumer_timeout` (30 minutes by default): keep the
//!   driver's lease and the backoff's largest delay well under it.
//! - A quorum queue's `x-delivery-limit` drops or dead-letters a message after that many
//!   deliveries, naks included: set it above what a store outage can take, or leave it
//!   unset on classic queues.
//! - A `handle` future dropped mid-work leaves its delivery unacknowledged until the
//!   channel closes (AMQP has no acknowledgement timeout).
//! - A dead letter is rejected without requeue (`basic.reject`), which RabbitMQ routes to
//!   the queue's dead-letter exchange (`x-dead-letter-exchange`) with an `x-death`
//!   header; a queue without one drops it. The reason is logged.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::AMQPValue;

use crate::{DeadLetterReason, Message, SettleError, Settlement};

/// A RabbitMQ delivery, as a [`Message`].
pub struct RabbitMessage {
    delivery: Delivery,
    payload: Bytes,
    queue: String,
}

impl fmt::Debug for RabbitMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMessage")
            .field("queue", &self.queue)
            .field("delivery_tag", &self.delivery.delivery_tag)
            .field("redelivered", &self.delivery.redelivered)
            .field("payload_len", &self.payload.len())
            .finish_non_exhaustive()
    }
}

impl RabbitMessage {
    /// Wraps a delivery from a consumer of `queue`.
    pub fn new(mut delivery: Delivery, queue: impl Into<String>) -> Self {
        let payload = Bytes::from(std::mem::take(&mut delivery.data));
        Self {
            delivery,
            payload,
            queue: queue.into(),
        }
    }

    /// The delivery (its `data` moved to [`Message::payload`]).
    pub fn get_ref(&self) -> &Delivery {
        &self.delivery
    }
}

/// A lapin answer as a settlement: `Ok(false)` means the acker was used before, or its
/// channel is gone (poisoned).
fn settled(
    action: Settlement,
    acker: &lapin::Acker,
    answer: lapin::Result<bool>,
) -> Result<(), SettleError> {
    match answer {
        Ok(true) => Ok(()),
        Ok(false) if acker.poisoned() => Err(SettleError::Closed { action }),
        Ok(false) => Err(SettleError::AlreadySettled { action }),
        Err(err) => Err(SettleError::broker(action, err)),
    }
}

fn count(value: &AMQPValue) -> Option<u64> {
    match value {
        AMQPValue::ShortShortInt(n) => u64::try_from(*n).ok(),
        AMQPValue::ShortShortUInt(n) => Some(u64::from(*n)),
        AMQPValue::ShortInt(n) => u64::try_from(*n).ok(),
        AMQPValue::ShortUInt(n) => Some(u64::from(*n)),
        AMQPValue::LongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongUInt(n) => Some(u64::from(*n)),
        AMQPValue::LongLongInt(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

#[async_trait::async_trait]
impl Message for RabbitMessage {
    fn id(&self) -> Option<&str> {
        self.delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str())
    }

    fn source(&self) -> &str {
        &self.queue
    }

    fn payload(&self) -> &Bytes {
        &self.payload
    }

    fn delivery_count(&self) -> Option<u64> {
        let header = self
            .delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|headers| headers.inner().get("x-delivery-count"))
            .and_then(count);
        match header {
            Some(failed) => Some(failed.saturating_add(1)),
            None if !self.delivery.redelivered => Some(1),
            None => None,
        }
    }

    async fn ack(&self) -> Result<(), SettleError> {
        let acker = &self.delivery.acker;
        settled(
            Settlement::Ack,
            acker,
            acker.ack(BasicAckOptions::default()).await,
        )
    }

    async fn nak(&self, delay: Duration) -> Result<(), SettleError> {
        let requeue = BasicNackOptions {
            requeue: true,
            multiple: false,
        };
        let acker = self.delivery.acker.clone();
        if delay.is_zero() {
            return settled(Settlement::Nak, &acker, acker.nack(requeue).await);
        }
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Err(err) = settled(Settlement::Nak, &acker, acker.nack(requeue).await) {
                // The channel closed meanwhile: the broker requeued the delivery itself.
                tracing::debug!(error = %err, "idem-consumer: a delayed nak found its channel gone");
            }
        });
        Ok(())
    }

    async fn dead_letter(&self, reason: DeadLetterReason) -> Result<(), SettleError> {
        tracing::warn!(queue = %self.queue, %reason, "idem-consumer: rejecting a message to the dead-letter exchange");
        let acker = &self.delivery.acker;
        let answer = acker.reject(BasicRejectOptions { requeue: false }).await;
        settled(Settlement::DeadLetter, acker, answer)
    }
}
