//! [`ScheduledJob`]: a job run once per slot of its schedule, however many schedulers
//! fire it.
//!
//! - this file: [`ScheduledJob`], its settings and their checks, [`Backlog`],
//!   [`ScheduleError`], [`SlotRun`].
//! - Slot times, the catch-up window and the slots' keys: `slots.rs`.
//! - Running slots (one, the due ones, the loop for ever) and what each answer means
//!   for the next look: `run.rs`.

mod run;
mod slots;

use std::fmt;
use std::time::{Duration, SystemTime};

#[cfg(feature = "cron")]
use std::sync::Arc;

use idem_core::{Error, Idempotency, Key, Outcome, Store};

/// The most slots one catch-up window may hold: each is a store call on every tick.
pub const MAX_CATCH_UP_SLOTS: u64 = 1000;

/// A job that runs once per slot of a fixed period, across every scheduler that fires it.
///
/// A slot is the time the job was due (a multiple of the period since the Unix epoch,
/// plus an offset), never the clock when a scheduler got round to it, so two schedulers,
/// an overlapping run or a restarted process all name the same slot the same way: the key
/// is the slot's time (RFC 3339, in the scope `schedule/<name>`), and it runs once.
///
/// - Each tick runs every slot of the catch-up window (by default the lease plus one
///   period): a slot whose scheduler crashed is taken over when its lease ends, and
///   resumes through its [`Context::step`] checkpoints.
/// - A slot finished before is a replay: its work does not run again.
/// - A slot another scheduler is running is left to it ([`Error::InFlight`]);
///   [`ScheduledJob::run`] remembers it and looks again when its lease ends, however long
///   the work heartbeated, even once the slot has left the window.
/// - A new deployment also runs the slots of the window that never ran (like a
///   Kubernetes CronJob's starting deadline), and always the current slot, however late
///   in its period: a daily job deployed at 15:00 runs that day's 02:30 slot at once.
/// - The slot's key changes with the job's name only; its fingerprint holds the period
///   and offset too, so schedulers that disagree on them meet as [`Error::Mismatch`] on
///   the slots they share instead of running beside each other unseen.
///
/// [`Context::step`]: idem_core::Context::step
///
/// ```
/// use idem_consumer::ScheduledJob;
/// use idem_core::{Idempotency, MemoryStore, done};
/// use std::time::{Duration, SystemTime};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let idem = Idempotency::new(MemoryStore::new());
/// let report = ScheduledJob::new(idem, "hourly-report", Duration::from_secs(3600))?;
/// let now = SystemTime::now();
/// // Two schedulers fire the same hour: it runs once.
/// let first = report.run_slot(report.slot_at(now), |_ctx, slot| async move { done(slot) }).await?;
/// let second = report.run_slot(report.slot_at(now), |_ctx, slot| async move { done(slot) }).await?;
/// assert!(!first.replayed() && second.replayed());
/// // In a service: tokio::spawn(async move { report.run(|ctx, slot| async move { ... }).await });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct ScheduledJob<S: ?Sized = dyn Store> {
    idem: Idempotency<S>,
    name: String,
    scope: String,
    /// The fixed period, or the longest gap between two slots of a cron schedule.
    period: Duration,
    offset: Duration,
    catch_up: Duration,
    #[cfg(feature = "cron")]
    cron: Option<Arc<crate::cron::CronCadence>>,
    not_before: Option<SystemTime>,
    skew: Duration,
    backlog: Backlog,
    slot_timeout: Option<Duration>,
}

/// What a scheduler does with slots that came and went while it was busy or down (a job
/// slower than its period, a process paused), beyond the catch-up window's takeovers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Backlog {
    /// Runs every slot that came and went, oldest first (the default): each slot's work
    /// happens, however late.
    #[default]
    RunAll,
    /// Runs at most the latest `n` slots not run yet, the catch-up window's included; the
    /// older ones are skipped (logged), and never run by this scheduler. The window's own
    /// slots always run, even past `n` (a crashed scheduler's slot is taken over), so with
    /// `catch_up(Duration::ZERO)`, `Latest(1)` runs only the current slot: a job that only
    /// needs the newest state.
    Latest(std::num::NonZeroUsize),
}

impl<S: ?Sized> Clone for ScheduledJob<S> {
    fn clone(&self) -> Self {
        Self {
            idem: self.idem.clone(),
            name: self.name.clone(),
            scope: self.scope.clone(),
            period: self.period,
            offset: self.offset,
            catch_up: self.catch_up,
            #[cfg(feature = "cron")]
            cron: self.cron.clone(),
            not_before: self.not_before,
            skew: self.skew,
            backlog: self.backlog,
            slot_timeout: self.slot_timeout,
        }
    }
}

