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

// Where things live (the docs above are the users'):
// - this file: the headers on copies (`DEAD_LETTER_REASON`, `ORIGINAL_QUEUE`,
//   `DELIVERIES`).
// - `message.rs`: `RabbitMessage` and how it settles.
// - `queue.rs`: `RabbitQueue`, `SetupError`; `dead_letters.rs`: `DeadLetters`;
//   `delays.rs`: `Delays`, the delay queue.
// - `copies.rs`: copies of a message published under publisher confirms (dead letters,
//   delayed naks).

mod copies;
mod dead_letters;
mod delays;
mod message;
mod queue;

pub use dead_letters::DeadLetters;
pub use delays::Delays;
pub use message::RabbitMessage;
pub use queue::{RabbitQueue, SetupError};

/// The header that carries the reason on a dead-lettered copy.
pub const DEAD_LETTER_REASON: &str = "idem-dead-letter-reason";
/// The header that carries the original's queue on a dead-lettered copy.
pub const ORIGINAL_QUEUE: &str = "idem-original-queue";
/// The header that carries, on a copy back from the delay queue, how many times the
/// message was delivered before.
pub const DELIVERIES: &str = "idem-deliveries";
