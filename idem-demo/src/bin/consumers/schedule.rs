//! The scheduled job: two schedulers fire "settlement" every 100 ms, one of them is
//! SIGKILLed mid-slot and restarted. With idem ([`ScheduledJob`]) each slot runs once
//! and a killed scheduler's slot is taken over; without, each scheduler runs every slot.

use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_consumer::ScheduledJob;
use idem_core::{Admin, BoxError, Error, Idempotency, Outcome, WorkError};
use idem_sqlite::SqliteStore;
use idem_sqlite::rusqlite::Connection;
use tokio::sync::watch;

use crate::fleet::Fleet;
use crate::ledger::{self, Ledger};
use crate::report::{self, Report};
use crate::worker::LEASE;
use crate::{Mode, Random};

/// The job's name: its keys are `schedule/settlement` and the slot's time.
pub(crate) const JOB: &str = "settlement";
/// A slot every 100 ms.
pub(crate) const PERIOD: Duration = Duration::from_millis(100);
/// Schedulers per mode.
pub(crate) const SCHEDULERS: usize = 2;
/// How long the schedulers run, from the job's first slot.
pub(crate) const RUN: Duration = Duration::from_secs(2);
/// The slot's work before its effect commits (the settlement adds up the day): a kill
/// in it lands mid-slot.
const SLOT_WORK: Duration = Duration::from_millis(40);
/// What the slot does after its effect committed (reporting, say): a kill in it lands
/// between the effect and the end of the work, where only idem's record of the effect,
/// committed with it, keeps a takeover from applying it again.
const AFTER_EFFECT: Duration = Duration::from_millis(40);
/// How far back each tick looks for a slot left unfinished. A killed scheduler's slot is
/// taken over a lease and a tick later, and the kill may land on that takeover too: the
/// window holds several leases, so a loaded machine's slow ticks still find such a slot.
const CATCH_UP: Duration = Duration::from_secs(5);
/// When the schedulers are SIGKILLed, after the first slot.
const KILLS: [Duration; 2] = [Duration::from_millis(500), Duration::from_millis(1000)];

/// A slot's time in ms since the Unix epoch.
fn millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// The first slot at or after `ms`.
fn slot_from(ms: u64) -> u64 {
    let period = PERIOD.as_millis() as u64;
    ms.div_ceil(period) * period
}

/// Sleeps `pause`, or less when the parent says stop.
async fn sleep_unless_stopped(pause: Duration, stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        () = tokio::time::sleep(pause) => {}
        _ = stop.wait_for(|stop| *stop) => {}
    }
}

/// A scheduler process: runs the job from slot `from_ms` until the parent closes its
/// stdin, finishing the tick under way (so no slot is left half-run at the end).
pub(crate) async fn scheduler(mode: Mode, db: &Path, from_ms: u64) -> Result<(), BoxError> {
    let mut stop = report::stop_signal();
    match mode {
        Mode::Protected => protected(db, from_ms, &mut stop).await,
        Mode::Unprotected => unprotected(db, from_ms, &mut stop).await,
    }
}

/// With idem: [`ScheduledJob::run_due`] on each slot (and sooner when a slot another
/// scheduler held may be taken over), the slot's row and its completion in one
/// transaction.
async fn protected(
    db: &Path,
    from_ms: u64,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), BoxError> {
    let store = SqliteStore::builder(db)
        .busy_timeout(ledger::BUSY_TIMEOUT)
        .build()?;
    let ledger = Ledger::open(db, Some(store.clone()))?;
    let idem = Idempotency::builder(store).lease(LEASE).build()?;
    let job = ScheduledJob::new(idem, JOB, PERIOD)?.catch_up(CATCH_UP)?;
    let work = |ctx: idem_core::Context, slot: SystemTime| {
        let ledger = ledger.clone();
        async move {
            let slot_ms = millis(slot);
            // The catch-up window reaches back before the job's first slot: nothing was
            // due then.
            if slot_ms < from_ms {
                return Ok::<u64, WorkError<String>>(slot_ms);
            }
            Report::SlotStarted(slot_ms).send();
            if ctx.resumed() {
                Report::TakenOver.send();
            }
            tokio::time::sleep(SLOT_WORK).await;
            match ledger
                .commit(Some(ctx), move |tx| ledger::run_slot(tx, slot_ms))
                .await
            {
                Ok(Some(slot)) => {
                    tokio::time::sleep(AFTER_EFFECT).await;
                    Report::SlotDone(slot).send();
                    Ok(slot)
                }
                Ok(None) => Err(WorkError::Retryable(
                    "another scheduler took the slot over".to_owned(),
                )),
                Err(err) => Err(WorkError::Retryable(err.to_string())),
            }
        }
    };
    // `ScheduledJob::run` loops for ever; this loop is the same, but stops between ticks.
    while !*stop.borrow() {
        let now = SystemTime::now();
        let mut wake = job.next_slot_after(now);
        for run in job.run_due(now, &work).await {
            match run.answer {
                Ok(Outcome::Completed { .. }) => {}
                // Another scheduler runs it; once its lease ends, a tick takes it over.
                Err(Error::InFlight { retry_after }) => wake = wake.min(now + retry_after),
                other => {
                    Report::Failed(format!("slot {}: {other:?}", millis(run.slot))).send();
                    wake = wake.min(now + PERIOD);
                }
            }
        }
        let pause = wake.duration_since(SystemTime::now()).unwrap_or_default();
        sleep_unless_stopped(pause.max(Duration::from_millis(1)), stop).await;
    }
    Ok(())
}

