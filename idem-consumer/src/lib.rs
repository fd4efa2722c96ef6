//! # idem-consumer
//!
//! Queue consumers and scheduled jobs made idempotent with [idem](idem_core): brokers
//! deliver at least once and schedulers fire twice; the effect happens once.
//!
//! - [`Consumer`] handles each delivery of a message under one key (the message's id, or
//!   a function of its payload), runs the work through [`Idempotency::execute`], and
//!   settles the delivery with the broker only once the answer is stored: ack, nak with a
//!   delay, or the dead-letter path with a reason. [`Consumer::handle_batch`] runs a
//!   batch concurrently, each message settled on its own.
//! - [`ScheduledJob`] runs a job once per slot of its schedule, keyed by the slot's time,
//!   however many schedulers fire it; a slot whose scheduler crashed is taken over.
//! - [`Message`] is what the consumer needs of a broker; adapters: `nats` (NATS
//!   JetStream, feature `nats`), `rabbitmq` (feature `rabbitmq`), `redis` (Redis
//!   Streams consumer groups, feature `redis`) and `sqs` (Amazon SQS, feature `sqs`);
//!   `lambda` (feature `lambda`) answers an AWS Lambda's SQS events with partial batch
//!   failures. Kafka has no adapter yet (no broker runs
//!   in this project's CI): one on a well-kept client (rdkafka) implements [`Message`]
//!   with the topic, partition and offset as the key, a no-op
//!   [`in_progress`](Message::in_progress), and a nak that seeks back.
//!
//! Exactly-once effect needs the effect and the result to land together: write the
//! effect in the store's own transaction ([`Context::prepare_completion`] with
//! `idem-sqlite`'s or `idem-postgres`'s `complete_in`), checkpoint it with
//! [`Context::step`], or pass [`Context::derive`]'s key to a downstream system that
//! deduplicates. Work that only reads and writes the message's own state is covered by
//! the stored result alone.
//!
//! ```
//! use bytes::Bytes;
//! use idem_consumer::{Consumer, DeadLetterReason, Message, SettleError, Settled};
//! use idem_core::{Idempotency, MemoryStore, WorkError};
//! # use std::time::Duration;
//! # struct Delivery(&'static str, Bytes);
//! # #[async_trait::async_trait]
//! # impl Message for Delivery {
//! #     fn id(&self) -> Option<&str> { Some(self.0) }
//! #     fn source(&self) -> &str { "orders" }
//! #     fn payload(&self) -> &Bytes { &self.1 }
//! #     async fn ack(&self) -> Result<(), SettleError> { Ok(()) }
//! #     async fn nak(&self, _: Duration) -> Result<(), SettleError> { Ok(()) }
//! #     async fn dead_letter(&self, _: DeadLetterReason) -> Result<(), SettleError> { Ok(()) }
//! # }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let consumer = Consumer::new(Idempotency::new(MemoryStore::new()));
//! let ship = |_ctx, payload: Bytes| async move {
//!     if payload.is_empty() {
//!         return Err(WorkError::Permanent("an empty order".to_string()));
//!     }
//!     Ok(format!("shipped {} bytes", payload.len()))
//! };
//! let settled = consumer.handle(&Delivery("order-1", Bytes::from_static(b"2 mugs")), ship).await?;
//! assert!(matches!(settled, Settled::Acked { replayed: false, .. }));
//! let settled = consumer.handle(&Delivery("order-2", Bytes::new()), ship).await?;
//! assert!(matches!(settled, Settled::DeadLettered { reason: DeadLetterReason::Failed, .. }));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! ## Where things live
//!
//! - `consumer/`: [`Consumer`] and its settings (`mod.rs`), handling a delivery or a
//!   batch (`handle.rs`), the settle table (`decision.rs`), in-progress marks
//!   (`progress.rs`); `settled.rs`: [`Settled`], [`Cause`]; `backoff.rs`: [`Backoff`].
//! - `message.rs`: [`Message`], [`DeadLetterReason`], [`SettleError`].
//! - `run.rs`: [`Consumer::run`], the loop with graceful shutdown, over a [`Source`].
//! - `trace.rs`: the span a delivery is handled in, with its W3C trace context.
//! - `schedule/`: [`ScheduledJob`] and its settings (`mod.rs`), slot times and keys
//!   (`slots.rs`), running slots (`run.rs`).
//! - `nats.rs`, `rabbitmq/`, `redis.rs`, `sqs.rs`: the adapters (`rabbitmq/mod.rs` lists
//!   its files); `lambda.rs`: Lambda's SQS events.
//!
//! [`Idempotency::execute`]: idem_core::Idempotency::execute
//! [`Context::prepare_completion`]: idem_core::Context::prepare_completion
//! [`Context::step`]: idem_core::Context::step
//! [`Context::derive`]: idem_core::Context::derive

#![warn(missing_docs)]

mod backoff;
mod consumer;
#[cfg(feature = "cron")]
mod cron;
mod deadline;
#[cfg(feature = "lambda")]
pub mod lambda;
mod message;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "redis")]
pub mod redis;
mod run;
mod schedule;
mod settled;
#[cfg(feature = "sqs")]
pub mod sqs;
mod trace;

pub use backoff::{Backoff, BackoffError};
pub use consumer::{Consumer, DEFAULT_CONCURRENCY, UNREADABLE_AFTER};
#[cfg(feature = "cron")]
pub use cron::CronSyntax;
pub use message::{DeadLetterReason, Message, SettleError, Settlement};
pub use run::{RunReport, Source, StreamSource, StreamSourceError};
pub use schedule::{Backlog, MAX_CATCH_UP_SLOTS, ScheduleError, ScheduledJob, SlotRun};
pub use settled::{Cause, Settled};
pub use trace::TRACEPARENT;

/// The crate README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
