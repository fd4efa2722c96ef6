//! What the consumer needs of a broker's message: [`Message`], and how settling it fails.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use idem_core::BoxError;

/// One delivery of a message from an at-least-once broker.
///
/// The consumer reads the id, the payload and the source to build the key and the
/// fingerprint, then settles the delivery exactly once with one of `ack`, `nak` or
/// `dead_letter`. Adapters: `nats::JetStreamMessage`
/// (feature `nats`) and `rabbitmq::RabbitMessage`
/// (feature `rabbitmq`). Implement it for another broker, or for a test double:
///
/// ```
/// use bytes::Bytes;
/// use idem_consumer::{DeadLetterReason, Message, SettleError};
/// use std::sync::Mutex;
/// use std::time::Duration;
///
/// struct TestMessage { id: String, payload: Bytes, settled: Mutex<Option<String>> }
///
/// #[async_trait::async_trait]
/// impl Message for TestMessage {
///     fn id(&self) -> Option<&str> { Some(&self.id) }
///     fn source(&self) -> &str { "orders" }
///     fn payload(&self) -> &Bytes { &self.payload }
///     async fn ack(&self) -> Result<(), SettleError> {
///         *self.settled.lock().unwrap() = Some("ack".into());
///         Ok(())
///     }
///     async fn nak(&self, delay: Duration) -> Result<(), SettleError> {
///         *self.settled.lock().unwrap() = Some(format!("nak {delay:?}"));
///         Ok(())
///     }
///     async fn dead_letter(&self, reason: DeadLetterReason) -> Result<(), SettleError> {
///         *self.settled.lock().unwrap() = Some(format!("dead letter: {reason}"));
///         Ok(())
///     }
/// }
/// ```
#[async_trait::async_trait]
pub trait Message: Send + Sync {
    /// The id its publisher gave the message (NATS `Nats-Msg-Id`, AMQP `message_id`).
    ///
    /// - The default key: equal ids are the same message, whatever the delivery.
    /// - `None` when the message carries none; the consumer then needs a key function
    ///   ([`Consumer::key_from_payload`](crate::Consumer::key_from_payload)) or
    ///   dead-letters it ([`DeadLetterReason::NoKey`]).
    fn id(&self) -> Option<&str>;

    /// Where the message came from: the JetStream stream, the AMQP queue. The default
    /// scope, so equal ids from two sources are two messages.
    fn source(&self) -> &str;

    /// The message body, fingerprinted and handed to the work.
    fn payload(&self) -> &Bytes;

    /// A header of the message (NATS and AMQP headers, an SQS message attribute, a Redis
    /// stream entry's field), matched as the broker matches names; `None` when absent or
    /// not text. Read for [`Consumer::key_from_header`](crate::Consumer::key_from_header)
    /// and for the W3C `traceparent` the work's span records. The default is `None`.
    fn header(&self, name: &str) -> Option<&str> {
        let _ = name;
        None
    }

    /// The group whose messages must take effect in order (an SQS FIFO queue's message
    /// group); `None` (the default) when order does not matter.
    /// [`Consumer::handle_batch`](crate::Consumer::handle_batch) runs a group's messages
    /// one after another and holds back the ones behind a message that was not acked.
    fn ordering_key(&self) -> Option<&str> {
        None
    }

    /// How many times the broker has delivered the message, this delivery included, when
    /// the broker says (JetStream always does; RabbitMQ's quorum queues do). Scales the
    /// backoff of a retryable failure. The default is `None`.
    fn delivery_count(&self) -> Option<u64> {
        None
    }

    /// How often the consumer tells the broker, while the work runs or the delivery waits
    /// for its turn in a batch, that the delivery is still being handled
    /// ([`Message::in_progress`]). `None` (the default) sends nothing.
    ///
    /// - A broker with an acknowledgement timeout (JetStream's `ack_wait`, SQS's
    ///   visibility timeout, a Redis Streams claim's idle time) redelivers a delivery that
    ///   stays silent past it; each such copy is answered "in flight" and counts as a
    ///   delivery. An adapter for such a broker answers a fraction of that timeout (a
    ///   third, say), so one late tick never lets it run out.
    /// - A zero duration is taken as `None`.
    fn progress_interval(&self) -> Option<Duration> {
        None
    }

    /// Tells the broker the delivery is still being handled, so that it is not delivered
    /// again meanwhile (JetStream `+WPI`, SQS `ChangeMessageVisibility`, Redis `XCLAIM`).
    ///
    /// - Called every [`Message::progress_interval`] until the delivery is settled; never
    ///   after it is settled, never concurrently with itself.
    /// - The default does nothing.
    ///
    /// # Errors
    /// [`SettleError`] when the broker did not take it. The consumer logs it and goes on:
    /// the worst case is a redelivery, answered "in flight" while the work runs.
    async fn in_progress(&self) -> Result<(), SettleError> {
        Ok(())
    }

    /// Tells the broker the message is handled: it is never delivered again.
    ///
    /// - Called only after the result is stored, so a crash before or during the ack
    ///   leads to a redelivery that replays the stored result.
    ///
    /// # Errors
    /// [`SettleError`] when the broker did not take the ack; it will redeliver.
    async fn ack(&self) -> Result<(), SettleError>;

