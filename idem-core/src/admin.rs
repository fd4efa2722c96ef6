//! The operator's side of a store: listing, stats, an operator's release, deletion.
//!
//! [`Admin`] is a second, optional trait beside [`Store`]: every store in this workspace
//! implements it, and the `idem` command (crate `idem-cli`) drives it. Nothing here breaks
//! the invariants of [`Store`]: an operator's release is a fenced takeover (the attempt
//! that held the key can no longer write), and a deleted record is simply absent.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::{Key, Record, State, Store, StoreError, Timestamp};

/// The most records one page lists.
pub const MAX_PAGE: usize = 10_000;

/// Which records an operator lists, oldest first (by creation time, then scope and key).
///
/// ```
/// use idem_core::{ListQuery, State};
/// use std::time::Duration;
///
/// // In-progress records of one tenant whose lease ended five minutes ago or more.
/// let query = ListQuery::new()
///     .stuck_for(Duration::from_secs(300))
///     .scope_prefix("acct_42/")
///     .limit(50);
/// assert_eq!(query.limit, 50);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListQuery {
    /// Only records in this state.
    pub state: Option<State>,
    /// Only records in progress whose lease ended at least this long ago: stuck work.
    pub stuck_for: Option<Duration>,
    /// Only records whose scope begins with this.
    pub scope_prefix: Option<String>,
    /// Where the previous page left off.
    pub after: Option<Cursor>,
    /// The most records on the page (default 100, at most [`MAX_PAGE`]).
    pub limit: usize,
    /// Whether to return the response bytes (default: only their length).
    pub with_responses: bool,
}

impl Default for ListQuery {
    fn default() -> Self {
        Self {
            state: None,
            stuck_for: None,
            scope_prefix: None,
            after: None,
            limit: 100,
            with_responses: false,
        }
    }
}

impl ListQuery {
    /// Every record, 100 at a time, without response bodies.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only records in `state`.
    #[must_use]
    pub fn state(mut self, state: State) -> Self {
        self.state = Some(state);
        self
    }

    /// Only in-progress records whose lease ended at least `for` ago.
    #[must_use]
    pub fn stuck_for(mut self, duration: Duration) -> Self {
        self.stuck_for = Some(duration);
        self
    }

    /// Only records whose scope begins with `prefix`.
    #[must_use]
    pub fn scope_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.scope_prefix = Some(prefix.into());
        self
    }

    /// The page after `cursor`.
    #[must_use]
    pub fn after(mut self, cursor: Cursor) -> Self {
        self.after = Some(cursor);
        self
    }

    /// At most `limit` records (clamped to 1..=[`MAX_PAGE`]).
    #[must_use]
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Return response bytes too.
    #[must_use]
    pub fn with_responses(mut self, with: bool) -> Self {
        self.with_responses = with;
        self
    }

    /// The page size in force: `limit` within 1..=[`MAX_PAGE`].
    pub fn page_size(&self) -> usize {
        self.limit.clamp(1, MAX_PAGE)
    }

    /// Whether `record` passes the filters (not the cursor) at `now`.
    pub fn matches(&self, record: &Record, now: Timestamp) -> bool {
        self.state.is_none_or(|state| record.state == state)
            && self.stuck_for.is_none_or(|stuck| {
                record.state == State::InProgress && record.lease_until.saturating_add(stuck) <= now
            })
            && self
                .scope_prefix
                .as_deref()
                .is_none_or(|prefix| record.key.scope().starts_with(prefix))
    }
}

/// Where a listing left off: opaque to callers, printable, and parsed back by the store
/// that made it.
///
/// ```
/// use idem_core::Cursor;
///
/// let cursor: Cursor = "3a-abc".parse().unwrap();
/// assert_eq!(cursor.to_string(), "3a-abc");
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Cursor(String);

impl Cursor {
    /// A cursor with the store's own encoding.
    pub fn new(encoded: impl Into<String>) -> Self {
        Self(encoded.into())
    }

    /// The store's encoding.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The cursor after `record` for stores that order by millisecond creation time:
    /// [`Cursor::at`] with the creation time in milliseconds.
    pub fn after_record(record: &Record) -> Self {
        Self::at(record.created_at.as_unix_millis(), &record.key)
    }

