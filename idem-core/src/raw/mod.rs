//! For store authors: what implementing [`Store`](crate::Store) and
//! [`Admin`](crate::Admin) takes beyond the types, and what an application never needs.
//!
//! Writing a store of your own: read the memory store (`idem-core/src/memory.rs`), the
//! reference implementation, which applies [`crate::machine`] under a lock; then run
//! `idem-testkit`'s conformance suite against yours. The types a store deals in live in
//! [`crate::store`] (requests and answers) and [`crate::record`] (the record, its lease and
//! its decoder).
//!
//! - [`MAX_TOKEN`], [`MAX_DURATION`], [`clamp_duration`], [`duration_millis`]: the bounds
//!   every backend keeps (`limits.rs`).
//! - [`storage_name`]: the injective (namespace, scope, key) → name encoding of flat key
//!   spaces (Redis keys, DynamoDB partition keys).
//! - [`select_page`], [`PageSelector`], [`PagePlan`], [`Tally`]: [`Admin::list`](crate::Admin::list)
//!   and [`Admin::stats`](crate::Admin::stats) for stores that read every record, the
//!   latter two one record at a time in bounded memory (`page.rs`).
//! - [`raw_text`], [`raw_of`]: [`Admin::raw`](crate::Admin::raw)'s way of showing stored
//!   values (`text.rs`).

mod limits;
mod page;
pub mod storage_name;
mod text;

pub use limits::{MAX_DURATION, MAX_TOKEN, clamp_duration, duration_millis};
pub use page::{PagePlan, PageSelector, Tally, select_page};
pub use text::{raw_of, raw_text};