impl<S: ?Sized> fmt::Debug for ScheduledJob<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScheduledJob")
            .field("name", &self.name)
            .field("period", &self.period)
            .field("offset", &self.offset)
            .field("catch_up", &self.catch_up)
            .field("not_before", &self.not_before)
            .field("skew", &self.skew)
            .field("backlog", &self.backlog)
            .field("slot_timeout", &self.slot_timeout)
            .finish_non_exhaustive()
    }
}

/// A schedule that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The job's name makes no valid scope.
    #[error("the job name is not usable: {0}")]
    Name(#[source] idem_core::key::KeyError),
    /// The period is under a millisecond, or not a whole number of milliseconds (slots
    /// are named to the millisecond).
    #[error("the period {0:?} is not a whole number of milliseconds of at least 1 ms")]
    Period(Duration),
    /// The offset is not shorter than the period, or not whole milliseconds.
    #[error("the offset {offset:?} must be whole milliseconds shorter than the period {period:?}")]
    Offset {
        /// The offset given.
        offset: Duration,
        /// The period.
        period: Duration,
    },
    /// The catch-up window holds more than [`MAX_CATCH_UP_SLOTS`] slots.
    #[error(
        "the catch-up window {catch_up:?} holds more than {MAX_CATCH_UP_SLOTS} slots of {period:?}; shorten the window or lengthen the period"
    )]
    CatchUpTooLong {
        /// The window given.
        catch_up: Duration,
        /// The period.
        period: Duration,
    },
    /// Records are not kept as long as a slot can be run again: a finished slot's record
    /// would expire while the slot is still in the window, and it would run twice.
    #[error(
        "the retention {retention:?} is shorter than the catch-up window plus a period ({needed:?}): a finished slot could run again; raise the retention"
    )]
    RetentionTooShort {
        /// The driver's retention.
        retention: Duration,
        /// What it must exceed.
        needed: Duration,
    },
    /// The cron expression is not valid.
    #[cfg(feature = "cron")]
    #[error("the cron expression `{expression}` is not valid: {source}")]
    Cron {
        /// The expression given.
        expression: String,
        /// What croner found.
        #[source]
        source: crate::cron::CronSyntax,
    },
    /// The time zone is not in the IANA database (`Europe/Paris`, `America/New_York`,
    /// `UTC`).
    #[cfg(feature = "cron")]
    #[error("`{zone}` is not an IANA time zone name such as Europe/Paris or UTC")]
    TimeZone {
        /// The zone given.
        zone: String,
    },
    /// The cron expression names no time from now on, or only one (`0 0 30 2 *`, the
    /// 30th of February).
    #[cfg(feature = "cron")]
    #[error("the cron expression `{expression}` names no recurring time from now on")]
    NeverDue {
        /// The expression given.
        expression: String,
    },
}

/// One slot's run, as a tick answers it.
#[derive(Debug)]
pub struct SlotRun<T, E> {
    /// The slot's time.
    pub slot: SystemTime,
    /// Its answer: fresh, replayed, or why there is none ([`Error::InFlight`] while
    /// another scheduler runs it).
    pub answer: Result<Outcome<T, E>, Error>,
}

