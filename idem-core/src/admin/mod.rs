//! The operator's side of a store: listing, stats, an operator's release, deletion.
//!
//! [`Admin`] is a second, optional trait beside [`Store`]: every store in this workspace
//! implements it, and the `idem` command (crate `idem-cli`) drives it. Nothing here breaks
//! the invariants of [`Store`]: an operator's release is a fenced takeover (the attempt
//! that held the key can no longer write), and a deleted record is simply absent.
//!
//! - this file: [`Admin`], [`ReleaseKeyOutcome`], [`RawRecord`].
//! - `query.rs`: [`ListQuery`], [`Cursor`], [`Page`], [`Listed`], [`MAX_PAGE`].
//! - `stats.rs`: [`Stats`].
//! - Helpers for store authors (`select_page`, `raw_text`, `raw_of`): [`crate::raw`].

mod query;
mod stats;

use async_trait::async_trait;

pub use query::{Cursor, ListQuery, Listed, MAX_PAGE, Page};
pub use stats::Stats;

use crate::{Key, State, Store, StoreError};

/// What an operator's release did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseKeyOutcome {
    /// The in-progress record was taken over on the operator's behalf: its token is now
    /// `token`, the attempt that held it is fenced, and the next claim takes over at once
    /// (resuming through its steps).
    Released {
        /// The record's token after the release.
        token: u64,
    },
    /// Refused: the record is finished (completed or failed). Delete it to run the work
    /// again.
    Finished(State),
    /// There is no record (or it is absent).
    NotFound,
}

/// The operator's side of a store.
///
/// **The contract.** Every method keeps the invariants of [`Store`]: a list or a stats
/// call changes nothing; a release is one atomic fenced takeover; a delete removes one
/// record, after which the key is absent. Run `idem-testkit`'s admin cases to check an
/// implementation.
#[async_trait]
pub trait Admin: Store {
    /// One page of records.
    ///
    /// - Oldest first: creation time (at the store's own precision, which may be finer
    ///   than `created_at`'s milliseconds), then scope, then key; the same order on every
    ///   listing, so the pages of a walk joined are one listing cut in pieces.
    /// - `query.after` resumes after a page's `next` cursor, and every matching record
    ///   appears on exactly one page of a walk through the cursors, even when records are
    ///   added meanwhile.
    /// - At most `query.page_size()` records; `next` is `Some` exactly when more matching
    ///   records follow the page (a page that ends the listing at its limit has none).
    /// - Filters by state, by stuck work (in progress, lease ended at least
    ///   `stuck_for` ago), and by scope prefix.
    /// - Absent records still stored are listed (`Page::now` tells which).
    /// - Response bytes only when `with_responses`; their length always.
    /// - Reaches only this store's namespace.
    /// - A cursor this store did not print: [`StoreError::InvalidCursor`].
    async fn list(&self, query: &ListQuery) -> Result<Page, StoreError>;

    /// Counts what the store holds, with the `top_scopes` largest scopes.
    ///
    /// - Only this store's namespace; changes nothing.
    async fn stats(&self, top_scopes: usize) -> Result<Stats, StoreError>;

    /// Releases `key` on an operator's behalf.
    ///
    /// - In progress (and present): token + 1, a new attempt id that no worker holds,
    ///   `lease_until = now`; steps kept. The attempt that held the key is fenced from then
    ///   on, and the next claim takes over at once.
    /// - In progress and present at [`MAX_TOKEN`](crate::raw::MAX_TOKEN): [`StoreError::Corrupt`]
    ///   naming the key, nothing changes (no next token could fence the owner;
    ///   [`machine::TokenAtLimit`](crate::machine::TokenAtLimit)).
    /// - Completed or failed: [`ReleaseKeyOutcome::Finished`], nothing changes.
    /// - No record, or an absent one: [`ReleaseKeyOutcome::NotFound`].
    /// - A record the store cannot read (written by something other than idem):
    ///   [`StoreError::Corrupt`] naming the key; nothing changes.
    async fn release_key(&self, key: &Key) -> Result<ReleaseKeyOutcome, StoreError>;

    /// Deletes the record of `key`, whatever its state. True when there was one.
    ///
    /// - The key is absent afterwards: the next claim starts a new lifetime, and any
    ///   attempt that held it is fenced.
    async fn delete(&self, key: &Key) -> Result<bool, StoreError>;

    /// The record of `key` as stored, field by field and undecoded, for an operator to
    /// read a record that does not decode (`idem inspect` shows it when `get` answers
    /// [`StoreError::Corrupt`]).
    ///
    /// - `None` when nothing is stored under the key.
    /// - Each field as the store's name for it and its value as text: text as it is,
    ///   other bytes in hex; a response only as its length.
    /// - Changes nothing; reaches only this store's namespace.
    async fn raw(&self, key: &Key) -> Result<Option<RawRecord>, StoreError>;
}

/// A record's fields as stored, undecoded: `(name, value as text)` pairs
/// ([`Admin::raw`]).
pub type RawRecord = Vec<(String, String)>;
