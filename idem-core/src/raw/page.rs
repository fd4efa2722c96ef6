//! Listing and counting for stores that read every record to answer them.

use std::collections::{BinaryHeap, HashMap, HashSet};

use crate::admin::{Cursor, ListQuery, Listed, Page, Stats};
use crate::{Key, Record, State, StoreError, Timestamp};

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
    let mut selector = PageSelector::new(query, now)?;
    for record in records {
        selector.offer(record);
    }
    Ok(selector.finish())
}

/// One page of a listing chosen from records offered one at a time, in any order, holding
/// at most a page and one record: for stores that read every record in batches (a
/// `SCAN`), so that a listing of millions needs no more memory than its page.
///
/// Orders oldest first, then by scope and key, like [`select_page`].
///
/// ```
/// use idem_core::{admin::ListQuery, machine, raw::PageSelector, store::ClaimRequest};
/// use idem_core::{Fingerprint, Key, Timestamp};
/// use std::time::Duration;
///
/// let now = Timestamp::from_unix_millis(1_000);
/// let mut selector = PageSelector::new(&ListQuery::new().limit(1), now)?;
/// for (i, name) in ["b", "a"].into_iter().enumerate() {
///     let at = Timestamp::from_unix_millis(i as u64);
///     let request = ClaimRequest::new(Key::new("s", name)?, Fingerprint::of_bytes(name),
///         Duration::from_secs(10), Duration::from_secs(60));
///     let write = machine::claim(None, &request, at)?.write.expect("a new record");
///     selector.offer(write);
/// }
/// let page = selector.finish();
/// assert_eq!(page.records[0].record.key.key(), "b", "the oldest first");
/// assert!(page.next.is_some(), "one more record waits");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct PageSelector {
    query: ListQuery,
    now: Timestamp,
    after: Option<(Timestamp, Key)>,
    size: usize,
    /// The page and one more (whether there is a next page), youngest on top.
    kept: BinaryHeap<Ordered>,
    /// The keys in `kept`: a key offered twice is kept once.
    kept_keys: HashSet<Key>,
}

#[derive(Debug)]
struct Ordered(Record);

impl Ordered {
    fn position(&self) -> (Timestamp, &Key) {
        (self.0.created_at, &self.0.key)
    }
}

impl PartialEq for Ordered {
    fn eq(&self, other: &Self) -> bool {
        self.position() == other.position()
    }
}

impl Eq for Ordered {}

impl PartialOrd for Ordered {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ordered {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.position().cmp(&other.position())
    }
}

impl PageSelector {
    /// A selector for `query` at `now`.
    ///
    /// # Errors
    /// [`StoreError::InvalidCursor`] for a cursor made elsewhere.
    pub fn new(query: &ListQuery, now: Timestamp) -> Result<Self, StoreError> {
        let after = query.after.as_ref().map(Cursor::position).transpose()?;
        let size = query.page_size();
        Ok(Self {
            query: query.clone(),
            now,
            after,
            size,
            kept: BinaryHeap::with_capacity(size + 1),
            kept_keys: HashSet::with_capacity(size + 1),
        })
    }

    /// Whether a record at this position, with this state, lease and scope, could be on
    /// the page so far.
    fn wants(&self, record: &Record) -> bool {
        if !self.query.matches(record, self.now) {
            return false;
        }
        let position = (record.created_at, &record.key);
        if self
            .after
            .as_ref()
            .is_some_and(|(created, key)| position <= (*created, key))
        {
            return false;
        }
        self.kept.len() <= self.size
            || self
                .kept
                .peek()
                .is_some_and(|youngest| position < youngest.position())
    }

    /// Offers one record; it is kept if it belongs on the page so far. A key offered twice
    /// (a `SCAN` may return one twice) is kept once.
    pub fn offer(&mut self, record: Record) {
        if !self.wants(&record) || self.kept_keys.contains(&record.key) {
            return;
        }
        self.kept_keys.insert(record.key.clone());
        self.kept.push(Ordered(record));
        if self.kept.len() > self.size + 1
            && let Some(dropped) = self.kept.pop()
        {
            self.kept_keys.remove(&dropped.0.key);
        }
    }

