//! # idem-sqlite
//!
//! The embedded default store for [idem](idem_core): a SQLite file, zero setup, safe for
//! any number of threads and processes sharing it.
//!
//! ```
//! use idem_core::Idempotency;
//! use idem_sqlite::SqliteStore;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let idem = Idempotency::new(SqliteStore::open_in_memory()?);
//! # let _ = idem;
//! # Ok(())
//! # }
//! ```
//!
//! ## Schema
//!
//! Opening a database creates, when missing, the tables below (`sql/schema.sql`) and
//! records the schema version in `idem_schema`; a database from a newer idem is refused
//! rather than misread.
//!
//! ```sql
#![doc = include_str!("../sql/schema.sql")]
//! ```
//!
//! ## Completing in your own transaction
//!
//! When the work's effect is only rows in the same database, write them and mark the key
//! completed in one transaction with [`SqliteStore::complete_in`]: both commit or neither
//! does, so no crash can leave a debit without its idempotency record.
//!
//! ## Operating
//!
//! [`SqliteStore`] implements [`idem_core::Admin`], which the `idem` command drives
//! (`idem --store sqlite:///path/to/idem.db stats`). Listing walks the index on
//! `(created_at, scope, key)`; stuck work comes from the partial index on in-progress
//! leases; the release is one `BEGIN IMMEDIATE` transaction through the state machine.

#![warn(missing_docs)]

mod admin;
mod connection;
mod errors;
mod rows;
mod schema;
mod store;

pub use rusqlite;
pub use schema::SCHEMA_VERSION;
pub use store::{DEFAULT_BUSY_TIMEOUT, SqliteStore, SqliteStoreBuilder};
