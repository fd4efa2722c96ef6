//! # idem-core
//!
//! Make critical operations safe to retry. Payments, orders, webhooks, queue consumers and
//! cron jobs get retried by clients, gateways, brokers, schedulers and double clicks; idem
//! makes the effect happen once and gives every retry the first result back.
//!
//! ```
//! use idem_core::{Fingerprint, Idempotency, Key, MemoryStore, WorkError};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let idem = Idempotency::new(MemoryStore::new());
//! let key = Key::new("acct_42/payments.create", "9b1c0e7a")?;
//! let fingerprint = Fingerprint::of_json(&serde_json::json!({"amount": 500}))?;
//! let outcome = idem
//!     .execute(&key, fingerprint, |ctx| async move {
//!         // Charge the card here; ctx.token() fences downstream writes.
//!         Ok::<_, WorkError<String>>(format!("charged with token {}", ctx.token()))
//!     })
//!     .await?;
//! assert!(!outcome.replayed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! ## Layout
//!
//! - [`machine`]: the pure state machine, the specification every store implements.
//! - [`Store`]: the trait backends implement, one atomic operation per transition.
//! - [`Admin`]: the operator's side of a store (list, stats, release, delete).
//! - [`Idempotency`]: the driver that claims, runs the work, and stores or replays results.
//! - [`Key`], [`Fingerprint`]: what identifies a request and what makes two requests equal.
//! - [`MemoryStore`] (feature `memory`, on by default): the store for tests and examples.
//!
//! Keys, fingerprints and stored responses are never logged whole: their `Debug` forms
//! print a short hash or a length.

#![warn(missing_docs)]

mod admin;
mod clock;
mod codec;
mod derived_key;
mod driver;
mod error;
mod fingerprint;
mod key;
mod limits;
pub mod machine;
#[cfg(feature = "memory")]
mod memory;
mod outcome;
mod purger;
mod record;
pub mod storage_name;
mod store;

pub use admin::{
    Admin, Cursor, ListQuery, Listed, MAX_PAGE, OperatorRelease, Page, RawRecord, Stats, raw_of,
    raw_text, select_page,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use codec::{
    Aes256GcmCodec, Codec, CodecError, KeyringError, PlainCodec, StoredAt, StoredPart,
};
pub use derived_key::derive_key;
pub use driver::{
    Compensation, Completion, ConfigError, Context, DEFAULT_LEASE, DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_SCOPES, DEFAULT_RETENTION, DEFAULT_STORE_TIMEOUT, Error, FailedUndo, Heartbeat,
    Idempotency, IdempotencyBuilder, InFlightPolicy, Interrupted, InterruptedKind, KeyBudget,
    KeyPolicy, KeyPolicyError, Outcome, Provider, SettingsWarning, TokenBucket, ValuePart,
    WorkError, WorkResult, WorkResultExt, done, observe,
};
pub use error::{BoxError, Operation, StoreError};
pub use fingerprint::{Fingerprint, FingerprintBuilder};
pub use key::{
    Key, KeyError, KeyPart, LogHashSecretError, MAX_PART_LEN, MIN_LOG_HASH_SECRET, ShortHash,
    StepName, set_log_hash_secret,
};
pub use limits::{MAX_DURATION, MAX_TOKEN, clamp_duration, duration_millis};
#[cfg(feature = "memory")]
pub use memory::MemoryStore;
pub use outcome::{ClaimOutcome, ClaimRequest, RenewOutcome, WriteOutcome};
pub use purger::Purger;
pub use record::{AttemptId, Lease, Record, RecordParts, State, Steps, Timestamp};
pub use storage_name::StorageNameError;
pub use store::{Expiry, Store};
