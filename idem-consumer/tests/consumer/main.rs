//! The consumer's settle table, row by row, on the memory store and a message double.
//!
//! - `support.rs`: the consumer under test; `../common`: the message double.
//! - `answers.rs`: the work's answers; `failure_rows.rs`: the table's failure rows.
//! - `keys.rs`: keys, fingerprints, scopes.
//! - `batches.rs`: batches; `settling.rs`: telling the broker; `running.rs`: the loop.
//! - `backoff.rs`: the backoff.

mod answers;
mod backoff;
mod batches;
// The helpers this crate's test binaries share, one directory up.
#[path = "../common/mod.rs"]
mod common;
mod failure_rows;
mod keys;
mod running;
mod settling;
mod support;
