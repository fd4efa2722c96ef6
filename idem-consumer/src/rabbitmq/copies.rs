//! Copies of a message (a dead letter, a delayed nak): the original's headers and
//! properties, published `mandatory` under publisher confirms, one at a time per channel.

use std::time::Duration;

use lapin::Confirmation;
use lapin::options::BasicPublishOptions;
use lapin::types::{FieldTable, ShortString};

use super::RabbitMessage;
use crate::{SettleError, Settlement};

/// The headers RabbitMQ sets on a delivery, never copied onto a copy of it.
const BROKER_HEADERS: [&str; 9] = [
    "x-delivery-count",
    "x-death",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-first-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    "x-last-death-exchange",
    "x-received-from",
];

/// How long a copy's publish (a dead letter, a delayed nak) waits for the broker's
/// confirm, the wait for the channel included.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub(super) struct Publisher {
    pub(super) channel: lapin::Channel,
    pub(super) exchange: String,
    pub(super) routing_key: String,
    pub(super) one_at_a_time: tokio::sync::Mutex<()>,
    /// Set when a confirm did not come in time: its answer may still arrive and be taken
    /// for the next copy's, so the channel publishes nothing more.
    pub(super) broken: std::sync::atomic::AtomicBool,
}

impl RabbitMessage {
    /// The original's headers for a copy, less what the broker sets on each delivery.
    pub(super) fn copied_headers(&self) -> FieldTable {
        let mut headers = self
            .delivery
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        let inner = headers.inner().clone();
        let mut copy = FieldTable::default();
        for (name, value) in inner {
            // What the broker sets on a delivery; a publisher's own `x-` headers stay.
            if !BROKER_HEADERS.contains(&name.as_str()) {
                copy.insert(name, value);
            }
        }
        headers = copy;
        headers
    }

    /// Publishes a copy of the message `mandatory` with `properties` and waits for the
    /// broker's confirm that a queue took it.
    pub(super) async fn publish_confirmed(
        &self,
        action: Settlement,
        publisher: &Publisher,
        properties: lapin::BasicProperties,
    ) -> Result<(), SettleError> {
        let (exchange, routing_key) = (publisher.exchange.as_str(), publisher.routing_key.as_str());
        let channel = &publisher.channel;
        if !channel.status().connected() {
            return Err(SettleError::Misconfigured {
                action,
                problem: "the copies' channel is closed (the broker closes it on an error, such as an exchange that does not exist): build it again on a new channel",
            });
        }
        let broken = || SettleError::Misconfigured {
            action,
            problem: "a confirm on the copies' channel came too late, so its answers cannot be told apart any more: build it again on a new channel",
        };
        if publisher.broken.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(broken());
        }
        // One copy at a time on the channel: lapin hands a returned copy to whichever
        // confirm resolves next, so two copies in flight could swap their answers. The
        // wait for the lock counts toward the confirm's time.
        let started = tokio::time::Instant::now();
        let Ok(_one_at_a_time) =
            tokio::time::timeout(CONFIRM_TIMEOUT, publisher.one_at_a_time.lock()).await
        else {
            return Err(SettleError::broker(
                action,
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the copies' channel stayed busy",
                ),
            ));
        };
        if publisher.broken.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(broken());
        }
        // Too little time left for a confirm: not published, rather than taken for a
        // broker too slow to answer.
        if CONFIRM_TIMEOUT.saturating_sub(started.elapsed()) < Duration::from_secs(1) {
            return Err(SettleError::broker(
                action,
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the copies' channel stayed busy",
                ),
            ));
        }
        let publish = channel.basic_publish(
            ShortString::from(exchange),
            ShortString::from(routing_key),
            BasicPublishOptions {
                // A copy no queue takes comes back instead of vanishing.
                mandatory: true,
                ..Default::default()
            },
            &self.payload,
            properties,
        );
        // A broker under a memory or disk alarm holds publishes: never wait forever.
        let left = CONFIRM_TIMEOUT.saturating_sub(started.elapsed());
        let confirm = tokio::time::timeout(left, async {
            publish
                .await
                .map_err(|err| SettleError::broker(action, err))?
                .await
                .map_err(|err| SettleError::broker(action, err))
        })
        .await
        .map_err(|_| {
            publisher
                .broken
                .store(true, std::sync::atomic::Ordering::SeqCst);
            SettleError::broker(
                action,
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the broker did not confirm the copy in time",
                ),
            )
        })??;
        match confirm {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(SettleError::Misconfigured {
                action,
                problem: "no queue took the copy: bind a queue to the exchange under its routing key",
            }),
            Confirmation::Nack(_) => Err(SettleError::broker(
                action,
                std::io::Error::other("the broker refused the copy (basic.nack)"),
            )),
            Confirmation::NotRequested => Err(SettleError::Misconfigured {
                action,
                problem: "the copies' channel left confirm mode: build it again on a new channel",
            }),
        }
    }
}

/// A copy's properties: the original's, made persistent, without an expiry (the copy
/// must outlive the original's time to live) or a user id (the broker checks it against
/// the publishing connection's user).
pub(super) fn copy_properties(
    original: &lapin::BasicProperties,
    headers: FieldTable,
) -> lapin::BasicProperties {
    let mut copy = lapin::BasicProperties::default()
        .with_headers(headers)
        .with_delivery_mode(2);
    if let Some(value) = original.content_type() {
        copy = copy.with_content_type(value.clone());
    }
    if let Some(value) = original.content_encoding() {
        copy = copy.with_content_encoding(value.clone());
    }
    if let Some(value) = original.priority() {
        copy = copy.with_priority(*value);
    }
    if let Some(value) = original.correlation_id() {
        copy = copy.with_correlation_id(value.clone());
    }
    if let Some(value) = original.message_id() {
        copy = copy.with_message_id(value.clone());
    }
    if let Some(value) = original.timestamp() {
        copy = copy.with_timestamp(*value);
    }
    if let Some(value) = original.kind() {
        copy = copy.with_type(value.clone());
    }
    if let Some(value) = original.app_id() {
        copy = copy.with_app_id(value.clone());
    }
    if let Some(value) = original.reply_to() {
        copy = copy.with_reply_to(value.clone());
    }
    copy
}
