//! The keys this layer answered with a response it held (a 5xx, a response it could not
//! store): nothing runs under them any more, yet the store answers "in flight" until
//! their lease ends. A retry that reaches this replica is told the lease's end (capped by
//! [`held_retry_after`](crate::IdempotencyLayer::held_retry_after)) instead of polling
//! every second for a whole lease. Another replica does not know, and answers as for
//! work in flight: the store cannot tell the two apart.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use idem_core::Key;

/// Past this many keys held at once, new ones are not remembered (their retries are
/// answered as for work in flight): the memory stays bounded under a flood of failures.
const MOST: usize = 10_000;

/// How much later than remembered a held key's lease may seem to end: the stores'
/// rounding, with room to spare. A takeover's lease ends at least this much later but
/// when the held answer came within this of its lease's end (heartbeats renew a lease
/// every third of it), when its retry is told to wait for at most `held_retry_after`.
const SLACK: Duration = Duration::from_millis(250);

/// Keys held after their response, each until its lease ends at the latest.
#[derive(Debug, Default)]
pub(crate) struct HeldKeys {
    until: Mutex<HashMap<Key, Instant>>,
    /// When a full map was last swept of ended holds: at most once a second, so that a
    /// storm of failures does not scan it on every answer.
    swept: Mutex<Option<Instant>>,
}

impl HeldKeys {
    /// Remembers `key` as held for at most `lease` from now.
    pub(crate) fn hold(&self, key: &Key, lease: Duration) {
        let now = Instant::now();
        let Some(until) = now.checked_add(lease) else {
            return;
        };
        let mut held = self.lock();
        if held.len() >= MOST {
            let mut swept = self
                .swept
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if swept.is_some_and(|at| now.duration_since(at) < Duration::from_secs(1)) {
                return;
            }
            *swept = Some(now);
            held.retain(|_, until| *until > now);
            if held.len() >= MOST {
                return;
            }
        }
        held.insert(key.clone(), until);
    }

    /// Whether `key` is still under the lease this layer held it with, given that the
    /// store says its lease ends in `lease_left`. The held lease ended by the time this
    /// layer remembered (its answer's time plus a whole lease); a lease that ends later
    /// is another attempt's, which took the key over since (here or on another replica,
    /// or after an operator's release) and whose work runs.
    pub(crate) fn holds(&self, key: &Key, lease_left: Duration) -> bool {
        let mut held = self.lock();
        let now = Instant::now();
        match held.get(key) {
            Some(until) if *until > now => {
                // Stores count leases in milliseconds, against this clock in nanoseconds:
                // a lease may seem to end a little after what was remembered. Another
                // attempt's begins only once the held one ended, a lease after that.
                now.checked_add(lease_left)
                    .is_some_and(|end| end <= *until + SLACK)
            }
            Some(_) => {
                held.remove(key);
                false
            }
            None => false,
        }
    }

    /// Forgets `key`: something ran under it again, or it was finished.
    pub(crate) fn forget(&self, key: &Key) {
        let mut held = self.lock();
        if !held.is_empty() {
            held.remove(key);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Instant>> {
        // A panic while holding the map leaves a map, still sound to read.
        self.until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_key_is_known_until_its_lease_ends() {
        let held = HeldKeys::default();
        let key = Key::new("s", "k").unwrap();
        let other = Key::new("s", "other").unwrap();
        held.hold(&key, Duration::from_secs(60));
        assert!(held.holds(&key, Duration::from_secs(50)));
        assert!(
            !held.holds(&key, Duration::from_secs(70)),
            "a later lease is another attempt's"
        );
        assert!(!held.holds(&other, Duration::from_secs(50)));
        held.forget(&key);
        assert!(!held.holds(&key, Duration::from_secs(50)));
        held.hold(&key, Duration::ZERO);
        assert!(
            !held.holds(&key, Duration::ZERO),
            "a lease already over holds nothing"
        );
        assert!(held.lock().is_empty(), "an ended hold is dropped when read");
    }

    #[test]
    fn at_most_so_many_keys_are_remembered() {
        let held = HeldKeys::default();
        for i in 0..MOST + 5 {
            held.hold(
                &Key::new("s", format!("k{i}")).unwrap(),
                Duration::from_secs(60),
            );
        }
        assert_eq!(held.lock().len(), MOST);
        assert!(!held.holds(
            &Key::new("s", format!("k{}", MOST + 1)).unwrap(),
            Duration::from_secs(1)
        ));
        // Ended holds make room.
        let ended = HeldKeys::default();
        for i in 0..MOST {
            ended.hold(&Key::new("s", format!("k{i}")).unwrap(), Duration::ZERO);
        }
        let fresh = Key::new("s", "fresh").unwrap();
        ended.hold(&fresh, Duration::from_secs(60));
        assert!(ended.holds(&fresh, Duration::from_secs(1)));
        // Full of ended holds again, just after a sweep: no second sweep within the second,
        // so the next key is not remembered (a storm of failures scans the map once).
        for i in 1..MOST {
            ended.hold(&Key::new("s", format!("again{i}")).unwrap(), Duration::ZERO);
        }
        assert_eq!(ended.lock().len(), MOST);
        // Swept "now" whatever the time this test takes to get to the next line.
        *ended.swept.lock().unwrap() = Some(Instant::now() + Duration::from_secs(3600));
        let next = Key::new("s", "next").unwrap();
        ended.hold(&next, Duration::from_secs(60));
        assert!(!ended.holds(&next, Duration::from_secs(1)));
    }
}
