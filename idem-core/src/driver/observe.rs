//! Metric names and the events that move them, through the `metrics` facade.
//!
//! Install any `metrics` recorder (Prometheus, StatsD ...) to collect them; without one
//! they cost nothing. No metric carries a key, fingerprint or response.
//!
//! | name | kind | moves when |
//! |---|---|---|
//! | `idem_claims_total` | counter | a claim won: the work is about to run (takeovers included) |
//! | `idem_takeovers_total` | counter | a claim took over an expired lease of another attempt |
//! | `idem_replays_total` | counter | a stored result or failure was replayed |
//! | `idem_in_flight_rejections_total` | counter | `execute` answered `InFlight` |
//! | `idem_waits_total` | counter | an `execute` under `InFlightPolicy::Wait` waited for another attempt |
//! | `idem_mismatches_total` | counter | a key was reused with another fingerprint |
//! | `idem_fenced_writes_total` | counter | a write (complete, fail, renew, checkpoint) was fenced |
//! | `idem_lease_losses_total` | counter | an execution learned that another attempt took its key over |
//! | `idem_store_errors_total` | counter | a store call failed; label `operation` |
//! | `idem_work_duration_seconds` | histogram | the work finished, whatever its outcome |
//! | `idem_purged_total` | counter | a [`Purger`](crate::Purger) deleted absent records |
//! | `idem_new_keys_total` | counter | a claim created a record (a new key, or a new lifetime of one); label `scope` only with [`IdempotencyBuilder::scope_label`](crate::IdempotencyBuilder::scope_label) |
//! | `idem_key_budget_rejections_total` | counter | a new key was refused by the [`KeyBudget`](crate::driver::KeyBudget); label as above |
//!
//! Histograms are durations in seconds. A recorder that exports histograms as buckets (as
//! Prometheus' histogram type, which can be aggregated across replicas, unlike
//! quantiles) can use [`SECONDS_BUCKETS`]:
//!
//! ```
//! // 1 ms to 10 min: a replay's store round trip to the longest lease worth holding.
//! assert_eq!(idem_core::driver::observe::SECONDS_BUCKETS.first(), Some(&0.001));
//! assert_eq!(idem_core::driver::observe::SECONDS_BUCKETS.last(), Some(&600.0));
//! ```
//!
//! Scopes often hold account ids: a raw scope as a label would leak them and give every
//! account a time series. The `scope` label appears only when the application supplies a
//! function mapping a scope to a label of its choosing (the operation, a tier).

use std::time::Duration;

use crate::store::Operation;

/// `idem_claims_total`
pub const CLAIMS: &str = "idem_claims_total";
/// `idem_takeovers_total`
pub const TAKEOVERS: &str = "idem_takeovers_total";
/// `idem_replays_total`
pub const REPLAYS: &str = "idem_replays_total";
/// `idem_in_flight_rejections_total`
pub const IN_FLIGHT_REJECTIONS: &str = "idem_in_flight_rejections_total";
/// `idem_waits_total`
pub const WAITS: &str = "idem_waits_total";
/// `idem_mismatches_total`
pub const MISMATCHES: &str = "idem_mismatches_total";
/// `idem_fenced_writes_total`
pub const FENCED_WRITES: &str = "idem_fenced_writes_total";
/// `idem_lease_losses_total`
pub const LEASE_LOSSES: &str = "idem_lease_losses_total";
/// `idem_store_errors_total`, labelled with `operation`.
pub const STORE_ERRORS: &str = "idem_store_errors_total";
/// `idem_work_duration_seconds`
pub const WORK_DURATION: &str = "idem_work_duration_seconds";
/// Bucket bounds for the histograms above, in seconds: from a store round trip (1 ms) to
/// a long lease (10 min), about three per decade, so that `histogram_quantile` reads a
/// latency within a factor of about two.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];
/// `idem_purged_total`
pub const PURGED: &str = "idem_purged_total";

/// `idem_new_keys_total`, labelled with `scope` when the application maps scopes to labels.
pub const NEW_KEYS: &str = "idem_new_keys_total";
/// `idem_key_budget_rejections_total`, labelled like [`NEW_KEYS`].
pub const KEY_BUDGET_REJECTIONS: &str = "idem_key_budget_rejections_total";

pub(crate) fn count_scoped(name: &'static str, label: Option<String>) {
    match label {
        Some(label) => metrics::counter!(name, "scope" => label).increment(1),
        None => metrics::counter!(name).increment(1),
    }
}

pub(crate) fn count(name: &'static str) {
    metrics::counter!(name).increment(1);
}

pub(crate) fn store_error(operation: Operation) {
    metrics::counter!(STORE_ERRORS, "operation" => operation.to_string()).increment(1);
}

pub(crate) fn work_duration(elapsed: Duration) {
    metrics::histogram!(WORK_DURATION).record(elapsed.as_secs_f64());
}

pub(crate) fn purged(records: usize) {
    metrics::counter!(PURGED).increment(records as u64);
}
