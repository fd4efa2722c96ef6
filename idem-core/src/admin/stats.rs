//! What a store holds, counted.

use std::time::Duration;

use crate::{Record, Timestamp};

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
    /// In progress with a lease that has ended, and still present (within its retention):
    /// abandoned until a retry takes over. An in-progress record past its retention is
    /// counted in [`absent`](Self::absent) instead: a retry would start afresh, and a
    /// purge deletes it.
    pub in_progress_lease_ended: u64,
    /// Absent (expired, no live lease) and not yet deleted: what a purge would delete.
    pub absent: u64,
    /// When the oldest present in-progress record was created (absent ones are left out:
    /// they hold no work back).
    pub oldest_in_progress: Option<Timestamp>,
    /// Keys of the store's layout that could not be read as records, skipped: only stores
    /// that read every record to count them find these (the others count in their
    /// database), and log a warning naming each by its key's short hash.
    pub unreadable: u64,
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
    /// every record to count them ([`crate::raw::Tally`] counts them one at a time).
    pub fn tally<'r>(
        records: impl IntoIterator<Item = &'r Record>,
        now: Timestamp,
        top: usize,
    ) -> Self {
        let mut tally = crate::raw::Tally::new(now);
        for record in records {
            tally.add(record);
        }
        tally.finish(top)
    }
}
