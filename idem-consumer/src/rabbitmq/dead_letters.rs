//! [`DeadLetters`]: where dead letters go, and the dead-lettered copy published with its
//! reason.

use std::sync::Arc;

use lapin::options::ConfirmSelectOptions;
use lapin::types::{AMQPValue, FieldTable, ShortString};

use super::copies::{Publisher, copy_properties};
use super::{DEAD_LETTER_REASON, DELIVERIES, ORIGINAL_QUEUE, RabbitMessage, SetupError};
use crate::{DeadLetterReason, SettleError, Settlement};

/// Where dead letters go: a choice made once, so that none is dropped unawares.
///
/// Clones share their channel and publish one copy at a time on it; build one per channel.
#[derive(Debug, Clone)]
pub struct DeadLetters {
    pub(super) target: Target,
}

#[derive(Debug, Clone)]
pub(super) enum Target {
    Publish(Arc<Publisher>),
    QueuePolicy,
}

impl DeadLetters {
    /// Each dead letter is published, with its reason, to `exchange` under `routing_key`
    /// on `channel`, under publisher confirms and `mandatory`; the original is acked only
    /// once the broker confirmed the copy was routed. The channel is put in confirm mode,
    /// and must be this publisher's alone (nothing else may publish on it).
    ///
    /// # Errors
    /// [`SetupError::SharedChannel`] for a channel in confirm mode already;
    /// [`SetupError::Broker`] when the channel does not take confirm mode, or the
    /// exchange does not exist (checked with a passive declare, which closes the channel).
    pub async fn publish_to(
        channel: &lapin::Channel,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
    ) -> Result<Self, SetupError> {
        let exchange = exchange.into();
        if !exchange.is_empty() {
            channel
                .exchange_declare(
                    ShortString::from(exchange.as_str()),
                    lapin::ExchangeKind::Direct,
                    lapin::options::ExchangeDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(SetupError::Broker)?;
        }
        // A channel of its own: lapin hands a returned copy to whichever confirm of the
        // channel resolves next, so another publisher on it could take this one's answer.
        if channel.status().confirm() {
            return Err(SetupError::SharedChannel);
        }
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(SetupError::Broker)?;
        Ok(Self {
            target: Target::Publish(Arc::new(Publisher {
                channel: channel.clone(),
                exchange,
                routing_key: routing_key.into(),
                one_at_a_time: tokio::sync::Mutex::new(()),
                broken: std::sync::atomic::AtomicBool::new(false),
            })),
        })
    }

    /// Each dead letter is rejected without requeue, to the queue's own
    /// `x-dead-letter-exchange`: at most once from a classic queue, dropped where the
    /// queue has none, and without its reason (which is logged). See the module docs.
    pub fn queue_policy() -> Self {
        Self {
            target: Target::QueuePolicy,
        }
    }
}

impl RabbitMessage {
    /// Publishes the dead-lettered copy with its reason and waits for the broker's confirm.
    pub(super) async fn publish_dead_letter(
        &self,
        publisher: &Publisher,
        reason: DeadLetterReason,
    ) -> Result<(), SettleError> {
        let mut headers = self.copied_headers();
        // A dead letter moved back into the queue starts its count again.
        let kept: Vec<_> = headers
            .inner()
            .iter()
            .filter(|(name, _)| name.as_str() != DELIVERIES)
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        headers = FieldTable::default();
        for (name, value) in kept {
            headers.insert(name, value);
        }
        headers.insert(
            DEAD_LETTER_REASON.into(),
            AMQPValue::LongString(reason.as_str().into()),
        );
        headers.insert(
            ORIGINAL_QUEUE.into(),
            AMQPValue::LongString(self.queue.as_str().into()),
        );
        let properties = copy_properties(&self.delivery.properties, headers);
        self.publish_confirmed(Settlement::DeadLetter, publisher, properties)
            .await
    }
}
