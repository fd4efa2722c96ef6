//! The driver's timing under exploration, the faults' lengths, and the bound every
//! `execute` must return within.

use std::time::Duration;

use idem_core::Heartbeat;

use super::faults::{Fault, PlacedFault};
use super::scenarios::Scenario;

/// The first pause between two tries of one store call, doubled after each try: the
/// driver's `STORE_BACKOFF` (jittered down to half, never up).
pub(crate) const STORE_BACKOFF: Duration = Duration::from_millis(25);
/// The fewest tries of one store call before the driver gives up on it: the driver's
/// `STORE_ATTEMPTS`.
pub(crate) const STORE_ATTEMPTS: u32 = 3;
/// The longest pause between two tries of a write within its lease: the driver's
/// `MAX_WRITE_BACKOFF`.
pub(crate) const MAX_WRITE_BACKOFF: Duration = Duration::from_millis(500);

/// The driver settings a run uses, and how long the explorer's faults last.
///
/// Start from [`Timing::virtual_time`] or [`Timing::real_time`] and change fields:
///
/// ```
/// use idem_testkit::explore::Timing;
/// use std::time::Duration;
///
/// let mut timing = Timing::real_time();
/// timing.lease = Duration::from_millis(600);
/// timing.store_timeout = Duration::from_millis(300);
/// # let _ = timing;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timing {
    /// The driver's lease (heartbeats renew it every third).
    pub lease: Duration,
    /// The driver's bound on one store call.
    pub store_timeout: Duration,
    /// The `InFlightPolicy::Wait` timeout of the scenario with a waiting duplicate.
    pub wait_timeout: Duration,
    /// How long a hanging store call hangs, at least: each run lengthens it past the
    /// largest bound any `execute` of its scenario can have (with every stall of its
    /// plan), so that a call the driver does not bound always shows as an `execute` over
    /// its bound, whatever the scenario's writes.
    pub hang: Duration,
    /// How long the work stalls at an await point ([`Fault::StallAtPoint`](super::Fault::StallAtPoint)),
    /// and how long a pause or a partition cuts a process off.
    pub stall: Duration,
    /// Added to every bound before it counts as exceeded: zero under paused time, where
    /// durations are exact; some room on a real clock, where the machine's load adds
    /// latency the driver does not control.
    pub slack: Duration,
    /// How far each process's clock is from the run's, for a
    /// [`Target::per_process_clocks`](super::Target::per_process_clocks) (any other target
    /// refuses a skew: [`ExploreError::Skew`](super::ExploreError::Skew)): the first
    /// caller's runs behind, every other process's ahead (they share one clock), so the
    /// first caller and any other differ by twice this. Zero by default; under ten leases.
    /// Within the driver's margin (a fiftieth of the lease, so a skew of a hundredth or
    /// less) the promise holds; past it, a retry can take over a lease its owner still
    /// counts live, and the explorer reports the grant with the clocks' distance.
    pub skew: Duration,
    /// How long every process's claims keep the record (the driver's
    /// `IdempotencyBuilder::retention`; never less than the lease): an hour by default,
    /// past any run. Equal to the lease, every record's lifetime edge falls inside the
    /// run: a result stored is forgotten a lease later (and a later caller runs the work
    /// again, in a new lifetime the checks tell apart), while a record whose owner may
    /// still come back must stay.
    pub retention: Duration,
    /// The driver's heartbeat: [`Heartbeat::Auto`] (every third of the lease) by default.
    /// With [`Heartbeat::Off`] only the scenarios whose work fits in one lease can finish
    /// (a longer work's steps are refused once its lease ends, and so are every retry's).
    pub heartbeat: Heartbeat,
}

impl Timing {
    /// For stores on a virtual clock (paused Tokio time): every wait is free, so leases
    /// are long enough that no timer lands on another by accident.
    pub fn virtual_time() -> Self {
        let lease = Duration::from_secs(2);
        let store_timeout = Duration::from_millis(500);
        Self {
            lease,
            store_timeout,
            wait_timeout: lease * 3,
            hang: (lease + store_timeout) * 10,
            stall: lease * 2,
            slack: Duration::ZERO,
            skew: Duration::ZERO,
            retention: Duration::from_secs(3600),
            heartbeat: Heartbeat::Auto,
        }
    }

    /// For stores on a server's clock (PostgreSQL, Redis, DynamoDB): real waits, so short
    /// leases keep a run to about a second.
    pub fn real_time() -> Self {
        let lease = Duration::from_millis(300);
        let store_timeout = Duration::from_millis(150);
        Self {
            lease,
            store_timeout,
            wait_timeout: lease * 3,
            hang: (lease + store_timeout) * 4 + Duration::from_secs(2),
            stall: lease * 2,
            slack: Duration::from_millis(500),
            skew: Duration::ZERO,
            retention: Duration::from_secs(3600),
            heartbeat: Heartbeat::Auto,
        }
    }
}