    /// Asks the broker to deliver the message again after `delay`.
    ///
    /// - A broker without delayed redelivery (RabbitMQ) waits `delay` first, without
    ///   holding up the consumer, and an adapter must not lose the message meanwhile:
    ///   a crash in the wait leaves it unacknowledged, so the broker redelivers anyway.
    ///
    /// # Errors
    /// [`SettleError`] when the broker did not take it; it will redeliver after its own
    /// acknowledgement timeout.
    async fn nak(&self, delay: Duration) -> Result<(), SettleError>;

    /// Takes the message off the queue for good, to the broker's dead-letter path, with
    /// the reason.
    ///
    /// - JetStream: published to the dead-letter subject if one is configured, then
    ///   terminated. RabbitMQ: rejected without requeue, to the queue's dead-letter
    ///   exchange.
    ///
    /// # Errors
    /// [`SettleError`] when the broker did not take it; it will redeliver, and the
    /// consumer decides the same again (the reason is stored or deterministic).
    async fn dead_letter(&self, reason: DeadLetterReason) -> Result<(), SettleError>;
}

/// How the consumer settles a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settlement {
    /// Handled: acknowledged.
    Ack,
    /// Delivered again later: negatively acknowledged with a delay.
    Nak,
    /// Taken off the queue for good.
    DeadLetter,
    /// Still being handled: not to be delivered again yet.
    InProgress,
}

impl fmt::Display for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Settlement::Ack => "acknowledge",
            Settlement::Nak => "negatively acknowledge",
            Settlement::DeadLetter => "dead-letter",
            Settlement::InProgress => "mark in progress",
        })
    }
}

/// Why a message went to the dead-letter path: it will never succeed by redelivery.
///
/// [`as_str`](DeadLetterReason::as_str) is a stable code for a header or a log field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// The work failed permanently; the failure is stored and replayed to every
    /// redelivery.
    Failed,
    /// The key was used before for a different payload: two messages share an id.
    KeyReused,
    /// The message has no id, and no key function gave one.
    NoKey,
    /// The id (or the key function's answer) is not a valid key: empty, too long, or
    /// with control characters.
    BadKey,
    /// The driver's key policy refused the key.
    KeyRefused,
    /// The result or the error cannot be stored (too large, not serialisable); that is
    /// stored, and the work never runs again.
    Unstorable,
    /// The stored answer cannot be read (its type changed across a deploy, or the codec
    /// found it altered): the work ran before and never runs again; the record is left
    /// for an operator (`idem inspect`).
    Unreadable,
    /// The work failed, timed out or panicked on as many deliveries as
    /// [`Consumer::max_attempts`](crate::Consumer::max_attempts) allows.
    AttemptsExhausted,
}

impl DeadLetterReason {
    /// A stable code: `failed`, `key-reused`, `no-key`, `bad-key`, `key-refused`,
    /// `unstorable`, `unreadable`, `attempts-exhausted`.
    ///
    /// ```
    /// assert_eq!(idem_consumer::DeadLetterReason::KeyReused.as_str(), "key-reused");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            DeadLetterReason::Failed => "failed",
            DeadLetterReason::KeyReused => "key-reused",
            DeadLetterReason::NoKey => "no-key",
            DeadLetterReason::BadKey => "bad-key",
            DeadLetterReason::KeyRefused => "key-refused",
            DeadLetterReason::Unstorable => "unstorable",
            DeadLetterReason::Unreadable => "unreadable",
            DeadLetterReason::AttemptsExhausted => "attempts-exhausted",
        }
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The broker did not take a settlement. Nothing is lost: an unsettled delivery is
/// delivered again, and the redelivery replays whatever was stored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettleError {
    /// The broker or the client answered an error.
    #[error("the broker did not {action} the message: {source}; it will be delivered again")]
    Broker {
        /// What was asked.
        action: Settlement,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The delivery's channel or connection is gone, so it can no longer be settled; the
    /// broker delivers it again to another consumer.
    #[error(
        "the message's channel closed before it could {action} it; the broker delivers it again"
    )]
    Closed {
        /// What was asked.
        action: Settlement,
    },
    /// The delivery was settled before (a settlement retried after its first try landed);
    /// nothing more was sent.
    #[error("the message was already settled; nothing more was sent to {action} it")]
    AlreadySettled {
        /// What was asked.
        action: Settlement,
    },
    /// The setup cannot work: the broker was not asked. Fix the setting; the message
    /// stays unsettled and is delivered again.
    #[error("cannot {action} the message: {problem}")]
    Misconfigured {
        /// What was asked.
        action: Settlement,
        /// What is wrong and what to do.
        problem: &'static str,
    },
}

impl SettleError {
    /// A [`SettleError::Broker`] from a client's error, for adapters.
    pub fn broker(action: Settlement, source: impl Into<BoxError>) -> Self {
        SettleError::Broker {
            action,
            source: source.into(),
        }
    }

    /// What was asked of the broker.
    pub fn action(&self) -> Settlement {
        match self {
            SettleError::Broker { action, .. }
            | SettleError::Closed { action }
            | SettleError::AlreadySettled { action }
            | SettleError::Misconfigured { action, .. } => *action,
        }
    }
}