    /// The page as chosen from records offered without their responses and steps: its
    /// keys to read whole, and its cursor, fixed now from what was offered. See
    /// [`PagePlan::page`].
    pub fn plan(self) -> PagePlan {
        let mut kept: Vec<Record> = self
            .kept
            .into_sorted_vec()
            .into_iter()
            .map(|kept| kept.0)
            .collect();
        let boundary = (kept.len() > self.size).then(|| {
            let last = &kept[self.size - 1];
            (last.created_at, last.key.clone())
        });
        kept.truncate(self.size);
        PagePlan {
            keys: kept.into_iter().map(|record| record.key).collect(),
            next: boundary
                .as_ref()
                .map(|(created, key)| Cursor::at(created.as_unix_millis(), key)),
            boundary,
            after: self.after,
            query: self.query,
            now: self.now,
        }
    }

    /// The page: at most the query's page size, and a cursor when more records matched.
    pub fn finish(self) -> Page {
        let with_responses = self.query.with_responses;
        let mut picked: Vec<Record> = self
            .kept
            .into_sorted_vec()
            .into_iter()
            .map(|kept| kept.0)
            .collect();
        let next = (picked.len() > self.size).then(|| Cursor::after_record(&picked[self.size - 1]));
        picked.truncate(self.size);
        let records = picked
            .into_iter()
            .map(|record| Listed::new(record, with_responses))
            .collect();
        Page::new(records, next, self.now)
    }
}

/// A page chosen from records read without their responses and steps ([`PageSelector::plan`]):
/// the keys to read whole, and the cursor, which stays what the selection found so that a
/// record that changed or went between the two reads never ends the listing early.
#[derive(Debug)]
pub struct PagePlan {
    keys: Vec<Key>,
    next: Option<Cursor>,
    /// The position of the page's last record when more followed.
    boundary: Option<(Timestamp, Key)>,
    after: Option<(Timestamp, Key)>,
    query: ListQuery,
    now: Timestamp,
}

impl PagePlan {
    /// The keys of the page, oldest first: read each one whole.
    pub fn keys(&self) -> &[Key] {
        &self.keys
    }

    /// The page from the records read whole. A record that went since the selection, no
    /// longer matches, or moved past the page's end (a new lifetime, created later) is
    /// left out; the cursor is the selection's, so the next page starts where this one
    /// was chosen to end.
    pub fn page(self, whole: impl IntoIterator<Item = Record>) -> Page {
        let mut records: Vec<Record> = whole
            .into_iter()
            .filter(|record| self.query.matches(record, self.now))
            .filter(|record| {
                let position = (record.created_at, &record.key);
                self.after
                    .as_ref()
                    .is_none_or(|(created, key)| position > (*created, key))
                    && self
                        .boundary
                        .as_ref()
                        .is_none_or(|(created, key)| position <= (*created, key))
            })
            .collect();
        records.sort_by(|a, b| (a.created_at, &a.key).cmp(&(b.created_at, &b.key)));
        let with_responses = self.query.with_responses;
        let records = records
            .into_iter()
            .map(|record| Listed::new(record, with_responses))
            .collect();
        Page::new(records, self.next, self.now)
    }
}

/// [`Stats`] counted from records offered one at a time: for stores that read every
/// record in batches to count them, holding only a count per scope.
///
/// ```
/// use idem_core::{machine, raw::Tally, store::ClaimRequest, Fingerprint, Key, Timestamp};
/// use std::time::Duration;
///
/// let now = Timestamp::from_unix_millis(1_000);
/// let request = ClaimRequest::new(Key::new("s", "k")?, Fingerprint::of_bytes("r"),
///     Duration::from_secs(10), Duration::from_secs(60));
/// let record = machine::claim(None, &request, now)?.write.expect("a new record");
/// let mut tally = Tally::new(now);
/// tally.add(&record);
/// let stats = tally.finish(5);
/// assert_eq!((stats.total, stats.in_progress_live), (1, 1));
/// assert_eq!(stats.top_scopes, vec![("s".to_string(), 1)]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Tally {
    stats: Stats,
    scopes: HashMap<String, u64>,
}

impl Tally {
    /// Nothing counted yet, at the store's time `now`.
    pub fn new(now: Timestamp) -> Self {
        Self {
            stats: Stats {
                now,
                ..Stats::default()
            },
            scopes: HashMap::new(),
        }
    }