    /// Reads a cursor made by [`Cursor::after_record`]: the creation time and the key.
    ///
    /// # Errors
    /// [`StoreError::InvalidCursor`] for a cursor this encoding did not make.
    pub fn position(&self) -> Result<(Timestamp, Key), StoreError> {
        let (millis, key) = self.parts()?;
        Ok((Timestamp::from_unix_millis(millis), key))
    }

    /// A cursor at `position` (a store's ordering value, such as a creation time in its
    /// column's precision), then `key`: `<position>:<scope len>:<scope>:<key>`,
    /// hex-encoded so it prints safely.
    ///
    /// ```
    /// use idem_core::{Cursor, Key};
    ///
    /// let key = Key::new("acct_42/charge", "order-7781")?;
    /// let cursor = Cursor::at(1_700_000_000_123_456, &key);
    /// assert_eq!(cursor.parts().unwrap(), (1_700_000_000_123_456, key));
    /// # Ok::<(), idem_core::KeyError>(())
    /// ```
    pub fn at(position: u64, key: &Key) -> Self {
        let plain = format!("{position}:{}", crate::storage_name::key_name(key));
        Self(plain.bytes().map(|b| format!("{b:02x}")).collect())
    }

    /// Reads a cursor made by [`Cursor::at`].
    ///
    /// # Errors
    /// [`StoreError::InvalidCursor`] for a cursor this encoding did not make.
    pub fn parts(&self) -> Result<(u64, Key), StoreError> {
        let bad = || StoreError::InvalidCursor;
        let bytes = (0..self.0.len())
            .step_by(2)
            .map(|i| {
                self.0
                    .get(i..i + 2)
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(bad)?;
        let plain = String::from_utf8(bytes).map_err(|_| bad())?;
        let (position, name) = plain.split_once(':').ok_or_else(bad)?;
        let position = position.parse().map_err(|_| bad())?;
        let key = crate::storage_name::parse_key_name(name).map_err(|_| bad())?;
        Ok((position, key))
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Cursor {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Self(text.to_owned()))
    }
}

/// One listed record: the response left out unless asked for, its length kept.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Listed {
    /// The record (`response` is `None` unless the query asked for responses).
    pub record: Record,
    /// The stored response's length in bytes, when there is one.
    pub response_len: Option<usize>,
}

impl Listed {
    /// `record`, its response kept only when `with_response`.
    pub fn new(mut record: Record, with_response: bool) -> Self {
        let response_len = record.response.as_ref().map(Vec::len);
        if !with_response {
            record.response = None;
        }
        Self {
            record,
            response_len,
        }
    }
}

/// One page of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Page {
    /// The records, oldest first.
    pub records: Vec<Listed>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<Cursor>,
    /// The store's clock when it answered (to tell live leases and absent records).
    pub now: Timestamp,
}

impl Page {
    /// A page.
    pub fn new(records: Vec<Listed>, next: Option<Cursor>, now: Timestamp) -> Self {
        Self { records, next, now }
    }
}

/// What a store holds, counted at `now`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Every stored record, absent ones included.
    pub total: u64,
    /// In progress.
    pub in_progress: u64,
    /// Completed.
    pub completed: u64,
    /// Failed.
    pub failed: u64,
    /// In progress with a live lease.
    pub in_progress_live: u64,
    /// In progress with a lease that has ended: abandoned until a retry takes over.
    pub in_progress_lease_ended: u64,
    /// Absent (expired, no live lease) and not yet deleted: what a purge would delete.
    pub absent: u64,
    /// When the oldest in-progress record was created.
    pub oldest_in_progress: Option<Timestamp>,
    /// The scopes holding the most records, most first, with their counts.
    pub top_scopes: Vec<(String, u64)>,
    /// The store's clock when it counted.
    pub now: Timestamp,
}

impl Stats {
    /// How long the oldest in-progress record has been in progress.
    pub fn oldest_in_progress_age(&self) -> Option<Duration> {
        self.oldest_in_progress
            .map(|created| self.now.saturating_duration_since(created))
    }

