//! # idem-redis
//!
//! The Redis store for [idem](idem_core): standalone Redis through a
//! [`ConnectionManager`](redis::aio::ConnectionManager), or Redis Cluster, behind one
//! type, [`RedisStore`]. Every transition is one Lua function that runs atomically on the
//! server, reads the server's clock, and touches one key: a function of idem's Redis
//! Functions library (`FCALL`, Redis 7 and later), or the same code as a script
//! (`EVALSHA`) on a server without Functions.
//!
//! ```no_run
//! use idem_core::{Fingerprint, Idempotency, Key, done};
//! use idem_redis::RedisStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let idem = Idempotency::new(RedisStore::standalone("redis://127.0.0.1:6379").await?);
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
//! ## Configuring Redis for these guarantees
//!
//! idem's promise (the work runs once, every retry gets the first result) holds only as
//! long as Redis keeps what it acknowledged. Configure the server accordingly:
//!
//! - **Persistence.** Turn on the append-only file. With `appendonly yes` and
//!   `appendfsync everysec`, a crash of the Redis machine (not just the process) can lose
//!   about the last second of acknowledged writes: a claim or a completed result written
//!   in that second disappears, so a retry may run the work again. With
//!   `appendfsync always`, every write is on disk before it is acknowledged and a crash
//!   loses nothing, at the cost of a disk sync per write. Without persistence (or with RDB
//!   snapshots only), a restart loses every record.
//! - **No eviction.** Set `maxmemory-policy noeviction`. Any evicting policy may delete a
//!   record early, turning a replay into a second execution; with `noeviction` a full
//!   Redis refuses new claims instead (an error, so the work does not run). That `OOM`
//!   reply, like `BUSY`, `NOREPLICAS` and `MISCONF`, is a retryable
//!   [`StoreError::Unavailable`](idem_core::StoreError::Unavailable): a completion refused
//!   for a moment keeps trying while its lease lasts.
//! - **Failover.** Replication is asynchronous. When a primary fails and a replica is
//!   promoted, writes the replica had not yet received are lost, with the same effect as
//!   a lost second above. Where that matters, put downstream effects behind their own
//!   idempotency (`Context::derive` in idem-core's driver) or use a store with
//!   synchronous durability (PostgreSQL).
//! - **Memory.** Each record costs its response plus about 200 bytes; retention bounds how
//!   many records live at once.
//! - **Functions.** The store loads its library (`FUNCTION LOAD REPLACE`, a few kilobytes)
//!   the first time a server answers that it lacks it (a new server, a restart without
//!   persistence, a node added to a cluster) and calls again; Redis persists and
//!   replicates libraries like data, so a promoted replica has it. The library is named
//!   `idem_<hash of its code>`, so versions of idem that differ run side by side during a
//!   deploy; each version leaves one library behind, which `FUNCTION DELETE` removes. A
//!   server without `FCALL` (before 7.0), or whose ACL refuses `FCALL` or `FUNCTION LOAD`
//!   to this client, gets the same code as scripts (`EVALSHA`, loaded after `NOSCRIPT`),
//!   and functions are tried again a minute later. A full server refuses a whole function
//!   that may write, and `FUNCTION LOAD`, even for a call that only reads: such a call is
//!   sent as a script, which is refused only at its first write, so replays and reads
//!   still answer on a full Redis.
//!
//! ## Layout
//!
//! Record `(scope, key)` is the hash `<prefix>{<scope length>:<scope>:<key>}`: fields
//! `f` fingerprint, `s` state, `t` token, `a` attempt, `l` lease end, `c` created,
//! `e` expires (milliseconds), `r` response, and `step:<name>` per checkpoint (records
//! written by earlier versions may also hold `z`, a takeover flag nothing reads). The
//! prefix may not hold `{`, so the first `{` ends it: two prefixes never share a key, even
//! when one is a prefix of the other. A record's key lives until the record expires or,
//! while it is in progress, until its lease ends if that is later; Redis deletes it then,
//! so `purge_expired` returns 0, and a key claimed again after its record vanished starts
//! a new lifetime at token 1.
//!
//! ## Operating
//!
//! [`RedisStore`] implements [`idem_core::Admin`], which the `idem` command drives
//! (`idem --store redis+cluster://10.0.0.1:7001,10.0.0.2:7001 stats`). Listing and counting
//! `SCAN` the prefix on every primary of a Cluster and read each record's small fields,
//! a pipeline per `SCAN` batch, in bounded memory: their time grows with the number of
//! records (BENCHMARKS.md has it at a million and ten million), so for a dashboard watch
//! the metrics instead. A key that is not a readable record is skipped, counted in
//! `Stats::unreadable` and named by its short hash in a warning. The release is one Lua
//! script.
//!
//! ## Opening from a URL
//!
//! [`BACKEND`] reads `redis://`, `rediss://` and `redis+cluster://host:port,host:port`
//! URLs for [`idem_core::connect`], with the prefix option (default `idem:`, checked
//! before connecting), so a program that takes a store URL lists `&idem_redis::BACKEND`
//! among its backends. Opening connects within the connect timeout; migrating only
//! connects, since Redis has no schema. Messages show URLs without their passwords.
//!
//! ```
//! use idem_core::connect::{self, ConnectOptions};
//!
//! let options = ConnectOptions::default().prefix("billing:");
//! let location = connect::parse_url("redis+cluster://10.0.0.1:7001,10.0.0.2:7001", &options, &[&idem_redis::BACKEND])?;
//! assert_eq!(location.backend(), "Redis Cluster");
//! # Ok::<(), connect::UrlError>(())
//! ```
//!
//! ## Where things live
//!
//! Every transition is one Lua file in `lua/` (with the helpers of `lua/common.lua`),
//! made into the library's functions and into scripts by `src/scripts.rs`:
//!
//! | operation | files |
//! |---|---|
//! | claim | `src/store.rs`; `lua/claim_replay.lua`, then `lua/claim.lua` |
//! | complete, fail | `src/store.rs`; `lua/complete.lua`, `lua/fail.lua` |
//! | release, renew, checkpoint, get | `src/store.rs`; `lua/release.lua`, `lua/renew.lua`, `lua/checkpoint.lua`, `lua/get.lua` |
//! | purge_expired | none: `PEXPIREAT` deletes absent records |
//! | list, stats, release_key, delete, raw | `src/admin.rs`; `lua/admin_release.lua` |
//! | key names and prefixes | `src/layout.rs`; errors: `src/errors.rs`; URLs: `src/url.rs` |
//!
//! The rule each operation follows, and the testkit case that checks it:
//! `docs/DESIGN.md` §2 and §6.3 in the repository.

#![warn(missing_docs)]

mod admin;
mod errors;
mod layout;
mod scripts;
mod store;
mod url;

pub use crate::url::{BACKEND, RedisBackend, RedisLocation, RedisUrlError, URL_SCHEMES};
pub use layout::{DEFAULT_PREFIX, PrefixError};
pub use redis;
pub use store::RedisStore;
