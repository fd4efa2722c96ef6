//! Slot times: the slot at a time, the next and previous ones, the catch-up window's
//! slots, and each slot's key and fingerprint.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_core::{Fingerprint, Key, Store};

use super::{MAX_CATCH_UP_SLOTS, ScheduledJob};

impl<S: Store + ?Sized + 'static> ScheduledJob<S> {
    /// The latest slot at or before `now` (the Unix epoch itself before the first slot;
    /// times past the year 9999 count as its last millisecond).
    pub fn slot_at(&self, now: SystemTime) -> SystemTime {
        #[cfg(feature = "cron")]
        if let Some(cron) = &self.cron {
            return cron.slot_at(now.min(UNIX_EPOCH + LAST_MILLISECOND));
        }
        let since = now
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .min(LAST_MILLISECOND);
        let period = self.period.as_millis();
        let Some(shifted) = since.as_millis().checked_sub(self.offset.as_millis()) else {
            return UNIX_EPOCH;
        };
        let slot = shifted / period * period + self.offset.as_millis();
        UNIX_EPOCH + Duration::from_millis(u64::try_from(slot).unwrap_or(u64::MAX))
    }

    /// The first slot after `now`.
    pub fn next_slot_after(&self, now: SystemTime) -> SystemTime {
        #[cfg(feature = "cron")]
        if let Some(cron) = &self.cron {
            return cron.next_after(now);
        }
        self.slot_at(now) + self.period
    }

    /// The slot before `slot`, if any.
    fn previous_slot(&self, slot: SystemTime) -> Option<SystemTime> {
        #[cfg(feature = "cron")]
        if let Some(cron) = &self.cron {
            return cron.previous_before(slot);
        }
        slot.checked_sub(self.period)
            .filter(|earlier| *earlier >= UNIX_EPOCH)
    }

    /// The shortest time between two slots.
    pub(super) fn shortest_gap(&self) -> Duration {
        #[cfg(feature = "cron")]
        if let Some(cron) = &self.cron {
            return cron.shortest();
        }
        self.period
    }

    pub(super) fn is_cron(&self) -> bool {
        #[cfg(feature = "cron")]
        if self.cron.is_some() {
            return true;
        }
        false
    }

    /// The slots a tick at `now` runs, oldest first: those of the catch-up window, the
    /// current one last.
    pub fn due_slots(&self, now: SystemTime) -> Vec<SystemTime> {
        let current = self.slot_at(now);
        if self.is_cron() && current == UNIX_EPOCH {
            // Before a cron schedule's first time: nothing is due.
            return Vec::new();
        }
        let earliest = now.checked_sub(self.catch_up).unwrap_or(UNIX_EPOCH);
        let mut slots = Vec::new();
        let mut slot = current;
        while slot >= earliest && slots.len() as u64 <= MAX_CATCH_UP_SLOTS {
            slots.push(slot);
            match self.previous_slot(slot) {
                Some(earlier) => slot = earlier,
                None => break,
            }
        }
        if slots.is_empty() {
            slots.push(current);
        }
        slots.reverse();
        if let Some(start) = self.not_before {
            slots.retain(|slot| *slot >= start);
        }
        slots
    }

    /// The key of a slot: the scope `schedule/<name>` and the slot's RFC 3339 time in
    /// UTC, to the millisecond (`2026-12-01T02:30:00.000Z`).
    pub fn key_of(&self, slot: SystemTime) -> Key {
        let time = rfc3339_millis(self.slot_at(slot));
        Key::new(self.scope.as_str(), time)
            .expect("the scope was validated with a key of this form")
    }

    pub(super) fn fingerprint(&self) -> Fingerprint {
        #[cfg(feature = "cron")]
        if let Some(cron) = &self.cron {
            return Fingerprint::builder()
                .field(self.name.as_bytes())
                .field(cron.expression().as_bytes())
                .field(cron.zone().as_bytes())
                .finish();
        }
        Fingerprint::builder()
            .field(self.name.as_bytes())
            .field(self.period.as_millis().to_be_bytes())
            .field(self.offset.as_millis().to_be_bytes())
            .finish()
    }
}

/// The last millisecond an RFC 3339 time can name: 9999-12-31T23:59:59.999Z.
const LAST_MILLISECOND: Duration = Duration::from_millis(253_402_300_799_999);

/// `time` as RFC 3339 in UTC to the millisecond, from the civil calendar (no formatting
/// crate: they refuse times their platform's `time_t` cannot hold).
fn rfc3339_millis(time: SystemTime) -> String {
    let millis = time
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .min(LAST_MILLISECOND)
        .as_millis() as u64;
    let (days, ms_of_day) = (millis / 86_400_000, millis % 86_400_000);
    // Howard Hinnant's days-to-civil, for days since 1970-01-01 (never negative here).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let (hours, minutes) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60);
    let (seconds, ms) = (ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{hours:02}:{minutes:02}:{seconds:02}.{ms:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_names_every_millisecond_it_can() {
        let at = |ms: u64| rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms));
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(1_796_162_400_123), "2026-12-01T22:00:00.123Z");
        assert_eq!(at(4_107_542_399_999), "2100-02-28T23:59:59.999Z");
        assert_eq!(at(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
        assert_eq!(at(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
        assert_eq!(at(u64::MAX), "9999-12-31T23:59:59.999Z");
        // Every day for 1600 years against a plain day count, month by month.
        let mut day = 0u64;
        for year in 1970..3570u64 {
            let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
            for (month, length) in [
                31,
                28 + u64::from(leap),
                31,
                30,
                31,
                30,
                31,
                31,
                30,
                31,
                30,
                31,
            ]
            .into_iter()
            .enumerate()
            {
                assert_eq!(
                    &at(day * 86_400_000)[..10],
                    format!("{year:04}-{:02}-01", month + 1)
                );
                day += length;
            }
        }
    }
}