    /// Counts `records` at `now`, keeping the `top` largest scopes: for stores that read
    /// every record to count them.
    pub fn tally<'r>(
        records: impl IntoIterator<Item = &'r Record>,
        now: Timestamp,
        top: usize,
    ) -> Self {
        let mut stats = Stats {
            now,
            ..Stats::default()
        };
        let mut scopes: HashMap<&str, u64> = HashMap::new();
        for record in records {
            stats.total += 1;
            match record.state {
                State::InProgress => {
                    stats.in_progress += 1;
                    if record.lease_is_live(now) {
                        stats.in_progress_live += 1;
                    } else {
                        stats.in_progress_lease_ended += 1;
                    }
                    stats.oldest_in_progress = Some(
                        stats
                            .oldest_in_progress
                            .map_or(record.created_at, |oldest| oldest.min(record.created_at)),
                    );
                }
                State::Completed => stats.completed += 1,
                State::Failed => stats.failed += 1,
            }
            if record.is_absent(now) {
                stats.absent += 1;
            }
            *scopes.entry(record.key.scope()).or_default() += 1;
        }
        let mut scopes: Vec<(String, u64)> = scopes
            .into_iter()
            .map(|(scope, count)| (scope.to_owned(), count))
            .collect();
        scopes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        scopes.truncate(top);
        stats.top_scopes = scopes;
        stats
    }
}

/// Selects one page from `records` (in any order) for `query` at `now`: for stores that
/// read every record to list them. Orders oldest first, then by scope and key.
///
/// # Errors
/// [`StoreError::InvalidCursor`] for a cursor made elsewhere.
pub fn select_page(
    records: impl IntoIterator<Item = Record>,
    query: &ListQuery,
    now: Timestamp,
) -> Result<Page, StoreError> {
    let after = query.after.as_ref().map(Cursor::position).transpose()?;
    let mut picked: Vec<Record> = records
        .into_iter()
        .filter(|record| query.matches(record, now))
        .filter(|record| {
            after
                .as_ref()
                .is_none_or(|(created, key)| (record.created_at, &record.key) > (*created, key))
        })
        .collect();
    picked.sort_by(|a, b| (a.created_at, &a.key).cmp(&(b.created_at, &b.key)));
    let size = query.page_size();
    let next = (picked.len() > size).then(|| Cursor::after_record(&picked[size - 1]));
    picked.truncate(size);
    let records = picked
        .into_iter()
        .map(|record| Listed::new(record, query.with_responses))
        .collect();
    Ok(Page::new(records, next, now))
}

/// What an operator's release did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OperatorRelease {
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
    /// - Oldest first (creation time, then scope, then key); `query.after` resumes after
    ///   a page's `next` cursor, and every matching record appears on exactly one page of
    ///   a walk through the cursors, even when records are added meanwhile.
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
    /// - Completed or failed: [`OperatorRelease::Finished`], nothing changes.
    /// - No record, or an absent one: [`OperatorRelease::NotFound`].
    async fn release_key(&self, key: &Key) -> Result<OperatorRelease, StoreError>;

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

/// `bytes` as text when they are printable UTF-8, else as `0x` and hex: how
/// [`Admin::raw`] shows a stored value.
///
/// ```
/// assert_eq!(idem_core::raw_text(b"in_progress"), "in_progress");
/// assert_eq!(idem_core::raw_text(&[0, 255]), "0x00ff");
/// ```
pub fn raw_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_owned(),
        _ => {
            let mut out = String::with_capacity(2 + bytes.len() * 2);
            out.push_str("0x");
            for byte in bytes {
                out.push_str(&format!("{byte:02x}"));
            }
            out
        }
    }
}

/// A decoded record's fields in [`Admin::raw`]'s form, for stores that hold records
/// decoded (the memory store) and for tests.
pub fn raw_of(record: &crate::Record) -> RawRecord {
    let mut fields = vec![
        (
            "fingerprint".to_owned(),
            raw_text(record.fingerprint.as_bytes()),
        ),
        ("state".to_owned(), record.state.as_str().to_owned()),
        ("token".to_owned(), record.token.to_string()),
        ("attempt".to_owned(), raw_text(record.attempt.as_bytes())),
        (
            "lease_until".to_owned(),
            record.lease_until.as_unix_millis().to_string(),
        ),
        (
            "created_at".to_owned(),
            record.created_at.as_unix_millis().to_string(),
        ),
        (
            "expires_at".to_owned(),
            record.expires_at.as_unix_millis().to_string(),
        ),
    ];
    if let Some(response) = &record.response {
        fields.push(("response".to_owned(), format!("{} bytes", response.len())));
    }
    for (name, value) in &record.steps {
        fields.push((format!("step {name}"), format!("{} bytes", value.len())));
    }
    fields
}