impl Timing {
    /// This timing for one run of `scenario` with `plan`: its hang outlasts the largest
    /// bound of any process of the run (the scenario's most work and writes, each stall of
    /// the plan on one process) by a store timeout more than the slack.
    pub(crate) fn striking(mut self, scenario: Scenario, plan: &[PlacedFault]) -> Self {
        let stalls = plan
            .iter()
            .filter(|placed| matches!(placed.fault, Fault::StallAtPoint | Fault::PauseAtPoint))
            .count();
        let stalls = u32::try_from(stalls).unwrap_or(u32::MAX);
        let past = scenario.max_bound(&self, stalls) + self.slack + self.store_timeout;
        self.hang = self.hang.max(past);
        self
    }
}

/// The longest one `Idempotency::execute` may take, from the driver's settings and what
/// the execution did.
///
/// With `L` the lease, `T` the store timeout, `W` the `InFlightPolicy::Wait` timeout (0
/// under `Reject`), `D` the work's own time (what it waits on besides idem: its sleeps,
/// its own calls) and `n` the number of distinct store writes the execution makes after
/// its claim (each checkpoint, the result or failure, a release; heartbeat renewals run
/// beside the work and do not count):
///
/// ```text
/// claim = W + 3·T + (25 + 50) ms        STORE_ATTEMPTS tries of T, with the two backoffs between
/// write = max(L + 500 ms + T,           a write is retried while the lease lasts, the last try
///             3·T + (25 + 50) ms)       starting at most one MAX_WRITE_BACKOFF after it ended;
///                                       and is tried STORE_ATTEMPTS times even with no lease left
/// bound = claim + D + n · write
/// ```
///
/// Under `Wait`, a duplicate's claim may end in a takeover; its work and writes then
/// count as any owner's. The explorer adds [`Timing::slack`] before it calls a run slow.
///
/// ```
/// use idem_testkit::explore::execute_bound;
/// use std::time::Duration;
///
/// let (lease, timeout) = (Duration::from_secs(2), Duration::from_millis(500));
/// // A claim, one second of work, two checkpoints and the result.
/// let bound = execute_bound(lease, timeout, None, Duration::from_secs(1), 3);
/// assert_eq!(bound, Duration::from_millis(1575 + 1000 + 3 * 3000));
/// ```
pub fn execute_bound(
    lease: Duration,
    store_timeout: Duration,
    wait: Option<Duration>,
    work: Duration,
    writes: u32,
) -> Duration {
    let backoffs = STORE_BACKOFF + STORE_BACKOFF * 2;
    let tries = store_timeout * STORE_ATTEMPTS + backoffs;
    let claim = wait.unwrap_or(Duration::ZERO) + tries;
    let write = (lease + MAX_WRITE_BACKOFF + store_timeout).max(tries);
    claim + work + write * writes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_costs_at_least_three_tries() {
        let bound = execute_bound(
            Duration::from_millis(1),
            Duration::from_secs(1),
            Some(Duration::from_secs(4)),
            Duration::ZERO,
            1,
        );
        assert_eq!(bound, Duration::from_millis(4000 + 3075 + 3075));
    }

    /// A call hung for the whole hang, bounded by nothing, puts its `execute` over the
    /// largest bound the check can give any process of the run: no scenario's writes or
    /// stalls can hide it.
    #[test]
    fn a_hang_outlasts_every_bound_of_the_scenario_it_strikes() {
        let stall = |process| PlacedFault {
            point: crate::explore::FaultPoint {
                process,
                site: crate::explore::Site::Point {
                    name: "anywhere".into(),
                    occurrence: 0,
                },
            },
            fault: Fault::StallAtPoint,
        };
        let plans = [
            Vec::new(),
            vec![stall(crate::explore::Process::First)],
            vec![
                stall(crate::explore::Process::First),
                stall(crate::explore::Process::First),
            ],
        ];
        for timing in [Timing::virtual_time(), Timing::real_time()] {
            for scenario in Scenario::all() {
                for plan in &plans {
                    let stalls = u32::try_from(plan.len()).unwrap_or(u32::MAX);
                    let largest = scenario.max_bound(&timing, stalls) + timing.slack;
                    let hang = timing.striking(scenario, plan).hang;
                    assert!(
                        hang > largest,
                        "{scenario}, {stalls} stalls: a hang of {hang:?} within a bound of {largest:?}"
                    );
                }
            }
        }
    }

    /// The hang used to be a fixed ten leases and store timeouts: shorter than the bound
    /// of a saga's first caller, whose writes alone take longer.
    #[test]
    fn a_fixed_hang_was_shorter_than_a_sagas_bound() {
        let timing = Timing::virtual_time();
        let fixed = (timing.lease + timing.store_timeout) * 10;
        // The first caller's distinct writes: three checkpoints, the saga's, three undo
        // marks, the failure.
        let first_caller =
            execute_bound(timing.lease, timing.store_timeout, None, Duration::ZERO, 8);
        assert!(first_caller > fixed);
        assert!(timing.striking(Scenario::SagaFailsAfterSteps, &[]).hang > first_caller);
    }
}
