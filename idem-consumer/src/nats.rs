//! The NATS JetStream adapter (feature `nats`): [`JetStreamMessage`].
//!
//! ```no_run
//! use futures_util::StreamExt;
//! use idem_consumer::Consumer;
//! use idem_consumer::nats::{DeadLetters, JetStreamSource};
//! use idem_core::{Idempotency, MemoryStore, done};
//!
//! # async fn consume() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = async_nats::connect("nats://127.0.0.1:4222").await?;
//! let jetstream = async_nats::jetstream::new(client);
//! let stream = jetstream.get_stream("ORDERS").await?;
//! let pull: async_nats::jetstream::consumer::PullConsumer = stream.get_consumer("billing").await?;
//! // Refuses a consumer whose ack policy would lose naks; dead letters go to a stream of
//! // their own (DLQ.>), never back into ORDERS.
//! let source = JetStreamSource::new(pull.cached_info(), DeadLetters::publish_to("DLQ.orders"))?;
//! let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
//!
//! let mut messages = pull.messages().await?;
//! while let Some(message) = messages.next().await {
//!     let message = source.wrap(message?);
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
//! - A message without one (`js.publish` sets none) is keyed by where the stream stored
//!   it: `nats-stream-sequence/<stream>/<sequence>/<stored at, in nanoseconds>`, the
//!   same on every redelivery, and never reused by a stream deleted and created again.
//!   It catches every redelivery, but a publisher's own resend (a publish retried after
//!   a lost answer) is stored twice and runs twice: publishers that resend set an id,
//!   or key by the payload ([`Consumer::key_from_payload`](crate::Consumer::key_from_payload)).
//! - [`JetStreamSource::new`] refuses a consumer that does not acknowledge each message
//!   explicitly: under `AckPolicy::All` an ack of a later message acks a nak'd earlier
//!   one, and under `AckPolicy::None` every nak'd message is lost.
//! - While the work runs, and while a message waits for its turn in a batch, the
//!   delivery is marked in progress (`+WPI`) every third of the consumer's `ack_wait`,
//!   so work longer than `ack_wait` is not delivered again meanwhile.
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
//!   outage can take: naks count as deliveries. Bound the work's attempts with
//!   [`Consumer::max_attempts`](crate::Consumer::max_attempts) instead, which ends in a
//!   dead letter with its reason.

use std::fmt;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::AckPolicy;
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
    /// The key when the publisher gave no `Nats-Msg-Id`: where the stream stored it.
    stored_at: Option<String>,
    dead_letter_subject: Option<String>,
    progress_every: Option<Duration>,
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
    /// Wraps a delivery from a JetStream consumer, unchecked: no dead-letter subject (a
    /// dead letter is only terminated) and no in-progress marks. Prefer
    /// [`JetStreamSource::wrap`], which checks the consumer's settings once and sets both.
    /// A message that did not come through JetStream (no ack subject) is scoped by its
    /// subject, and settling it fails.
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
        // The same on every delivery of one stored message, and never reused by a
        // recreated stream.
        let stored_at =
            sequence.map(
                |sequence| match message.reply.as_deref().and_then(stored_nanos) {
                    Some(nanos) => format!("nats-stream-sequence/{stream}/{sequence}/{nanos}"),
                    None => format!("nats-stream-sequence/{stream}/{sequence}"),
                },
            );
        Self {
            message,
            stream,
            consumer,
            source,
            sequence,
            delivered,
            stored_at,
            dead_letter_subject: None,
            progress_every: None,
        }
    }

    /// Marks the delivery in progress (`+WPI`) every `every` while it is handled; a third
    /// of the consumer's `ack_wait` is right. Zero turns the marks off.
    pub fn progress_every(mut self, every: Duration) -> Self {
        self.progress_every = Some(every).filter(|every| !every.is_zero());
        self
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

    /// The publisher's `Nats-Msg-Id`, if it set one.
    fn publisher_id(&self) -> Option<&str> {
        self.message
            .headers
            .as_ref()?
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|id| id.as_str())
            .filter(|id| !id.is_empty())
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
            // The stored time too: a recreated stream's message of the same sequence is
            // another message, not a repeat for the window to drop.
            let stored = self
                .message
                .reply
                .as_deref()
                .and_then(stored_nanos)
                .unwrap_or_default();
            headers.insert(ORIGINAL_SEQUENCE, sequence.to_string().as_str());
            // A repeated dead-lettering of the same delivery by the same consumer is
            // dropped by the dead-letter stream's duplicate window; another consumer's
            // is its own.
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                format!(
                    "idem-dead-letter/{}/{consumer}/{sequence}/{stored}",
                    self.stream
                )
                .as_str(),
            );
        }
        if let Some(id) = self.publisher_id() {
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
            .as_ref()
            .and_then(|headers| headers.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|id| id.as_str())
            .filter(|id| !id.is_empty())
            .or(self.stored_at.as_deref())
    }

    fn source(&self) -> &str {
        &self.source
    }

    fn payload(&self) -> &Bytes {
        &self.message.payload
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.message
            .headers
            .as_ref()?
            .get(name)
            .map(|value| value.as_str())
    }

    fn delivery_count(&self) -> Option<u64> {
        self.delivered
    }

    fn progress_interval(&self) -> Option<Duration> {
        self.progress_every
    }

    async fn in_progress(&self) -> Result<(), SettleError> {
        self.ack_with(Settlement::InProgress, AckKind::Progress)
            .await
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

/// When the stream stored the message, in nanoseconds since the epoch: the ack subject's
/// timestamp token (`$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.
/// <timestamp>.<pending>`, with a domain and an account hash after `ACK` in the newer
/// form, which may end in further tokens), read as async-nats reads it.
fn stored_nanos(reply: &str) -> Option<&str> {
    let tokens: Vec<&str> = reply.split('.').collect();
    let index = match tokens.len() {
        9 => 7,
        11.. => 9,
        _ => return None,
    };
    let nanos = tokens.get(index)?;
    (!nanos.is_empty() && nanos.bytes().all(|b| b.is_ascii_digit())).then_some(nanos)
}

/// Where dead letters go: a choice made once, so that none is dropped unawares.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadLetters {
    /// Published (with the reason and the original's stream, consumer, sequence and id
    /// in headers) to a subject of another stream, then terminated.
    Publish {
        /// The subject.
        subject: String,
    },
    /// Only terminated (`+TERM`): JetStream reports a `MSG_TERMINATED` advisory, and the
    /// message stays in the stream until its limits remove it (a work-queue stream
    /// removes it at once). For setups that collect the advisories.
    Terminate,
}