    /// Counts one record. Only its key, state, lease end, creation time and expiry are
    /// read: a store may offer records decoded without their responses and steps.
    pub fn add(&mut self, record: &Record) {
        let now = self.stats.now;
        let stats = &mut self.stats;
        stats.total += 1;
        let absent = record.is_absent(now);
        match record.state {
            State::InProgress => {
                stats.in_progress += 1;
                if record.lease_is_live(now) {
                    stats.in_progress_live += 1;
                } else if !absent {
                    stats.in_progress_lease_ended += 1;
                }
                if !absent {
                    stats.oldest_in_progress = Some(
                        stats
                            .oldest_in_progress
                            .map_or(record.created_at, |oldest| oldest.min(record.created_at)),
                    );
                }
            }
            State::Completed => stats.completed += 1,
            State::Failed => stats.failed += 1,
        }
        if absent {
            stats.absent += 1;
        }
        match self.scopes.get_mut(record.key.scope()) {
            Some(count) => *count += 1,
            None => {
                self.scopes.insert(record.key.scope().to_owned(), 1);
            }
        }
    }

    /// The stats, with the `top` largest scopes, most first (ties by name).
    pub fn finish(self, top: usize) -> Stats {
        let mut stats = self.stats;
        let mut scopes: Vec<(String, u64)> = self.scopes.into_iter().collect();
        scopes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        scopes.truncate(top);
        stats.top_scopes = scopes;
        stats
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::{Fingerprint, machine, store::ClaimRequest};

    fn record(scope: &str, key: &str, created: u64, lease: u64, finished: bool) -> Record {
        let request = ClaimRequest::new(
            Key::new(scope, key).expect("a valid key"),
            Fingerprint::of_bytes(key),
            Duration::from_millis(lease),
            Duration::from_millis(50),
        );
        let at = Timestamp::from_unix_millis(created);
        let mut record = machine::claim(None, &request, at)
            .expect("a first claim is never refused")
            .write
            .expect("a new record");
        if finished {
            record.state = State::Completed;
            record.response = Some(key.as_bytes().to_vec());
        }
        record
    }

    /// What a page must be: every match after the cursor, sorted, cut to the page.
    fn expected(records: &[Record], query: &ListQuery, now: Timestamp) -> (Vec<Key>, bool) {
        let after = query
            .after
            .as_ref()
            .map(|c| c.position().expect("our cursor"));
        let mut picked: Vec<&Record> = records
            .iter()
            .filter(|r| query.matches(r, now))
            .filter(|r| {
                after
                    .as_ref()
                    .is_none_or(|(created, key)| (r.created_at, &r.key) > (*created, key))
            })
            .collect();
        picked.sort_by(|a, b| (a.created_at, &a.key).cmp(&(b.created_at, &b.key)));
        let more = picked.len() > query.page_size();
        picked.truncate(query.page_size());
        (picked.into_iter().map(|r| r.key.clone()).collect(), more)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Offered in any order, the selector keeps exactly the page a full sort would.
        #[test]
        fn the_page_is_the_sorted_prefix(
            seeds in proptest::collection::vec((0..3u8, 0..40u16, 0..20u64, 0..30u64, any::<bool>()), 0..60),
            limit in 1..8usize,
            prefix in proptest::option::of(0..3u8),
            completed_only in any::<bool>(),
            cursor_at in proptest::option::of(0..60usize),
        ) {
            let mut records: Vec<Record> = Vec::new();
            for (scope, key, created, lease, finished) in seeds {
                let scope = format!("s{scope}");
                let key = format!("k{key}");
                if records.iter().any(|r| r.key.scope() == scope && r.key.key() == key) {
                    continue;
                }
                records.push(record(&scope, &key, created, lease, finished));
            }
            let now = Timestamp::from_unix_millis(25);
            let mut query = ListQuery::new().limit(limit);
            if let Some(prefix) = prefix {
                query = query.scope_prefix(format!("s{prefix}"));
            }
            if completed_only {
                query = query.state(State::Completed);
            }
            if let Some(at) = cursor_at.filter(|at| *at < records.len()) {
                query = query.after(Cursor::after_record(&records[at]));
            }
            let (keys, more) = expected(&records, &query, now);
            let mut selector = PageSelector::new(&query, now).unwrap();
            for record in records.iter().rev().cloned() {
                selector.offer(record);
            }
            let page = selector.finish();
            let got: Vec<Key> = page.records.iter().map(|l| l.record.key.clone()).collect();
            prop_assert_eq!(&got, &keys);
            prop_assert_eq!(page.next.is_some(), more);
            if more {
                let last = page.records.last().unwrap();
                prop_assert_eq!(page.next, Some(Cursor::after_record(&last.record)));
            }
        }

        /// A page planned from summaries keeps its cursor when records go or change before
        /// they are read whole: the listing never ends early and never skips a record.
        #[test]
        fn a_plan_keeps_its_cursor_whatever_the_second_read_finds(
            seeds in proptest::collection::vec((0..40u16, 0..20u64), 1..40),
            limit in 1..6usize,
            gone in proptest::collection::vec(any::<bool>(), 40),
        ) {
            let mut records: Vec<Record> = Vec::new();
            for (key, created) in seeds {
                let key = format!("k{key}");
                if !records.iter().any(|r| r.key.key() == key) {
                    records.push(record("s", &key, created, 100, true));
                }
            }
            let now = Timestamp::from_unix_millis(25);
            let query = ListQuery::new().limit(limit);
            let whole = select_page(records.clone(), &query, now).unwrap();
            let mut selector = PageSelector::new(&query, now).unwrap();
            for record in records.iter().cloned() {
                selector.offer(record);
            }
            let plan = selector.plan();
            let planned: Vec<Key> = plan.keys().to_vec();
            let expected: Vec<Key> = whole.records.iter().map(|l| l.record.key.clone()).collect();
            prop_assert_eq!(&planned, &expected);
            // Some records went before the second read.
            let reread: Vec<Record> = records
                .iter()
                .filter(|r| planned.contains(&r.key))
                .enumerate()
                .filter(|(i, _)| !gone[*i])
                .map(|(_, r)| r.clone())
                .collect();
            let page = plan.page(reread.clone());
            prop_assert_eq!(page.next.clone(), whole.next.clone(), "the cursor is the selection's");
            let got: Vec<Key> = page.records.iter().map(|l| l.record.key.clone()).collect();
            let kept: Vec<Key> = expected.into_iter().filter(|k| reread.iter().any(|r| &r.key == k)).collect();
            prop_assert_eq!(got, kept);
        }

        /// Counted one at a time, the tally is the sum of what each record is.
        #[test]
        fn the_tally_adds_up(
            seeds in proptest::collection::vec((0..3u8, 0..40u16, 0..40u64, 0..60u64, any::<bool>()), 0..60),
        ) {
            let now = Timestamp::from_unix_millis(45);
            let mut tally = Tally::new(now);
            let records: Vec<Record> = seeds
                .into_iter()
                .map(|(scope, key, created, lease, finished)| {
                    record(&format!("s{scope}"), &format!("k{key}"), created, lease, finished)
                })
                .collect();
            for record in &records {
                tally.add(record);
            }
            let stats = tally.finish(10);
            let in_progress: Vec<&Record> =
                records.iter().filter(|r| r.state == State::InProgress).collect();
            prop_assert_eq!(stats.total, records.len() as u64);
            prop_assert_eq!(stats.in_progress, in_progress.len() as u64);
            prop_assert_eq!(
                stats.in_progress,
                stats.in_progress_live
                    + stats.in_progress_lease_ended
                    + in_progress.iter().filter(|r| r.is_absent(now)).count() as u64,
                "every in-progress record in exactly one group"
            );
            prop_assert_eq!(
                stats.in_progress_lease_ended,
                in_progress.iter().filter(|r| !r.lease_is_live(now) && !r.is_absent(now)).count() as u64
            );
            prop_assert_eq!(
                stats.oldest_in_progress,
                in_progress.iter().filter(|r| !r.is_absent(now)).map(|r| r.created_at).min()
            );
            prop_assert_eq!(
                stats.absent,
                records.iter().filter(|r| r.is_absent(now)).count() as u64
            );
            prop_assert_eq!(
                stats.top_scopes.iter().map(|(_, n)| n).sum::<u64>(),
                records.len() as u64,
                "three scopes, all shown"
            );
        }
    }
}
