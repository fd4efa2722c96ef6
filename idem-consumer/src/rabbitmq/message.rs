//! [`RabbitMessage`]: a RabbitMQ delivery as a [`Message`], and how it is acked, nak'd
//! and dead-lettered.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::AMQPValue;

use super::dead_letters::Target;
use super::{DELIVERIES, DeadLetters, Delays};
use crate::{DeadLetterReason, Message, SettleError, Settlement};

/// How long a delivery whose dead letter could not be published waits before it is
/// requeued, so a dead-letter exchange that routes nowhere is not retried in a loop.
const DEAD_LETTER_RETRY: Duration = Duration::from_secs(5);

/// A RabbitMQ delivery, as a [`Message`].
pub struct RabbitMessage {
    pub(super) delivery: Delivery,
    pub(super) payload: Bytes,
    pub(super) queue: String,
    pub(super) dead_letters: Option<Arc<DeadLetters>>,
    pub(super) delays: Option<Delays>,
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
    /// Wraps a delivery from a consumer of `queue`, unchecked: dead letters are rejected
    /// to the queue's policy ([`DeadLetters::queue_policy`]). Prefer [`RabbitQueue::wrap`].
    ///
    /// [`RabbitQueue::wrap`]: super::RabbitQueue::wrap
    pub fn new(mut delivery: Delivery, queue: impl Into<String>) -> Self {
        let payload = Bytes::from(std::mem::take(&mut delivery.data));
        Self {
            delivery,
            payload,
            queue: queue.into(),
            dead_letters: None,
            delays: None,
        }
    }

    /// The delivery (its `data` moved to [`Message::payload`]).
    pub fn get_ref(&self) -> &Delivery {
        &self.delivery
    }
}

/// A lapin answer as a settlement: `Ok(false)` means the acker was used before, or its
/// channel is gone (poisoned).
pub(super) fn settled(
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

    fn header(&self, name: &str) -> Option<&str> {
        match self
            .delivery
            .properties
            .headers()
            .as_ref()?
            .inner()
            .get(name)?
        {
            AMQPValue::LongString(value) => std::str::from_utf8(value.as_bytes()).ok(),
            AMQPValue::ShortString(value) => Some(value.as_str()),
            _ => None,
        }
    }

    fn delivery_count(&self) -> Option<u64> {
        let headers = self.delivery.properties.headers().as_ref();
        let header = headers
            .and_then(|headers| headers.inner().get("x-delivery-count"))
            .and_then(count);
        // A copy back from the delay queue counts the deliveries before it.
        let before = headers
            .and_then(|headers| headers.inner().get(DELIVERIES))
            .and_then(count)
            .unwrap_or(0);
        match header {
            Some(failed) => Some(before.saturating_add(failed).saturating_add(1)),
            None if !self.delivery.redelivered => Some(before.saturating_add(1)),
            // A copy delivered again on a classic queue: at least one more.
            None if before > 0 => Some(before.saturating_add(2)),
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
        if let Some(delays) = &self.delays {
            match self.delay(delays, delay).await {
                Ok(()) => return Ok(()),
                // Not moved: the wait below holds the delivery instead, and loses nothing.
                Err(err) => {
                    tracing::warn!(error = %err, "idem-consumer: could not move a message to the delay queue; holding it instead");
                }
            }
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
        let acker = &self.delivery.acker;
        match self.dead_letters.as_ref().map(|dead| &dead.target) {
            Some(Target::Publish(publisher)) => {
                if let Err(err) = self.publish_dead_letter(publisher, reason).await {
                    // Not dead-lettered: the original must come back, not stay held.
                    let _ = self.nak(DEAD_LETTER_RETRY).await;
                    return Err(err);
                }
                settled(
                    Settlement::DeadLetter,
                    acker,
                    acker.ack(BasicAckOptions::default()).await,
                )
            }
            _ => {
                tracing::warn!(queue = %self.queue, %reason, "idem-consumer: rejecting a message to the queue's dead-letter exchange");
                let answer = acker.reject(BasicRejectOptions { requeue: false }).await;
                settled(Settlement::DeadLetter, acker, answer)
            }
        }
    }
}
