//! The RabbitMQ adapter against a real rabbitmq-server on 127.0.0.1
//! (scripts/services.sh starts it; `IDEM_TEST_RABBITMQ_URL`). Every wait is bounded.
//!
//! - `support.rs`: the test broker's queues and helpers.
//! - `deliveries.rs`: settlements and delivery counts; `dead_letters.rs`: dead letters;
//!   `delays.rs`: the delay queue; `consuming.rs`: consuming a queue, the loop.

// The helpers this crate's test binaries share, one directory up.
#[path = "../common/mod.rs"]
mod common;
mod consuming;
mod dead_letters;
mod delays;
mod deliveries;
mod support;
