//! Cron schedules in a time zone (feature `cron`): [`ScheduledJob::cron`], on croner
//! (cron expressions, DST handled as the Open Cron Pattern Specification says) and
//! chrono-tz (the IANA time zone database).

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use idem_core::{Idempotency, Store};

use crate::ScheduledJob;
use crate::schedule::{Backlog, ScheduleError};

/// The last millisecond an RFC 3339 key names: 9999-12-31T23:59:59.999Z.
const LAST: Duration = Duration::from_millis(253_402_300_799_999);

/// How many of the next slots are looked at to learn a cron schedule's shortest and
/// longest gap between slots.
const SAMPLED_SLOTS: usize = 400;

/// A cron expression in a time zone, and what the schedule needs of it.
pub(crate) struct CronCadence {
    cron: Cron,
    zone: Tz,
    expression: String,
    shortest: Duration,
    longest: Duration,
}

impl CronCadence {
    fn parse(expression: &str, zone: &str) -> Result<Self, ScheduleError> {
        let cron = Cron::from_str(expression).map_err(|source| ScheduleError::Cron {
            expression: expression.to_owned(),
            source: CronSyntax(Arc::new(source)),
        })?;
        let zone: Tz = zone.parse().map_err(|_| ScheduleError::TimeZone {
            zone: zone.to_owned(),
        })?;
        let mut cadence = Self {
            cron,
            zone,
            expression: expression.to_owned(),
            shortest: Duration::MAX,
            longest: Duration::ZERO,
        };
        let mut slot = cadence
            .next_after_checked(SystemTime::now())
            .ok_or_else(|| ScheduleError::NeverDue {
                expression: expression.to_owned(),
            })?;
        for _ in 0..SAMPLED_SLOTS {
            let Some(next) = cadence.next_after_checked(slot) else {
                break;
            };
            let gap = next.duration_since(slot).unwrap_or_default();
            cadence.shortest = cadence.shortest.min(gap);
            cadence.longest = cadence.longest.max(gap);
            slot = next;
        }
        if cadence.longest.is_zero() {
            // A single slot ever: no gap to learn.
            return Err(ScheduleError::NeverDue {
                expression: expression.to_owned(),
            });
        }
        Ok(cadence)
    }

    fn zoned(&self, time: SystemTime) -> DateTime<Tz> {
        // Within what chrono and an RFC 3339 key can name.
        let time = time.clamp(UNIX_EPOCH, UNIX_EPOCH + LAST);
        DateTime::<Utc>::from(time).with_timezone(&self.zone)
    }

    fn instant(time: DateTime<Tz>) -> SystemTime {
        let millis = time.with_timezone(&Utc).timestamp_millis();
        UNIX_EPOCH + Duration::from_millis(u64::try_from(millis).unwrap_or(0))
    }

    fn next_after_checked(&self, time: SystemTime) -> Option<SystemTime> {
        self.cron
            .find_next_occurrence(&self.zoned(time), false)
            .ok()
            .map(Self::instant)
    }

    /// The latest slot at or before `now`; the Unix epoch before the first.
    pub(crate) fn slot_at(&self, now: SystemTime) -> SystemTime {
        self.cron
            .find_previous_occurrence(&self.zoned(now), true)
            .map(Self::instant)
            .unwrap_or(UNIX_EPOCH)
    }

    /// The first slot after `time`; far in the future when there is none.
    pub(crate) fn next_after(&self, time: SystemTime) -> SystemTime {
        self.next_after_checked(time).unwrap_or(UNIX_EPOCH + LAST)
    }

    /// The slot before `slot`, if any.
    pub(crate) fn previous_before(&self, slot: SystemTime) -> Option<SystemTime> {
        self.cron
            .find_previous_occurrence(&self.zoned(slot), false)
            .ok()
            .map(Self::instant)
            .filter(|earlier| *earlier >= UNIX_EPOCH)
    }

    pub(crate) fn shortest(&self) -> Duration {
        self.shortest
    }

    pub(crate) fn longest(&self) -> Duration {
        self.longest
    }

    pub(crate) fn expression(&self) -> &str {
        &self.expression
    }

    pub(crate) fn zone(&self) -> &str {
        self.zone.name()
    }
}

/// A cron expression croner refused: the reason, kept for [`ScheduleError::Cron`].
#[derive(Debug, Clone)]
pub struct CronSyntax(Arc<croner::errors::CronError>);

impl std::fmt::Display for CronSyntax {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for CronSyntax {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl PartialEq for CronSyntax {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_string() == other.0.to_string()
    }
}

impl Eq for CronSyntax {}

impl<S: Store + ?Sized + 'static> ScheduledJob<S> {
    /// A job named `name` due at the times of a cron `expression` (five fields, or six
    /// with seconds first) in the IANA time zone `zone` (`Europe/Paris`, `UTC`).
    ///
    /// - Slots are the instants the expression names in the zone, daylight saving time
    ///   included: a wall-clock time skipped by a change runs at the change, a repeated
    ///   one once. The slot's key is that instant in UTC, as for a fixed period.
    /// - The catch-up window is the driver's lease plus the longest gap between two slots,
    ///   learned from the next 400 slots: for an expression whose gaps change only at a
    ///   DST change further away than that (every two hours, say), set the window with
    ///   [`ScheduledJob::catch_up`].
    /// - Before the expression's first time (a year field in the future), nothing is due.
    /// - The fingerprint holds the expression and the zone: schedulers that disagree on
    ///   them meet as [`idem_core::Error::Mismatch`] on the slots they share.
    ///
    /// ```
    /// use idem_consumer::ScheduledJob;
    /// use idem_core::{Idempotency, MemoryStore};
    /// use std::time::{Duration, SystemTime};
    ///
    /// // Every day at 02:30 in Paris; records kept past the window of a day.
    /// let idem = Idempotency::builder(MemoryStore::new())
    ///     .retention(Duration::from_secs(3 * 86_400))
    ///     .build()?;
    /// let nightly = ScheduledJob::cron(idem, "nightly-settlement", "30 2 * * *", "Europe/Paris")?;
    /// // 2026-03-29, the night clocks go forward at 02:00: 02:30 does not exist, so the
    /// // slot is 03:00 local time, 01:00 UTC.
    /// let after = SystemTime::UNIX_EPOCH + Duration::from_secs(1_774_742_400); // 2026-03-29T00:00:00Z
    /// let slot = nightly.next_slot_after(after);
    /// assert_eq!(slot, SystemTime::UNIX_EPOCH + Duration::from_secs(1_774_746_000)); // 01:00:00Z
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`ScheduleError::Cron`] for an expression croner refuses,
    /// [`ScheduleError::TimeZone`] for an unknown zone, [`ScheduleError::NeverDue`] for
    /// one that names no time from now on, and as [`ScheduledJob::new`].
    pub fn cron(
        idem: Idempotency<S>,
        name: impl Into<String>,
        expression: &str,
        zone: &str,
    ) -> Result<Self, ScheduleError> {
        let cadence = CronCadence::parse(expression, zone)?;
        // A job of the cadence's longest gap, then the cron times in place of its period.
        let longest = Duration::from_millis(
            u64::try_from(cadence.longest().as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        let job = ScheduledJob::new_unvalidated(idem, name.into(), longest)?;
        job.with_cron(Arc::new(cadence))
            .backlog(Backlog::RunAll)
            .revalidated()
    }
}
