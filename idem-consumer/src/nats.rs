//! The NATS JetStream adapter (feature `nats`): [`JetStreamMessage`].
//!
//! ```no_run
//! use futures_util::StreamExt;
//! use idem_consumer::{Consumer, nats::JetStreamMessage};
//! use idem_core::{Idempotency, MemoryStore, done};
//!
//! # async fn consume() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let jetstream = async_nats::jetstream::new(client);
//! let stream = jetstream.get_stream("ORDERS").await?;
//! let pull: async_nats::jetstream::consumer::PullConsumer = stream.get_consumer("billing").await?;
//! let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
//!
//! let mut messages = pull.messages().await?;
//! while let Some(message) = messages.next().await {
//!     // Dead letters go to a stream of their own (DLQ.>), never back into ORDERS.
//!     let message = JetStreamMessage::new(message?).dead_letter_to("DLQ.orders");
//!     // A settlement the broker refused is delivered again: log it and go on.
//!     if let Err(err) = consumer.handle(&message, |_ctx, payload| async move { done(payload.len()) }).await {
//!         tracing::warn!(error = %err, "not settled");
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! - The key is the `Nats-Msg-Id` header, which publishers also set for JetStream's own
//!   duplicate window: the window drops a resend within minutes, idem catches every
//!   redelivery and every resend for the whole retention.
//! - The scope is `<stream>/<consumer>`: two durable consumers of one stream (billing and
//!   shipping) each handle every message once, even on one store. An ephemeral consumer's
//!   name changes with each connection: give such consumers one scope of their own
//!   ([`Consumer::scope`](crate::Consumer::scope)).
//!   Renaming a durable consumer starts a new scope: messages still in the stream run
//!   again under the new name.
//! - The delivery count is JetStream's.
//! - A nak carries its delay (`-NAK {"delay": ...}`), so the server redelivers it later.
//! - An ack is a plain `+ACK`, not confirmed by the server: one that is lost only means a
//!   redelivery, which replays.
//! - A dead letter is published to the subject of [`JetStreamMessage::dead_letter_to`]
//!   (with the reason and the original's stream, consumer, sequence and id in headers,
//!   and a `Nats-Msg-Id` of its own so a repeat within the dead-letter stream's duplicate
//!   window is dropped), then terminated (`+TERM`); without a subject it is only
//!   terminated, which JetStream reports as a `MSG_TERMINATED` advisory. The subject must
//!   belong to another stream than the message's: a copy stored back in the same stream
//!   would be a new message, run again ([`SettleError::Misconfigured`]).
//! - Leave the consumer's `max_deliver` unlimited (the default), or above what a store
//!   outage can take: naks count as deliveries. Set `ack_wait` above the longest work: a
//!   delivery redelivered while its work still runs is answered as in flight.

use std::fmt;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind};
use bytes::Bytes;

use crate::{DeadLetterReason, Message, SettleError, Settlement};

/// The header that carries the reason on a dead-lettered copy.
pub const DEAD_LETTER_REASON: &str = "Idem-Dead-Letter-Reason";
/// The header that carries the original's stream on a dead-lettered copy.
pub const ORIGINAL_STREAM: &str = "Idem-Original-Stream";
/// The header that carries the consumer that dead-lettered the copy.
pub const ORIGINAL_CONSUMER: &str = "Idem-Original-Consumer";
/// The header that carries the original's stream sequence on a dead-lettered copy.
pub const ORIGINAL_SEQUENCE: &str = "Idem-Original-Sequence";
/// The header that carries the original's `Nats-Msg-Id` on a dead-lettered copy.
pub const ORIGINAL_ID: &str = "Idem-Original-Msg-Id";

/// A JetStream delivery, as a [`Message`].
pub struct JetStreamMessage {
    message: jetstream::Message,
    stream: String,
    consumer: Option<String>,
    /// `<stream>/<consumer>`: the scope.
    source: String,
    sequence: Option<u64>,
    delivered: Option<u64>,
    dead_letter_subject: Option<String>,
}

impl fmt::Debug for JetStreamMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamMessage")
            .field("stream", &self.stream)
            .field("consumer", &self.consumer)
            .field("sequence", &self.sequence)
            .field("delivered", &self.delivered)
            .field("payload_len", &self.message.payload.len())
            .finish_non_exhaustive()
    }
}