impl DeadLetters {
    /// [`DeadLetters::Publish`] to `subject`.
    pub fn publish_to(subject: impl Into<String>) -> Self {
        DeadLetters::Publish {
            subject: subject.into(),
        }
    }
}

/// A JetStream consumer's settings, checked once: the source of [`JetStreamMessage`]s
/// that mark themselves in progress and dead-letter where they were told.
///
/// ```no_run
/// use async_nats::jetstream::consumer::PullConsumer;
/// use idem_consumer::nats::{DeadLetters, JetStreamSource, SetupError};
///
/// # async fn set_up(pull: PullConsumer) -> Result<(), SetupError> {
/// // A consumer that acks each message is accepted, and marks deliveries in progress
/// // every third of its ack wait; one whose acks cover earlier messages is refused.
/// let source = JetStreamSource::new(pull.cached_info(), DeadLetters::publish_to("DLQ.orders"))?;
/// println!("in progress every {:?}", source.progress_every());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct JetStreamSource {
    dead_letters: DeadLetters,
    progress_every: Duration,
}

/// A JetStream consumer whose settings would lose messages.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The consumer does not acknowledge each message on its own.
    #[error(
        "the JetStream consumer `{consumer}` acknowledges with AckPolicy::{policy:?}, which loses nak'd messages (All: an ack of a later message acks them; None: nothing is redelivered); create it with AckPolicy::Explicit"
    )]
    AckPolicy {
        /// The consumer's name.
        consumer: String,
        /// Its ack policy.
        policy: AckPolicy,
    },
    /// The dead-letter subject is empty.
    #[error("the dead-letter subject is empty; name a subject of another stream")]
    EmptySubject,
}

/// JetStream's `ack_wait` when a consumer sets none.
const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

impl JetStreamSource {
    /// Checks a consumer's settings (`PullConsumer::cached_info`, or a push consumer's).
    ///
    /// # Errors
    /// [`SetupError::AckPolicy`] for a consumer whose ack policy is not `Explicit`;
    /// [`SetupError::EmptySubject`] for an empty dead-letter subject.
    pub fn new(
        consumer: &jetstream::consumer::Info,
        dead_letters: DeadLetters,
    ) -> Result<Self, SetupError> {
        let policy = consumer.config.ack_policy;
        if policy != AckPolicy::Explicit {
            return Err(SetupError::AckPolicy {
                consumer: consumer.name.clone(),
                policy,
            });
        }
        if matches!(&dead_letters, DeadLetters::Publish { subject } if subject.is_empty()) {
            return Err(SetupError::EmptySubject);
        }
        let ack_wait = Some(consumer.config.ack_wait)
            .filter(|wait| !wait.is_zero())
            .unwrap_or(DEFAULT_ACK_WAIT);
        Ok(Self {
            dead_letters,
            progress_every: (ack_wait / 3).max(Duration::from_millis(1)),
        })
    }

    /// How often a delivery is marked in progress: a third of the consumer's `ack_wait`.
    pub fn progress_every(&self) -> Duration {
        self.progress_every
    }

    /// A delivery of the checked consumer, as a [`Message`].
    pub fn wrap(&self, message: jetstream::Message) -> JetStreamMessage {
        let message = JetStreamMessage::new(message).progress_every(self.progress_every);
        match &self.dead_letters {
            DeadLetters::Publish { subject } => message.dead_letter_to(subject.clone()),
            DeadLetters::Terminate => message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::stored_nanos;

    #[test]
    fn the_stored_time_is_read_from_every_ack_subject_form() {
        let v1 = "$JS.ACK.ORDERS.billing.1.7.7.1733300000000000000.0";
        assert_eq!(stored_nanos(v1), Some("1733300000000000000"));
        let v2 = "$JS.ACK.hub.ACCHASH.ORDERS.billing.1.7.7.1733300000000000000.0";
        assert_eq!(stored_nanos(v2), Some("1733300000000000000"));
        let v2_token = format!("{v2}.random");
        assert_eq!(stored_nanos(&v2_token), Some("1733300000000000000"));
        let v2_more = format!("{v2}.random.later");
        assert_eq!(stored_nanos(&v2_more), Some("1733300000000000000"));
    }

    #[test]
    fn a_subject_of_another_shape_has_no_stored_time() {
        assert_eq!(stored_nanos("_INBOX.abc"), None);
        assert_eq!(
            stored_nanos("$JS.ACK.ORDERS.billing.1.7.7.notanumber.0"),
            None
        );
        assert_eq!(stored_nanos("$JS.ACK.ORDERS.billing.1.7.7..0"), None);
        assert_eq!(stored_nanos("$JS.ACK.a.b.c.d.e.f.g"), None);
    }
}
