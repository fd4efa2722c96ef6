//! What a store holds, counted.

use std::collections::HashMap;
use std::time::Duration;

use crate::{Record, State, Timestamp};

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
