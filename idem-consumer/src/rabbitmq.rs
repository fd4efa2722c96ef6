//! The RabbitMQ adapter (feature `rabbitmq`): [`RabbitMessage`].
//!
//! ```no_run
//! use futures_util::StreamExt;
//! use idem_consumer::Consumer;
//! use idem_consumer::rabbitmq::{DeadLetters, RabbitQueue};
//! use idem_core::{Idempotency, MemoryStore, done};
//! use lapin::{options::BasicConsumeOptions, types::FieldTable};
//!
//! # async fn consume() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let connection = lapin::Connection::connect("amqp://127.0.0.1:5672/%2f", Default::default()).await?;
//! let channel = connection.create_channel().await?;
//! // Dead letters are published with their reason to the `dead-letters` exchange under
//! // publisher confirms, on a channel of their own, before the original is acked.
//! let dead_letters = DeadLetters::publish_to(&connection.create_channel().await?, "dead-letters", "orders").await?;
//! let queue = RabbitQueue::new("orders", dead_letters);
//! // Refuses `no_ack`, under which every nak'd message would be lost.
//! let mut deliveries = queue
//!     .consume(&channel, "billing", BasicConsumeOptions::default(), FieldTable::default())
//!     .await?;
//! let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
//! while let Some(delivery) = deliveries.next().await {
//!     let message = queue.wrap(delivery?);
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
//! - AMQP has no delayed redelivery. With a delay queue ([`RabbitQueue::delays`],
//!   [`Delays`]), a nak moves the message there under publisher confirms and acks it: it
//!   comes back after its delay and holds nothing meanwhile. Without one, a nak waits its
//!   delay in a task of its own, then requeues (`basic.nack`, requeue): the delivery
//!   stays unacknowledged, so a crash requeues it anyway, but it holds one prefetch slot
//!   (`basic.qos`), and after a connection loss the messages in flight under the lost
//!   consumer's leases can fill another's prefetch for about a lease. RabbitMQ closes a channel whose delivery
//!   stays unacknowledged past its `consumer_timeout` (30 minutes by default): keep the
//!   driver's lease and the backoff's largest delay well under it.
//! - A quorum queue's `x-delivery-limit` drops or dead-letters a message after that many
//!   deliveries, naks included (RabbitMQ 4 sets 20 by default): set it above what a store
//!   outage, or a dead-letter exchange that routes nowhere, can take (a dead letter that
//!   could not be published requeues its original every 5 s), or leave it unset on
//!   classic queues. Bound the work's own attempts with
//!   [`Consumer::max_attempts`](crate::Consumer::max_attempts) instead.
//! - A `handle` future dropped mid-work leaves its delivery unacknowledged until the
//!   channel closes (AMQP has no acknowledgement timeout).
//! - Dead letters go where [`DeadLetters`] says, a choice made once:
//!   - [`DeadLetters::publish_to`]: a persistent copy (the original's properties, with the reason in
//!     the [`DEAD_LETTER_REASON`] header and the queue in [`ORIGINAL_QUEUE`]) is
//!     published `mandatory` under publisher confirms, and the original is acked only
//!     once the broker confirmed the copy was routed. A copy that no queue took, or that
//!     the broker refused, leaves the original to be delivered again. A crash between
//!     the two can publish a copy twice: dead letters are at least once.
//!   - [`DeadLetters::queue_policy`]: rejected without requeue (`basic.reject`), to the
//!     queue's own dead-letter exchange (`x-dead-letter-exchange`) with an `x-death`
//!     header and no reason (the reason is logged). RabbitMQ moves it at most once from
//!     a classic queue (a crash of the broker mid-way loses it), and a queue without a
//!     dead-letter exchange drops it: for quorum queues with `dead-letter-strategy:
//!     at-least-once`, or where that loss is acceptable.
//! - There is no stable id to fall back on when a publisher sets no `message_id` (the
//!   delivery tag changes with each delivery): such a message is dead-lettered (`no-key`)
//!   unless the consumer keys by the payload
//!   ([`Consumer::key_from_payload`](crate::Consumer::key_from_payload)).

use std::fmt;
use std::time::Duration;

use std::sync::Arc;

use bytes::Bytes;
use lapin::Confirmation;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions,
    BasicRejectOptions, ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};

use crate::{DeadLetterReason, Message, SettleError, Settlement};

/// The header that carries the reason on a dead-lettered copy.
pub const DEAD_LETTER_REASON: &str = "idem-dead-letter-reason";
/// The header that carries the original's queue on a dead-lettered copy.
pub const ORIGINAL_QUEUE: &str = "idem-original-queue";
/// The header that carries, on a copy back from the delay queue, how many times the
/// message was delivered before.
pub const DELIVERIES: &str = "idem-deliveries";

/// How long a delivery whose dead letter could not be published waits before it is
/// requeued, so a dead-letter exchange that routes nowhere is not retried in a loop.
const DEAD_LETTER_RETRY: Duration = Duration::from_secs(5);

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

/// A RabbitMQ delivery, as a [`Message`].
pub struct RabbitMessage {
    delivery: Delivery,
    payload: Bytes,
    queue: String,
    dead_letters: Option<Arc<DeadLetters>>,
    delays: Option<Delays>,
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

    /// Publishes the dead-lettered copy with its reason and waits for the broker's confirm.
    async fn publish_dead_letter(
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

    /// The original's headers for a copy, less what the broker sets on each delivery.
    fn copied_headers(&self) -> FieldTable {
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
    async fn publish_confirmed(
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

    /// Moves the message to the delay queue (a copy that comes back after `delay`), then
    /// acks the original, so that no prefetch slot is held while it waits.
    async fn delay(&self, delays: &Delays, delay: Duration) -> Result<(), SettleError> {
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

/// Where dead letters go: a choice made once, so that none is dropped unawares.
///
/// Clones share their channel and publish one copy at a time on it; build one per channel.
#[derive(Debug, Clone)]
pub struct DeadLetters {
    target: Target,
}

#[derive(Debug, Clone)]
enum Target {
    Publish(Arc<Publisher>),
    QueuePolicy,
}

#[derive(Debug)]
struct Publisher {
    channel: lapin::Channel,
    exchange: String,
    routing_key: String,
    one_at_a_time: tokio::sync::Mutex<()>,
    /// Set when a confirm did not come in time: its answer may still arrive and be taken
    /// for the next copy's, so the channel publishes nothing more.
    broken: std::sync::atomic::AtomicBool,
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

/// A copy's properties: the original's, made persistent, without an expiry (the copy
/// must outlive the original's time to live) or a user id (the broker checks it against
/// the publishing connection's user).
fn copy_properties(
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
    pub fn wrap(&self, delivery: Delivery) -> RabbitMessage {
        let mut message = RabbitMessage::new(delivery, self.queue.clone());
        message.dead_letters = Some(Arc::clone(&self.dead_letters));
        message.delays = self.delays.clone();
        message
    }
}

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
    returns_to: String,
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
