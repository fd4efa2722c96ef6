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
//!
//! ## Opening from a URL
//!
//! [`BACKEND`] reads `sqlite:///path/to/idem.db` URLs for [`idem_core::connect`], so a
//! program that takes a store URL lists `&idem_sqlite::BACKEND` among its backends.
//! Opening never creates a missing file (that is [`Create::Yes`](idem_core::connect::Create),
//! for migrating), and the URL takes no table or prefix.
//!
//! ```
//! use idem_core::connect::{self, ConnectOptions};
//!
//! let location = connect::parse_url("sqlite:///var/lib/app/idem.db", &ConnectOptions::default(), &[&idem_sqlite::BACKEND])?;
//! assert_eq!(location.backend(), "SQLite");
//! # Ok::<(), connect::UrlError>(())
//! ```
//!
//! ## Where things live
//!
//! Every transition is `BEGIN IMMEDIATE`, a read, [`idem_core::machine`], a write, in
//! `src/store.rs` (`apply_locked`), with the SQL in `sql/`. A claim reads first in a
//! transaction that takes no lock and answers there when the machine writes nothing:
//!
//! | operation | files |
//! |---|---|
//! | claim, complete, fail, release, renew | `src/store.rs`; `sql/select_record.sql`, `sql/select_steps.sql`, `sql/upsert_record.sql`; rows in `src/rows.rs` |
//! | checkpoint | `src/store.rs`; `sql/insert_step.sql` |
//! | get | `src/store.rs`, `src/rows.rs`; `sql/select_record.sql`, `sql/select_steps.sql` |
//! | purge_expired | `src/store.rs`; `sql/select_purgeable.sql`, `sql/delete_record.sql`, `sql/delete_steps.sql` |
//! | list, stats, release_key, delete, raw | `src/admin.rs`; `sql/admin_*.sql`, `sql/delete_*.sql` |
//! | schema and its version | `src/schema.rs`; `sql/schema.sql` |
//! | opening from a URL | `src/url.rs`; errors: `src/errors.rs`; the connection: `src/connection.rs` |
//!
//! The rule each operation follows, and the testkit case that checks it:
//! `docs/DESIGN.md` §2 and §6.1 in the repository.

#![warn(missing_docs)]

mod admin;
mod connection;
mod errors;
mod rows;
mod schema;
mod store;
mod url;

pub use rusqlite;
pub use schema::SCHEMA_VERSION;
pub use store::{DEFAULT_BUSY_TIMEOUT, SqliteStore, SqliteStoreBuilder};
pub use url::{BACKEND, SqliteBackend, SqliteLocation, SqliteUrlError, URL_SCHEMES};
