//! # idem-postgres
//!
//! The PostgreSQL store for [idem](idem_core), over an sqlx [`PgPool`](sqlx::PgPool).
//!
//! ```no_run
//! use idem_core::{Fingerprint, Idempotency, Key, done};
//! use idem_postgres::PostgresStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::PgPool::connect("postgres://app@127.0.0.1/app").await?;
//! let store = PostgresStore::new(pool);
//! store.migrate().await?; // creates the table when missing; safe at every start
//! let idem = Idempotency::new(store);
//! let key = Key::new("acct_42/payments.create", "order-1187")?;
//! let outcome = idem
//!     .execute(&key, Fingerprint::of_bytes("amount=500"), |_ctx| async {
//!         done("charged".to_string())
//!     })
//!     .await?;
//! # let _ = outcome;
//! # Ok(())
//! # }
//! ```
//!
//! ## The table
//!
//! [`PostgresStore::migrate`] runs this DDL, with `{table}` the configured name, quoted
//! (`"idem_records"` by default, `"billing"."order"` for `billing.order`), and each index
//! named `"<table>-<what>"`. To manage the schema yourself, run the same statements in
//! your own migrations.
//!
//! ```sql
#![doc = include_str!("../sql/migrate.sql")]
//! ```
//!
//! ## Completing in your own transaction
//!
//! When the work's effect is rows in the same database, write them and mark the key
//! completed in one transaction with [`PostgresStore::complete_in`]: both commit or
//! neither does.
//!
//! ## Expiry
//!
//! Records stay until [`Store::purge_expired`](idem_core::Store::purge_expired) deletes
//! them (batches of 1 000, `SKIP LOCKED`, safe from many processes); run an
//! `idem_core::Purger` (idem-core's driver) beside the application. A record counts as absent only when it is
//! expired and no live lease holds it, and the purge deletes only those. A row that idem
//! did not write (an unknown state or a short fingerprint, from a hand edit) is never
//! absent: claims and reads answer [`StoreError::Corrupt`](idem_core::StoreError::Corrupt)
//! naming its key, and the purge leaves it for an operator to read and delete.
//!
//! ## Errors
//!
//! sqlx errors become [`StoreError`](idem_core::StoreError)s: connection loss, pool
//! timeouts, serialization failures and deadlocks are retryable; a missing table (run
//! `migrate()`), bad credentials and constraint violations are not.
//!
//! ## Operating
//!
//! [`PostgresStore`] implements [`idem_core::Admin`], which the `idem` command drives
//! (`idem --store postgres://... --table idem_records stats`). Listing pages by the index
//! on `(created_at, scope, key)` that `migrate()` creates, stuck work by the partial index
//! on in-progress leases; `stats` counts in one statement (a full scan of the table: cheap
//! at thousands of rows, seconds at tens of millions). The operator's release is one
//! `UPDATE` that the row lock orders against a worker's `complete`.
//!
//! ## Opening from a URL
//!
//! [`BACKEND`] reads `postgres://` and `postgresql://` URLs for [`idem_core::connect`],
//! with the table option (default `idem_records`, checked before connecting), so a
//! program that takes a store URL lists `&idem_postgres::BACKEND` among its backends.
//! Opening proves the server answers with one connection, then runs on a pool of two;
//! migrating runs [`PostgresStore::migrate`]. Messages show the URL without its password.
//!
//! ```
//! use idem_core::connect::{self, ConnectOptions};
//!
//! let options = ConnectOptions::default().table("billing.idem_records");
//! let location = connect::parse_url("postgres://app@db.internal/app", &options, &[&idem_postgres::BACKEND])?;
//! assert_eq!(location.backend(), "PostgreSQL");
//! # Ok::<(), connect::UrlError>(())
//! ```
//!
//! ## Where things live
//!
//! Every write is one statement, in `sql/`, rendered for the table in `src/queries.rs`. A
//! completion whose statement wrote nothing answers from one read after it: a record a
//! lease could not finish never becomes finishable by that lease again (a takeover or an
//! operator's release raises the token), so what the read finds is the answer. A claim
//! whose statement wrote nothing answers from the row it read with the state machine, and
//! runs the statement's second form (which may write over a row) when the machine says a
//! write was due.
//!
//! | operation | files |
//! |---|---|
//! | claim | `src/store.rs`; `sql/claim.sql`, its conflict clause `DO NOTHING` and then `sql/claim_update.sql` (falls back to `sql/select.sql`; `sql/end_lease.sql` when a record it took over cannot be read) |
//! | complete, fail (and `complete_in`) | `src/store.rs`; `sql/finish.sql`, then `sql/finished.sql` when it wrote nothing |
//! | release, renew, checkpoint | `src/store.rs`; `sql/release.sql`, `sql/renew.sql`, `sql/checkpoint.sql` |
//! | get | `src/store.rs`; `sql/select.sql`, rows in `src/rows.rs` |
//! | purge_expired | `src/store.rs`; `sql/purge.sql` |
//! | list, stats, release_key, delete, raw | `src/admin.rs`; `sql/admin_*.sql` |
//! | migrate | `src/store.rs`; `sql/create_schema.sql`, `sql/migrate.sql` |
//! | table names | `src/table.rs`; errors: `src/errors.rs`; URLs: `src/url.rs` |
//!
//! The rule each operation follows, and the testkit case that checks it:
//! `docs/DESIGN.md` §2 and §6.2 in the repository.

#![warn(missing_docs)]

mod admin;
mod errors;
mod queries;
mod rows;
mod store;
mod table;
mod url;

pub use crate::url::{BACKEND, PostgresBackend, PostgresLocation, PostgresUrlError, URL_SCHEMES};
pub use sqlx;
pub use store::{PostgresStore, PostgresStoreBuilder};
pub use table::{DEFAULT_TABLE, TableNameError};