impl JetStreamMessage {
    /// Wraps a delivery from a JetStream consumer. A message that did not come through
    /// JetStream (no ack subject) is scoped by its subject, and settling it fails.
    pub fn new(message: jetstream::Message) -> Self {
        let (stream, consumer, sequence, delivered) = match message.info() {
            Ok(info) => (
                info.stream.to_owned(),
                Some(info.consumer.to_owned()),
                Some(info.stream_sequence),
                u64::try_from(info.delivered).ok(),
            ),
            Err(_) => (message.subject.to_string(), None, None, None),
        };
        let source = match &consumer {
            Some(consumer) => format!("{stream}/{consumer}"),
            None => stream.clone(),
        };
        Self {
            message,
            stream,
            consumer,
            source,
            sequence,
            delivered,
            dead_letter_subject: None,
        }
    }

    /// Publishes dead letters to `subject` (a subject of a stream of their own, say)
    /// before terminating them.
    pub fn dead_letter_to(mut self, subject: impl Into<String>) -> Self {
        self.dead_letter_subject = Some(subject.into());
        self
    }

    /// The delivery.
    pub fn get_ref(&self) -> &jetstream::Message {
        &self.message
    }

    /// The delivery, unwrapped.
    pub fn into_inner(self) -> jetstream::Message {
        self.message
    }

    async fn ack_with(&self, action: Settlement, kind: AckKind) -> Result<(), SettleError> {
        if self.message.reply.is_none() {
            return Err(SettleError::Closed { action });
        }
        self.message
            .ack_with(kind)
            .await
            .map_err(|err| SettleError::broker(action, err))
    }

    async fn publish_dead_letter(
        &self,
        subject: &str,
        reason: DeadLetterReason,
    ) -> Result<(), SettleError> {
        let broker = |err: idem_core::BoxError| SettleError::broker(Settlement::DeadLetter, err);
        // A copy stored in the message's own stream would come back as a new message
        // and run again: refuse before publishing. A user without the permission to look
        // streams up (or a lookup that failed) still dead-letters: the check is a guard
        // against a mistake, not the dead-lettering itself.
        let target = self.message.context.stream_by_subject(subject).await;
        if let Err(err) = &target {
            tracing::debug!(error = %err, "idem-consumer: could not look up the dead-letter subject's stream");
        }
        if target.is_ok_and(|target| target == self.stream) {
            return Err(SettleError::Misconfigured {
                action: Settlement::DeadLetter,
                problem: "the dead-letter subject belongs to the message's own stream, where a copy would run again; use a subject of another stream",
            });
        }
        let consumer = self.consumer.as_deref().unwrap_or_default();
        let mut headers = HeaderMap::new();
        headers.insert(DEAD_LETTER_REASON, reason.as_str());
        headers.insert(ORIGINAL_STREAM, self.stream.as_str());
        headers.insert(ORIGINAL_CONSUMER, consumer);
        if let Some(sequence) = self.sequence {
            headers.insert(ORIGINAL_SEQUENCE, sequence.to_string().as_str());
            // A repeated dead-lettering of the same delivery by the same consumer is
            // dropped by the dead-letter stream's duplicate window; another consumer's
            // is its own.
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                format!("idem-dead-letter/{}/{consumer}/{sequence}", self.stream).as_str(),
            );
        }
        if let Some(id) = self.id() {
            headers.insert(ORIGINAL_ID, id);
        }
        let ack = self
            .message
            .context
            .publish_with_headers(subject.to_owned(), headers, self.message.payload.clone())
            .await
            .map_err(|err| broker(err.into()))?;
        ack.await.map_err(|err| broker(err.into()))?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Message for JetStreamMessage {
    fn id(&self) -> Option<&str> {
        self.message
            .headers
            .as_ref()?
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|id| id.as_str())
    }

    fn source(&self) -> &str {
        &self.source
    }

    fn payload(&self) -> &Bytes {
        &self.message.payload
    }

    fn delivery_count(&self) -> Option<u64> {
        self.delivered
    }

    async fn ack(&self) -> Result<(), SettleError> {
        self.ack_with(Settlement::Ack, AckKind::Ack).await
    }

    async fn nak(&self, delay: Duration) -> Result<(), SettleError> {
        self.ack_with(Settlement::Nak, AckKind::Nak(Some(delay)))
            .await
    }

    async fn dead_letter(&self, reason: DeadLetterReason) -> Result<(), SettleError> {
        if let Some(subject) = &self.dead_letter_subject {
            self.publish_dead_letter(subject, reason).await?;
        }
        self.ack_with(Settlement::DeadLetter, AckKind::Term).await
    }
}
