//! The JetStream adapter against a real nats-server on 127.0.0.1 (scripts/services.sh
//! starts it; `IDEM_TEST_NATS_URL`). Every wait is bounded.
//!
//! - `support.rs`: the test server's streams and helpers.
//! - `deliveries.rs`: settlements and keys; `dead_letters.rs`: dead letters;
//!   `failures.rs`: failing work and a failing store; `source.rs`: the source's checks
//!   and in-progress marks.

// The helpers this crate's test binaries share, one directory up.
#[path = "../common/mod.rs"]
mod common;
mod dead_letters;
mod deliveries;
mod failures;
mod source;
mod support;
