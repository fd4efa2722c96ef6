//! # idem-core
//!
//! Make critical operations safe to retry. Payments, orders, webhooks, queue consumers and
//! cron jobs get retried by clients, gateways, brokers, schedulers and double clicks; idem
//! makes the effect happen once and gives every retry the first result back.
//!
//! ```
//! use idem_core::{Fingerprint, Idempotency, Key, MemoryStore, done};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let idem = Idempotency::new(MemoryStore::new());
//! let key = Key::new("acct_42/payments.create", "9b1c0e7a")?;
//! let fingerprint = Fingerprint::of_json(&serde_json::json!({"amount": 500}))?;
//! let outcome = idem
//!     .execute(&key, fingerprint, |ctx| async move {
//!         // Charge the card here; ctx.token() fences downstream writes.
//!         done(format!("charged with token {}", ctx.token()))
//!     })
//!     .await?;
//! assert!(!outcome.replayed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! ## Layout
//!
//! The root holds what an application uses; everything else lives in the module named for
//! its job.
//!
//! - [`machine`]: the pure state machine, the specification every store implements
//!   (the design behind it: `docs/DESIGN.md` in the repository); its unit tests in
//!   `machine/tests.rs`.
//! - [`store`]: the [`Store`] trait, one atomic operation per transition, its errors and
//!   the answers of each transition.
//! - [`record`]: the stored [`Record`], its [`Timestamp`]s, its lease.
//! - [`admin`]: the operator's side of a store ([`Admin`]: list, stats, release, delete).
//! - [`key`], [`fingerprint`]: what identifies a request and what makes two requests equal.
//! - [`clock`]: the clocks of stores that keep time in the process.
//! - [`raw`]: helpers for store authors only.
//! - [`connect`]: opening a store from a URL; each backend crate parses its own schemes.
//! - [`driver`] (feature `driver`, on by default): [`Idempotency`], which claims, runs the
//!   work, and stores or replays results; its policies, errors and metrics. What the work
//!   sees is in `driver/context/`: the context itself, its steps, its lease, its result.
//! - [`codec`] (feature `driver`): what every stored byte goes through (encryption at rest).
//! - [`MemoryStore`] (feature `memory`, on by default): the store for tests and examples,
//!   and the reference implementation of a store.
//!
//! Keys, fingerprints and stored responses are never logged whole: their `Debug` forms
//! print a short hash or a length.
//!
//! ## Features
//!
//! - `driver` (default): the driver, the codecs, [`Purger`] and the metrics. A backend
//!   crate turns it off to depend on the contract alone (no AES, UUID or metrics crates).
//! - `memory` (default): [`MemoryStore`].

#![warn(missing_docs)]

pub mod admin;
pub mod clock;
#[cfg(feature = "driver")]
pub mod codec;
pub mod connect;
mod derived_key;
#[cfg(feature = "driver")]
pub mod driver;
pub mod fingerprint;
pub mod key;
pub mod machine;
#[cfg(feature = "memory")]
mod memory;
#[cfg(feature = "driver")]
mod purger;
pub mod raw;
pub mod record;
pub mod store;

// What an application uses (30 names); the rest is in the modules above.
pub use admin::Admin;
pub use clock::{Clock, ManualClock, SystemClock};
#[cfg(feature = "driver")]
pub use codec::{Aes256GcmCodec, Codec};
#[cfg(feature = "driver")]
pub use driver::{
    Compensation, ConfigError, Context, Error, Heartbeat, Idempotency, IdempotencyBuilder,
    InFlightPolicy, KeyPolicy, Outcome, WorkError, WorkResult, WorkResultExt, done,
};
pub use fingerprint::Fingerprint;
pub use key::Key;
#[cfg(feature = "memory")]
pub use memory::MemoryStore;
#[cfg(feature = "driver")]
pub use purger::Purger;
pub use record::{Record, State, Timestamp};
pub use store::{BoxError, Store, StoreError};
