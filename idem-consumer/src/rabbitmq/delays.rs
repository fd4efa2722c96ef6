//! [`Delays`]: the delay queue a nak with a delay moves its message to, so that no
//! delivery is held while it waits.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicAckOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};

use super::copies::{Publisher, copy_properties};
use super::message::settled;
use super::{DELIVERIES, RabbitMessage, SetupError};
use crate::{Message, SettleError, Settlement};

/// A delay queue: where a nak with a delay moves its message, so that the consumer holds
/// no delivery while it waits. After a connection loss, the messages that come back to
/// another consumer are often still in flight under the lost one's leases, and each is
/// nak'd for about a lease: held in the consumer, they would fill its prefetch and stall
/// it for that long.
///
/// - The copy (the original's properties and headers, persistent, with the deliveries so
///   far in [`DELIVERIES`]) is published under publisher confirms with the delay as its
///   per-message time to live; the delay queue dead-letters it back to the original
///   queue when it expires. The original is acked only after the confirm; if the copy
///   cannot be published, the delivery is held for the delay as without a delay queue.
/// - The delay queue is a quorum queue that dead-letters at least once
///   (`x-dead-letter-strategy: at-least-once`, `x-overflow: reject-publish`), so a copy
///   is never dropped on its way back; a copy the full delay queue refuses leaves the
///   delivery held for its delay instead. This needs RabbitMQ 3.10 or later (quorum
///   queues' per-message time to live and at-least-once dead-lettering) with its
///   `stream_queue` feature flag on (a fresh node has it): without it, RabbitMQ
///   dead-letters at most once. A delay queue declared before with other arguments (a
///   classic one) is refused: delete it first.
/// - A confirm that comes after 30 s retires the channel (its
///   answers can no longer be told apart): naks then hold their deliveries, and dead
///   letters are requeued, until the process builds `Delays` and `DeadLetters` again.
/// - RabbitMQ expires per-message times to live at the queue's head: a copy waits at
///   least its delay, and as long as the longest delay ahead of it (a short backoff
///   behind a lease's wait waits for the lease). Delays past 2^32 - 1 ms are cut to it.
/// - The copy is a new message to RabbitMQ: it starts a quorum queue's
///   `x-delivery-count` (and `x-delivery-limit`) again; [`DELIVERIES`] keeps idem's count.
/// - A crash between the confirm and the ack delivers the message twice, which idem
///   answers once.
#[derive(Debug, Clone)]
pub struct Delays {
    publisher: Arc<Publisher>,
    pub(super) returns_to: String,
}

impl Delays {
    /// Declares `delay_queue` (a durable quorum queue, dead-lettering to `queue` through
    /// the default exchange) and publishes delayed copies to it on `channel`, put in
    /// confirm mode, which must be this publisher's alone (nothing else may publish on
    /// it).
    ///
    /// # Errors
    /// [`SetupError::SharedChannel`] for a channel in confirm mode already;
    /// [`SetupError::Broker`] when the broker refuses: a `delay_queue` declared before
    /// with other arguments, or a channel that does not take confirm mode.
    pub async fn through(
        channel: &lapin::Channel,
        delay_queue: &str,
        queue: &str,
    ) -> Result<Self, SetupError> {
        // A channel of its own: lapin hands a returned copy to whichever confirm of the
        // channel resolves next, so another publisher on it could take this one's answer.
        if channel.status().confirm() {
            return Err(SetupError::SharedChannel);
        }
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        arguments.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(queue.into()),
        );
        // A quorum queue moves an expired copy back at least once (a classic queue's
        // dead-lettering is at most once), which needs publishers refused when it is full.
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        arguments.insert(
            "x-dead-letter-strategy".into(),
            AMQPValue::LongString("at-least-once".into()),
        );
        arguments.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        channel
            .queue_declare(
                ShortString::from(delay_queue),
                lapin::options::QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                arguments,
            )
            .await
            .map_err(SetupError::Broker)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(SetupError::Broker)?;
        Ok(Self {
            publisher: Arc::new(Publisher {
                channel: channel.clone(),
                exchange: String::new(),
                routing_key: delay_queue.to_owned(),
                one_at_a_time: tokio::sync::Mutex::new(()),
                broken: std::sync::atomic::AtomicBool::new(false),
            }),
            returns_to: queue.to_owned(),
        })
    }
}

impl RabbitMessage {
    /// Moves the message to the delay queue (a copy that comes back after `delay`), then
    /// acks the original, so that no prefetch slot is held while it waits.
    pub(super) async fn delay(&self, delays: &Delays, delay: Duration) -> Result<(), SettleError> {
        let mut headers = self.copied_headers();
        let delivered = self.delivery_count().unwrap_or(1);
        headers.insert(
            DELIVERIES.into(),
            AMQPValue::LongLongInt(i64::try_from(delivered).unwrap_or(i64::MAX)),
        );
        // RabbitMQ refuses an expiration past 2^32 - 1 ms (about 49 days).
        let expiration = delay.as_millis().clamp(1, u128::from(u32::MAX)).to_string();
        let properties = copy_properties(&self.delivery.properties, headers)
            .with_expiration(ShortString::from(expiration));
        self.publish_confirmed(Settlement::Nak, &delays.publisher, properties)
            .await?;
        let acker = &self.delivery.acker;
        settled(
            Settlement::Nak,
            acker,
            acker.ack(BasicAckOptions::default()).await,
        )
    }
}
