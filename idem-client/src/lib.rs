//! # idem-client
//!
//! The caller's half of idempotency, for [reqwest] through [`reqwest_middleware`]. An
//! idempotency key only works if the caller keeps it: one key per logical operation, made
//! when the user acts, sent again on every retry of that operation and never on another.
//! Most duplicate charges come from clients that make a new key per HTTP attempt, or retry
//! without one. [`IdempotencyMiddleware`] does it right:
//!
//! ```no_run
//! use idem_client::{IdempotencyKey, IdempotencyMiddleware, RetryPolicy};
//! use std::time::Duration;
//!
//! # async fn pay() -> Result<(), Box<dyn std::error::Error>> {
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(IdempotencyMiddleware::new().policy(RetryPolicy::default().deadline(Duration::from_secs(20))))
//!     .build();
//! let response = client
//!     .post("http://127.0.0.1:3000/payments")
//!     .with_extension(IdempotencyKey::new("order-1187")?)
//!     .body(r#"{"amount":500}"#)
//!     .send()
//!     .await?;
//! # let _ = response;
//! # Ok(())
//! # }
//! ```
//!
//! A connection cut after the server processed the request, a timeout, a 409 saying the
//! first try still runs (idem-http's or Stripe's), a 429 or a 503, a gateway's 408, 502
//! or 504: the same request goes again with the same key, after `Retry-After` or a
//! backoff, within a per-try timeout, a deadline and a retry budget, and the server
//! (idem-http on the other side) answers the first result. A 400 or a 422 is never
//! retried: it is a bug to surface; nor a 500, the server's own word that the request
//! failed. An operation that ends without an answer comes back with its key
//! ([`key_of`]), to retry later. A 409 in flight is polled with backoff, never later
//! than its `Retry-After`; one that idem-http marks `"held": true` (the key waits out
//! its lease after an answer that was not kept) is tried again only after its whole
//! `Retry-After`, or handed back at once when the deadline ends first.
//!
//! ## Where things live
//!
//! - `middleware.rs`: [`IdempotencyMiddleware`], the tries and their classification.
//! - `key.rs`: [`IdempotencyKey`], the header's Structured Field form.
//! - `policy.rs`: [`RetryPolicy`], backoff and `Retry-After`.
//! - `body.rs`: stream bodies buffered to be sent again, 409 bodies read and handed back.
//! - `answer.rs`: [`Attempts`]; `error.rs`: [`ClientError`], [`key_of`].

#![warn(missing_docs)]

mod answer;
mod body;
mod error;
mod key;
mod middleware;
mod policy;

pub use answer::Attempts;
pub use error::{ClientError, key_of};
pub use key::{HeaderForm, IDEMPOTENCY_KEY, IdempotencyKey, KeyError, MAX_KEY_LEN, ShortKey};
pub use middleware::{DEFAULT_BUFFER_LIMIT, IdempotencyMiddleware};
pub use policy::{IDEM_IN_FLIGHT, IDEM_TAKEN_OVER, MAX_WAIT, RetryPolicy, STRIPE_KEY_IN_USE};
