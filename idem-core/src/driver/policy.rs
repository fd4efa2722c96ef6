//! Driver policies: heartbeats and what a duplicate does while another attempt runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The shortest lease `Heartbeat::Auto` renews: a third of it must be a whole millisecond.
pub(crate) const AUTO_HEARTBEAT_MIN_LEASE: Duration = Duration::from_millis(3);

/// The part of a lease by which the owner's own idea of its end comes early: one
/// fiftieth. The end is counted on the process's monotonic clock from when the claim or
/// the renewal was sent, so it is never later than the store's; this covers clock rate
/// drift between the two (far below 2 %) and the time between a check and the effect
/// that follows it.
pub(crate) const LOCAL_EXPIRY_FRACTION: u32 = 50;

/// Whether the driver renews the lease while the work runs.
///
/// ```
/// use idem_core::{Heartbeat, Idempotency, MemoryStore};
/// use std::time::Duration;
///
/// let idem = Idempotency::builder(MemoryStore::new())
///     .lease(Duration::from_secs(30))
///     .heartbeat(Heartbeat::Every(Duration::from_secs(5)))
///     .build()?;
/// # let _ = idem;
/// # Ok::<(), idem_core::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Heartbeat {
    /// Renew every third of the lease (the default). Needs a lease of 3 ms or more; the
    /// builder refuses shorter ones with this setting.
    #[default]
    Auto,
    /// Never renew while the work runs (a claim won late is still confirmed with one
    /// renewal): once the lease ends on the process's clock, the work's steps are refused
    /// ([`Context::is_lease_lost`](crate::Context::is_lease_lost)), and another attempt
    /// may take over.
    Off,
    /// Renew at this interval: at most nine tenths of the lease less a fiftieth (the
    /// owner stops itself a fiftieth early), so that a renewal lands before.
    Every(Duration),
}

impl Heartbeat {
    /// The renewal interval for `lease`, if any.
    pub(crate) fn interval(self, lease: Duration) -> Option<Duration> {
        match self {
            Heartbeat::Auto => Some(lease / 3),
            Heartbeat::Off => None,
            Heartbeat::Every(every) => Some(every),
        }
    }
}

/// What `execute` does when another attempt holds the key.
///
/// ```
/// use idem_core::{Idempotency, InFlightPolicy, MemoryStore};
/// use std::time::Duration;
///
/// // A queue consumer: wait up to 10 s for the first delivery's result.
/// let idem = Idempotency::builder(MemoryStore::new())
///     .in_flight(InFlightPolicy::Wait { timeout: Duration::from_secs(10) })
///     .build()?;
/// # let _ = idem;
/// # Ok::<(), idem_core::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum InFlightPolicy {
    /// Answer [`Error::InFlight`](crate::Error::InFlight) with `retry_after` at once (the
    /// default): right for HTTP APIs, whose clients retry.
    #[default]
    Reject,
    /// Poll with backoff and jitter until the other attempt finishes (replaying its result)
    /// or its lease expires (taking over), giving up with `InFlight` after `timeout`.
    /// Never runs the work while another attempt's lease is live.
    Wait {
        /// The longest time to wait.
        timeout: Duration,
    },
}

/// First and largest pause between polls of a waiting duplicate.
pub(crate) const WAIT_FIRST_BACKOFF: Duration = Duration::from_millis(10);
pub(crate) const WAIT_MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Where the driver's backoff jitter comes from: the operating system's generator, or a
/// seeded one (`IdempotencyBuilder::jitter_seed`) so that a simulation replays exactly.
#[derive(Clone, Debug, Default)]
pub(crate) struct Jitter(Option<Arc<AtomicU64>>);

impl Jitter {
    pub(crate) fn seeded(seed: u64) -> Self {
        Self(Some(Arc::new(AtomicU64::new(seed))))
    }

    /// `backoff` scaled by a random factor in [0.5, 1.0], so waiters do not poll in step.
    pub(crate) fn jittered(&self, backoff: Duration) -> Duration {
        let random = match &self.0 {
            // SplitMix64: one step of the sequence, its top byte.
            Some(state) => {
                let mut z = state
                    .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
                    .wrapping_add(0x9E37_79B9_7F4A_7C15);
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                (z ^ (z >> 31)).to_be_bytes()[0]
            }
            None => {
                let mut byte = [0u8; 1];
                // Without randomness, waiters still back off; they just poll in step.
                getrandom::fill(&mut byte).map_or(255, |()| byte[0])
            }
        };
        backoff.mul_f64(0.5 + f64::from(random) / 510.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_jitter_repeats_its_sequence_within_half_to_whole() {
        let backoff = Duration::from_millis(100);
        let draw = |jitter: &Jitter| -> Vec<Duration> {
            (0..64).map(|_| jitter.jittered(backoff)).collect()
        };
        let (one, again, other) = (
            draw(&Jitter::seeded(7)),
            draw(&Jitter::seeded(7)),
            draw(&Jitter::seeded(8)),
        );
        assert_eq!(one, again);
        assert_ne!(one, other);
        assert!(one.iter().all(|d| *d >= backoff / 2 && *d <= backoff));
        // Clones share the sequence: a driver's tasks draw from one generator.
        let shared = Jitter::seeded(7);
        let clone = shared.clone();
        assert_eq!(
            [shared.jittered(backoff), clone.jittered(backoff)],
            [one[0], one[1]]
        );
    }

    /// The seeded generator is SplitMix64 as published: from seed 0 its outputs are
    /// e220a8397b1dcdaf, 6e789e6aa1b965f4, 06c45d188009454f, f88bb8a8724c81ec, whose top
    /// bytes scale the backoff.
    #[test]
    fn a_seeded_jitter_is_splitmix64() {
        let backoff = Duration::from_millis(100);
        let jitter = Jitter::seeded(0);
        for top in [0xe2u8, 0x6e, 0x06, 0xf8] {
            let expected = backoff.mul_f64(0.5 + f64::from(top) / 510.0);
            assert_eq!(jitter.jittered(backoff), expected, "{top:#x}");
        }
    }
}
