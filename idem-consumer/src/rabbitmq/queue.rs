//! [`RabbitQueue`]: one queue's consumer setup (consumed, wrapped, dead-lettered), and
//! the [`SetupError`]s that refuse a setup.

use std::sync::Arc;

use lapin::message::Delivery;
use lapin::options::BasicConsumeOptions;
use lapin::types::{FieldTable, ShortString};

use super::{DeadLetters, Delays, RabbitMessage};

/// A consumer setup that would lose messages, or a broker that refused it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// `no_ack` was asked: the broker forgets each message as it sends it, so nothing
    /// nak'd or unsettled by a crash is ever delivered again.
    #[error(
        "no_ack loses every message that is nak'd or in flight in a crash; consume with no_ack: false"
    )]
    NoAck,
    /// The broker refused.
    #[error("the broker refused the consumer's setup: {0}")]
    Broker(#[source] lapin::Error),
    /// The channel is in confirm mode already: another publisher uses it.
    #[error(
        "the channel is in confirm mode already, used by another publisher; give dead letters and delays a channel each"
    )]
    SharedChannel,
    /// The delay queue sends its copies back to another queue than this one's.
    #[error("the delay queue returns its copies to `{returns_to}`, not to `{queue}`")]
    DelaysElsewhere {
        /// The queue the delays return to.
        returns_to: String,
        /// This queue.
        queue: String,
    },
}

/// One queue's consumer setup: how its deliveries are consumed, wrapped and dead-lettered.
#[derive(Debug, Clone)]
pub struct RabbitQueue {
    queue: String,
    dead_letters: Arc<DeadLetters>,
    delays: Option<Delays>,
}

impl RabbitQueue {
    /// The setup for `queue`, dead-lettering as `dead_letters` says.
    pub fn new(queue: impl Into<String>, dead_letters: DeadLetters) -> Self {
        Self {
            queue: queue.into(),
            dead_letters: Arc::new(dead_letters),
            delays: None,
        }
    }

    /// Naks with a delay move the message to `delays`' queue instead of holding its
    /// delivery (and a prefetch slot) in this process for the delay. See [`Delays`].
    ///
    /// # Errors
    /// [`SetupError::DelaysElsewhere`] when the delay queue returns its copies to another
    /// queue: they would never come back here.
    pub fn delays(mut self, delays: Delays) -> Result<Self, SetupError> {
        if delays.returns_to != self.queue {
            return Err(SetupError::DelaysElsewhere {
                returns_to: delays.returns_to,
                queue: self.queue,
            });
        }
        self.delays = Some(delays);
        Ok(self)
    }

    /// The queue's name.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Starts consuming the queue on `channel` (`basic.consume`).
    ///
    /// # Errors
    /// [`SetupError::NoAck`] when `options.no_ack` is set, before anything is asked of
    /// the broker; [`SetupError::Broker`] when the broker refuses.
    pub async fn consume(
        &self,
        channel: &lapin::Channel,
        consumer_tag: &str,
        options: BasicConsumeOptions,
        arguments: FieldTable,
    ) -> Result<lapin::Consumer, SetupError> {
        if options.no_ack {
            return Err(SetupError::NoAck);
        }
        channel
            .basic_consume(
                ShortString::from(self.queue.as_str()),
                ShortString::from(consumer_tag),
                options,
                arguments,
            )
            .await
            .map_err(SetupError::Broker)
    }

    /// A delivery from this queue, as a [`Message`].
    ///
    /// [`Message`]: crate::Message
    pub fn wrap(&self, delivery: Delivery) -> RabbitMessage {
        let mut message = RabbitMessage::new(delivery, self.queue.clone());
        message.dead_letters = Some(Arc::clone(&self.dead_letters));
        message.delays = self.delays.clone();
        message
    }
}