impl<S: Store + ?Sized + 'static> ScheduledJob<S> {
    /// A job named `name` due every `period`, at multiples of it since the Unix epoch (an
    /// hourly job on the hour). The catch-up window is the driver's lease plus one period,
    /// at most [`MAX_CATCH_UP_SLOTS`] periods (a slot seen unfinished is still looked at
    /// again by [`ScheduledJob::run`] after it leaves the window).
    ///
    /// # Errors
    /// [`ScheduleError`] for a name that makes no valid scope, a period under a
    /// millisecond or not whole milliseconds, or a retention too short for the window.
    pub fn new(
        idem: Idempotency<S>,
        name: impl Into<String>,
        period: Duration,
    ) -> Result<Self, ScheduleError> {
        Self::new_unvalidated(idem, name.into(), period)?.validated()
    }

    /// [`ScheduledJob::new`] before the window is checked against the retention.
    pub(crate) fn new_unvalidated(
        idem: Idempotency<S>,
        name: String,
        period: Duration,
    ) -> Result<Self, ScheduleError> {
        let scope = format!("schedule/{name}");
        // Validates the scope once, with a slot key of the longest form.
        Key::new(scope.as_str(), "1970-01-01T00:00:00.000Z").map_err(ScheduleError::Name)?;
        if period < Duration::from_millis(1) || !period.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(ScheduleError::Period(period));
        }
        let most = period.saturating_mul(u32::try_from(MAX_CATCH_UP_SLOTS).unwrap_or(u32::MAX));
        let catch_up = idem.lease().saturating_add(period).min(most);
        Self {
            idem,
            name,
            scope,
            period,
            offset: Duration::ZERO,
            catch_up,
            #[cfg(feature = "cron")]
            cron: None,
            not_before: None,
            skew: Duration::ZERO,
            backlog: Backlog::RunAll,
            slot_timeout: None,
        }
        .into_ok()
    }

    fn into_ok(self) -> Result<Self, ScheduleError> {
        Ok(self)
    }

    /// Slots at the times of `cadence` instead of multiples of the period.
    #[cfg(feature = "cron")]
    pub(crate) fn with_cron(mut self, cadence: Arc<crate::cron::CronCadence>) -> Self {
        self.period = cadence.longest().max(Duration::from_millis(1));
        let most = cadence
            .shortest()
            .saturating_mul(u32::try_from(MAX_CATCH_UP_SLOTS).unwrap_or(u32::MAX));
        self.catch_up = self.idem.lease().saturating_add(self.period).min(most);
        self.cron = Some(cadence);
        self
    }

    #[cfg(feature = "cron")]
    pub(crate) fn revalidated(self) -> Result<Self, ScheduleError> {
        self.validated()
    }

    /// [`ScheduledJob::run`] and [`ScheduledJob::due_slots`] never run or list a slot
    /// before `start`: the slots a legacy scheduler (a cron entry, a job this one
    /// replaces) already ran are not run again when this one is deployed. A slot at
    /// `start` itself runs; [`ScheduledJob::run_slot`] runs the slot it is given.
    ///
    /// ```
    /// # use idem_consumer::ScheduledJob;
    /// # use idem_core::{Idempotency, MemoryStore};
    /// # use std::time::{Duration, SystemTime};
    /// let cutover = SystemTime::now();
    /// let job = ScheduledJob::new(Idempotency::new(MemoryStore::new()), "hourly", Duration::from_secs(3600))?
    ///     .not_before(cutover);
    /// assert!(job.due_slots(cutover + Duration::from_secs(1)).iter().all(|slot| *slot >= cutover));
    /// # Ok::<(), idem_consumer::ScheduleError>(())
    /// ```
    pub fn not_before(mut self, start: SystemTime) -> Self {
        self.not_before = Some(start);
        self
    }

    /// The most a scheduler's clock may run ahead of the true time: [`ScheduledJob::run`]
    /// takes a slot as due only once its own clock is `skew` past it, so that a replica
    /// whose clock runs up to `skew` fast never runs a slot early. Slots are named by
    /// their time, never by the clock, so slow clocks only run a slot late (another
    /// replica runs it first). The default is zero: keep clocks synchronised (NTP) and
    /// set this to what their error can reach.
    pub fn clock_skew(mut self, skew: Duration) -> Self {
        self.skew = skew.min(self.idem.retention() / 4);
        self
    }

    /// What [`ScheduledJob::run`] does with slots that came and went while it was busy
    /// (a run slower than the period) or down. The default runs them all.
    pub fn backlog(mut self, backlog: Backlog) -> Self {
        self.backlog = backlog;
        self
    }

    /// Stops a slot's work that runs longer than `limit` (the store calls around it
    /// always finish): the slot's lease is kept, the slot answers
    /// [`Error::InFlight`] for the rest of it, and [`ScheduledJob::run`] takes it over
    /// when it ends, resuming at its steps. A hung slot then never stops a
    /// single-replica schedule. Zero is no limit (the default).
    pub fn slot_timeout(mut self, limit: Duration) -> Self {
        self.slot_timeout = Some(limit).filter(|limit| !limit.is_zero());
        self
    }

    /// Moves the slots `offset` past each multiple of the period: a daily job at 02:30
    /// UTC is a period of a day and an offset of 2 h 30 min.
    ///
    /// # Errors
    /// [`ScheduleError::Offset`] unless `offset` is whole milliseconds shorter than the
    /// period.
    pub fn offset(mut self, offset: Duration) -> Result<Self, ScheduleError> {
        if offset >= self.period
            || !offset.subsec_nanos().is_multiple_of(1_000_000)
            || self.is_cron()
        {
            return Err(ScheduleError::Offset {
                offset,
                period: self.period,
            });
        }
        self.offset = offset;
        Ok(self)
    }

    /// How far back each tick looks for slots that did not finish. Keep it at least the
    /// longest run plus the lease: shorter, a slot whose scheduler crashed before another
    /// one saw it in flight is never taken over. Zero runs only the current slot.
    ///
    /// # Errors
    /// [`ScheduleError::CatchUpTooLong`] or [`ScheduleError::RetentionTooShort`].
    pub fn catch_up(mut self, window: Duration) -> Result<Self, ScheduleError> {
        self.catch_up = window;
        self.validated()
    }

    fn validated(self) -> Result<Self, ScheduleError> {
        let period_ms = self.shortest_gap().as_millis().max(1);
        if self.catch_up.as_millis() / period_ms > u128::from(MAX_CATCH_UP_SLOTS) {
            return Err(ScheduleError::CatchUpTooLong {
                catch_up: self.catch_up,
                period: self.period,
            });
        }
        let needed = self.catch_up.saturating_add(self.period);
        if self.idem.retention() <= needed {
            return Err(ScheduleError::RetentionTooShort {
                retention: self.idem.retention(),
                needed,
            });
        }
        Ok(self)
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}