/// Without idem: every slot, straight; a restarted scheduler starts at the next slot.
async fn unprotected(
    db: &Path,
    from_ms: u64,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), BoxError> {
    let ledger = Ledger::open(db, None)?;
    let mut slot = slot_from(from_ms.max(millis(SystemTime::now())));
    loop {
        let due = UNIX_EPOCH + Duration::from_millis(slot);
        let pause = due.duration_since(SystemTime::now()).unwrap_or_default();
        sleep_unless_stopped(pause, stop).await;
        if *stop.borrow() {
            return Ok(());
        }
        Report::SlotStarted(slot).send();
        tokio::time::sleep(SLOT_WORK).await;
        match ledger
            .commit(None, move |tx| ledger::run_slot(tx, slot))
            .await
        {
            Ok(_) => {
                tokio::time::sleep(AFTER_EFFECT).await;
                Report::SlotDone(slot).send()
            }
            Err(err) => Report::Failed(format!("slot {slot}: {err}")).send(),
        }
        // A late tick skips the slots it missed, as cron does.
        slot = (slot + PERIOD.as_millis() as u64).max(slot_from(millis(SystemTime::now())));
    }
}

/// The schedulers of one mode, and the file their runs are written to.
pub(crate) struct Schedule {
    /// With idem or without.
    pub(crate) mode: Mode,
    /// The scheduler processes.
    pub(crate) fleet: Fleet,
    /// The parent's connection on the file, to audit.
    pub(crate) runs: Connection,
    /// Whether every scheduler stopped on its own when asked.
    pub(crate) stopped_cleanly: bool,
}

/// Runs both modes' schedulers for [`RUN`], SIGKILLs one of each mode mid-slot at each
/// of [`KILLS`], then stops them.
pub(crate) async fn run(dir: &Path, random: &mut Random) -> Result<Vec<Schedule>, BoxError> {
    // The first slot leaves the processes time to start.
    let from_ms = slot_from(millis(SystemTime::now()) + 300);
    let first = UNIX_EPOCH + Duration::from_millis(from_ms);
    let mut schedules = Vec::new();
    for mode in [Mode::Protected, Mode::Unprotected] {
        let db = dir.join(format!("{JOB}-{}.db", mode.code()));
        let runs = ledger::create(&db, mode)?;
        let args: Vec<OsString> = vec![
            "--scheduler".into(),
            "--mode".into(),
            mode.code().into(),
            "--db".into(),
            db.into_os_string(),
            "--from-ms".into(),
            from_ms.to_string().into(),
        ];
        let fleet = Fleet::spawn(format!("schedulers {}", mode.label()), args, SCHEDULERS)?;
        schedules.push(Schedule {
            mode,
            fleet,
            runs,
            stopped_cleanly: false,
        });
    }

    let mut last_kill = Instant::now();
    for after in KILLS {
        let jitter = Duration::from_millis(random.below(PERIOD.as_millis() as u64));
        sleep_until(first + after + jitter).await;
        for schedule in &mut schedules {
            // Wait for a scheduler in the middle of a slot's work, then kill it there.
            let waited = Instant::now();
            loop {
                let busy = schedule.fleet.busy();
                if !busy.is_empty() {
                    let victim = busy[random.below(busy.len() as u64) as usize];
                    schedule.fleet.kill(victim)?;
                    last_kill = Instant::now();
                    break;
                }
                if waited.elapsed() > 4 * PERIOD {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }
    // Past the last kill's lease, its slot is either taken over or in progress with its
    // lease ended: stop only once no slot waits for a takeover (bounded; the audit
    // judges what is left).
    let lease_ended = SystemTime::now() + (LEASE + PERIOD).saturating_sub(last_kill.elapsed());
    sleep_until((first + RUN).max(lease_ended)).await;
    let store = SqliteStore::open(dir.join(format!("{JOB}-{}.db", Mode::Protected.code())))
        .map_err(|err| format!("cannot open the job's idem records: {err}"))?;
    let give_up = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = store
            .stats(0)
            .await
            .map_err(|err| format!("cannot count the job's idem records: {err}"))?;
        if stats.in_progress_lease_ended == 0 || Instant::now() >= give_up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for schedule in &mut schedules {
        let fleet = &mut schedule.fleet;
        schedule.stopped_cleanly =
            tokio::task::block_in_place(|| fleet.stop(Duration::from_secs(3)))?;
    }
    Ok(schedules)
}

/// Sleeps until the wall clock reads `at` (slots are wall-clock times).
async fn sleep_until(at: SystemTime) {
    if let Ok(pause) = at.duration_since(SystemTime::now()) {
        tokio::time::sleep(pause).await;
    }
}
