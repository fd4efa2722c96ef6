//! What a listing asks for and what it answers: queries, cursors, pages.

use std::fmt;
use std::time::Duration;

use crate::{Key, Record, State, StoreError, Timestamp};

/// The most records one page lists.
pub const MAX_PAGE: usize = 10_000;

/// Which records an operator lists, oldest first (by creation time, then scope and key).
///
/// ```
/// use idem_core::{admin::ListQuery, State};
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
    /// Only records in progress whose lease ended at least this long ago and still present:
    /// stuck work.
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

    /// Only in-progress records whose lease ended at least `for` ago and that are still
    /// present: stuck work a retry would take over. One past its retention is absent (a
    /// retry starts afresh, a purge deletes it), like the records
    /// [`Stats::in_progress_lease_ended`](crate::admin::Stats::in_progress_lease_ended)
    /// leaves out.
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
                record.state == State::InProgress
                    && record.lease_until.saturating_add(stuck) <= now
                    && !record.is_absent(now)
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
/// use idem_core::admin::Cursor;
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
    /// use idem_core::{admin::Cursor, Key};
    ///
    /// let key = Key::new("acct_42/charge", "order-7781")?;
    /// let cursor = Cursor::at(1_700_000_000_123_456, &key);
    /// assert_eq!(cursor.parts().unwrap(), (1_700_000_000_123_456, key));
    /// # Ok::<(), idem_core::key::KeyError>(())
    /// ```
    pub fn at(position: u64, key: &Key) -> Self {
        let plain = format!("{position}:{}", crate::raw::storage_name::key_name(key));
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
        let key = crate::raw::storage_name::parse_key_name(name).map_err(|_| bad())?;
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
