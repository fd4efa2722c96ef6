//! [`ScheduledJob`]: a job run once per slot of its schedule, however many schedulers
//! fire it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[cfg(feature = "cron")]
use std::sync::Arc;

use idem_core::codec::CodecError;
use idem_core::{Context, Error, Fingerprint, Idempotency, Key, Outcome, Store, WorkError};
use serde::Serialize;
use serde::de::DeserializeOwned;

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
    fn shortest_gap(&self) -> Duration {
        #[cfg(feature = "cron")]
        if let Some(cron) = &self.cron {
            return cron.shortest();
        }
        self.period
    }

    fn is_cron(&self) -> bool {
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

    fn fingerprint(&self) -> Fingerprint {
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

    /// Runs `work` for `slot` (rounded down to a slot), once across every scheduler.
    ///
    /// - Not run before: claims the slot, runs `work`, stores its answer.
    /// - Finished before: the stored answer, `replayed`; `work` does not run.
    /// - Another scheduler runs it: [`Error::InFlight`] (or a wait, with
    ///   [`InFlightPolicy::Wait`](idem_core::InFlightPolicy::Wait) on the driver).
    /// - Its scheduler crashed and the lease ended: taken over, resuming through its
    ///   steps.
    ///
    /// # Errors
    /// As [`Idempotency::execute`].
    pub async fn run_slot<T, E, F, Fut>(
        &self,
        slot: SystemTime,
        work: F,
    ) -> Result<Outcome<T, E>, Error>
    where
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: FnOnce(Context, SystemTime) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let slot = self.slot_at(slot);
        let deadline = crate::deadline::WorkDeadline::default();
        let key = self.key_of(slot);
        let run = self.idem.execute(&key, self.fingerprint(), |ctx| {
            deadline.wrap(work(ctx, slot))
        });
        tokio::select! {
            biased;
            answer = run => answer,
            limit = deadline.expired(self.slot_timeout) => {
                // `execute` dropped mid-work: the slot's lease is kept, so it is in
                // flight until the lease ends, then taken over.
                tracing::warn!(job = %self.name, key = %self.key_of(slot).short_hash(), ?limit, "idem-consumer: stopped a slot's work past its timeout; it is taken over once its lease ends");
                Err(Error::InFlight {
                    retry_after: self.idem.lease(),
                })
            }
        }
    }

    /// Runs every slot due at `now` ([`ScheduledJob::due_slots`]), oldest first.
    pub async fn run_due<T, E, F, Fut>(&self, now: SystemTime, work: &F) -> Vec<SlotRun<T, E>>
    where
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: Fn(Context, SystemTime) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let mut runs = Vec::new();
        for slot in self.due_slots(now) {
            let answer = self.run_slot(slot, work).await;
            runs.push(SlotRun { slot, answer });
        }
        runs
    }

    /// Runs the job for ever: a tick at each slot, and sooner when a slot another
    /// scheduler held may be taken over, or a retryable failure may run again. Abort the
    /// task to stop it: a slot cut off mid-work is taken over when its lease ends.
    ///
    /// - Every slot due since the previous tick is asked, however long that tick's work
    ///   took, besides the catch-up window: those within half the retention, at most
    ///   2 × [`MAX_CATCH_UP_SLOTS`] of them.
    /// - Slots with a final answer are remembered and not asked again while in the window.
    /// - Slots seen unfinished (in flight elsewhere, retryable, unknown, a store that
    ///   failed) are asked again until they finish, even after leaving the window, for at
    ///   most half the retention since they were last seen unfinished: a record finished
    ///   after that sighting is kept a whole retention, so asking again never runs a slot
    ///   twice (at most [`MAX_CATCH_UP_SLOTS`] of them).
    /// - Final answers: a result or failure, now or before; a mismatch (schedulers
    ///   disagreeing on the schedule), a refused key, an unstorable result, a stored
    ///   answer altered or malformed. Anything else is asked again.
    /// - Each slot's run and each final failure is logged once, by the key's short hash.
    pub async fn run<T, E, F, Fut>(&self, work: F) -> std::convert::Infallible
    where
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: Fn(Context, SystemTime) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let mut finished = BTreeSet::new();
        // Each unfinished slot, with when it was last seen unfinished.
        let mut unfinished: BTreeMap<SystemTime, SystemTime> = BTreeMap::new();
        let mut next_due: Option<SystemTime> = None;
        let forget_after = self.idem.retention() / 2;
        let mut retries: BTreeMap<SystemTime, u32> = BTreeMap::new();
        loop {
            // A clock up to `skew` fast takes a slot as due no earlier than its time.
            let now = self.now();
            let current = self.slot_at(now);
            let mut slots: BTreeSet<SystemTime> = self.due_slots(now).into_iter().collect();
            // Slots that came and went while the last tick's work ran.
            let oldest_safe = now.checked_sub(forget_after).unwrap_or(UNIX_EPOCH);
            let mut slot = self.slot_at(next_due.unwrap_or(current).max(oldest_safe));
            if slot < next_due.unwrap_or(current).max(oldest_safe) {
                slot = self.next_slot_after(slot);
            }
            while slot <= current && (slots.len() as u64) < 2 * MAX_CATCH_UP_SLOTS {
                slots.insert(slot);
                let next = self.next_slot_after(slot);
                if next <= slot {
                    break;
                }
                slot = next;
            }
            next_due = Some(self.next_slot_after(current));
            if let Some(start) = self.not_before {
                slots.retain(|slot| *slot >= start);
            }
            self.trim_backlog(now, &mut slots, &finished, &unfinished);
            slots.extend(unfinished.keys().copied());
            let mut wake = self.next_slot_after(now);
            for slot in slots {
                if finished.contains(&slot) {
                    continue;
                }
                // Checked now, not at the tick's start: this tick's earlier work may have
                // run long. A slot finished at or after its time is kept a retention from
                // then, so it is asked only while that retention (less a period, for
                // rounding) cannot have run out, and a remembered one only within half the
                // retention of the last answer that showed it unfinished.
                // The real clock: the skew only decides when a slot is due.
                let asked_at = SystemTime::now() + self.skew;
                let record_may_be_gone = asked_at + self.period >= slot + self.idem.retention();
                let stale = unfinished.get(&slot).is_some_and(|seen| {
                    asked_at.duration_since(*seen).unwrap_or_default() >= forget_after
                });
                if record_may_be_gone || stale {
                    if unfinished.remove(&slot).is_some() {
                        tracing::warn!(job = %self.name, key = %self.key_of(slot).short_hash(), "idem-consumer: a slot stayed unfinished too long; no longer looking at it");
                    }
                    continue;
                }
                let answer = self.run_slot(slot, &work).await;
                let retried = matches!(answer, Ok(Outcome::Retryable(_)));
                let tries = if retried {
                    let tries = retries.entry(slot).or_default();
                    *tries = tries.saturating_add(1);
                    *tries
                } else {
                    retries.remove(&slot);
                    0
                };
                match self.again_after(slot, &answer, tries) {
                    Some(after) => {
                        // Only an answer that shows the record unfinished restarts the
                        // clock; a store failure or an unreadable record shows nothing.
                        if shows_unfinished(&answer) {
                            unfinished.insert(slot, SystemTime::now());
                        } else {
                            unfinished.entry(slot).or_insert_with(SystemTime::now);
                        }
                        wake = wake.min(now + after.max(Duration::from_millis(1)));
                    }
                    None => {
                        unfinished.remove(&slot);
                        finished.insert(slot);
                    }
                }
            }
            // What left the window is never asked again: forget it.
            let earliest = self.due_slots(now).first().copied().unwrap_or(now);
            finished.retain(|slot| *slot >= earliest);
            retries.retain(|slot, _| unfinished.contains_key(slot));
            let checked = SystemTime::now();
            unfinished.retain(|slot, seen| {
                let keep = checked.duration_since(*seen).unwrap_or_default() < forget_after;
                if !keep {
                    tracing::warn!(job = %self.name, key = %self.key_of(*slot).short_hash(), "idem-consumer: a slot stayed unfinished for half the retention; no longer looking at it");
                }
                keep
            });
            while unfinished.len() as u64 > MAX_CATCH_UP_SLOTS {
                let (oldest, _) = unfinished.pop_first().expect("the map is not empty");
                tracing::warn!(job = %self.name, key = %self.key_of(oldest).short_hash(), "idem-consumer: too many unfinished slots; no longer looking at the oldest");
            }
            let pause = wake.duration_since(self.now()).unwrap_or_default();
            tokio::time::sleep(pause.max(Duration::from_millis(1))).await;
        }
    }

    /// The scheduler's clock, less the tolerated skew.
    fn now(&self) -> SystemTime {
        let now = SystemTime::now();
        now.checked_sub(self.skew).unwrap_or(now)
    }

    /// The wait before a slot's `tries`th retryable failure runs again: from the shorter
    /// of the period and a second, doubling, at most the longer of the period and a
    /// minute, jittered to between half and all of it so that replicas do not retry in
    /// step.
    fn retry_delay(&self, slot: SystemTime, tries: u32) -> Duration {
        let first = self.shortest_gap().min(Duration::from_secs(1));
        let most = self.period.max(Duration::from_secs(60));
        let delay = first
            .checked_mul(1 << tries.saturating_sub(1).min(20))
            .unwrap_or(most)
            .min(most);
        // Jitter from the clock's low bits and the slot: no generator to seed or share.
        let noise = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos()
            ^ (slot
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis() as u32)
                .rotate_left(tries);
        let fraction = 0.5 + f64::from(noise % 1000) / 2000.0;
        delay.mul_f64(fraction).max(Duration::from_millis(1))
    }

    /// Drops the oldest slots that came and went beyond what [`Backlog`] runs.
    fn trim_backlog(
        &self,
        now: SystemTime,
        slots: &mut BTreeSet<SystemTime>,
        finished: &BTreeSet<SystemTime>,
        unfinished: &BTreeMap<SystemTime, SystemTime>,
    ) {
        let Backlog::Latest(keep) = self.backlog else {
            return;
        };
        // The catch-up window's slots stay: one of them may be a crashed scheduler's,
        // waiting to be taken over.
        let window = self.due_slots(now).first().copied().unwrap_or(now);
        let fresh = |slot: &&SystemTime| !finished.contains(slot) && !unfinished.contains_key(slot);
        // The window's slots count toward `keep`, and are never dropped.
        let in_window = slots
            .iter()
            .filter(fresh)
            .filter(|slot| **slot >= window)
            .count();
        let older: Vec<SystemTime> = slots
            .iter()
            .filter(fresh)
            .filter(|slot| **slot < window)
            .copied()
            .collect();
        let keep = keep.get().saturating_sub(in_window);
        let skipped = older.len().saturating_sub(keep);
        if skipped == 0 {
            return;
        }
        for slot in &older[..skipped] {
            slots.remove(slot);
        }
        tracing::warn!(job = %self.name, skipped, "idem-consumer: skipping slots that came and went, as the backlog setting says");
    }

    /// `None` when `answer` is final for `slot` (logged once here), else how soon to ask
    /// again.
    fn again_after<T, E>(
        &self,
        slot: SystemTime,
        answer: &Result<Outcome<T, E>, Error>,
        tries: u32,
    ) -> Option<Duration> {
        let key = self.key_of(slot).short_hash();
        match answer {
            Ok(Outcome::Completed { replayed, .. }) => {
                if !replayed {
                    tracing::info!(job = %self.name, %key, "idem-consumer: slot ran");
                }
                None
            }
            Ok(Outcome::Failed { replayed, .. }) | Ok(Outcome::Compensated { replayed, .. }) => {
                if !replayed {
                    tracing::warn!(job = %self.name, %key, "idem-consumer: slot failed for good");
                }
                None
            }
            Ok(Outcome::Retryable(_)) => Some(self.retry_delay(slot, tries)),
            Ok(Outcome::Unknown(_)) => Some(self.idem.lease()),
            Ok(_) => Some(self.idem.lease()),
            Err(Error::InFlight { retry_after }) => Some(*retry_after),
            // Answers no retry can change.
            Err(
                err @ (Error::Mismatch
                | Error::KeyRefused(_)
                | Error::Unstorable { .. }
                | Error::Codec {
                    source: CodecError::Unauthentic { .. } | CodecError::Malformed { .. },
                    ..
                }),
            ) => {
                tracing::warn!(job = %self.name, %key, error = %err, "idem-consumer: slot cannot run");
                None
            }
            Err(err) if err.is_retryable() || matches!(err, Error::Store(_)) => {
                Some(Duration::from_secs(1))
            }
            // Our own side (a codec key this process lacks, a newer stored type, an
            // interruption): another look once the lease ends.
            Err(err) => {
                tracing::warn!(job = %self.name, %key, error = %err, "idem-consumer: slot not run yet; asking again after the lease");
                Some(self.idem.lease())
            }
        }
    }
}

/// Whether `answer` shows the slot's record unfinished (held, released, in flight), as
/// opposed to showing nothing about it (a store failure, a record this process cannot read).
fn shows_unfinished<T, E>(answer: &Result<Outcome<T, E>, Error>) -> bool {
    matches!(
        answer,
        Ok(Outcome::Retryable(_) | Outcome::Unknown(_))
            | Err(Error::InFlight { .. }
                | Error::LeaseLost
                | Error::CompensationPending { .. }
                | Error::KeyBudgetExhausted { .. })
    )
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
    fn retries_back_off_with_jitter_within_their_bounds() {
        let idem = Idempotency::new(idem_core::MemoryStore::new());
        let job = ScheduledJob::new(idem, "job", Duration::from_secs(10)).unwrap();
        let slot = UNIX_EPOCH + Duration::from_secs(1_796_162_400);
        for tries in 1..=40u32 {
            let full = Duration::from_secs(1)
                .checked_mul(1 << (tries - 1).min(20))
                .unwrap()
                .min(Duration::from_secs(60));
            let delay = job.retry_delay(slot, tries);
            assert!(
                delay >= full / 2 && delay <= full,
                "try {tries}: {delay:?} of {full:?}"
            );
        }
    }

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
