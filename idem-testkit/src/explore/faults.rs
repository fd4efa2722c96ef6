//! Faults, the points where they strike, and the store handle each simulated process
//! calls through: every call of a process is numbered (its fault point), and the plan of
//! a run says which fault, if any, strikes at which.

use std::collections::HashMap;
use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Clock, Key, Record, Store, StoreError, Timestamp, key::StepName, record::Lease,
    store::ClaimOutcome, store::ClaimRequest, store::Completion, store::Expiry, store::Operation,
    store::RenewOutcome, store::WriteOutcome,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::Timing;
use super::clock::{ProcessClock, VirtualClock, off_the_clock};
use super::ledger::{Effect, Event, Ledger, held_until};
use super::target::ProcessFactory;

/// One simulated process of a run: each has its own store handle and its own
/// `Idempotency` (same settings), over the one store under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Process {
    /// The first caller (`p1`).
    First,
    /// A second caller racing the first, in the scenario with a waiting duplicate (`dup`).
    Duplicate,
    /// The nth retry (from 1) after the first callers ended, each a new process (`r1` ...).
    Retry(u32),
    /// The retry after a result, which must replay it (`check`). Never faulted.
    Check,
    /// A client's retry that arrives while an earlier process is still alive but cut off
    /// (paused or partitioned), once that process's lease has run out by the store's
    /// clock: the owner that comes back finds the key taken over (`racer`).
    Racer,
}

impl Process {
    /// The seed of this process's driver jitter: one per process, fixed across runs.
    pub(crate) fn seed(self) -> u64 {
        match self {
            Process::First => 1,
            Process::Duplicate => 2,
            Process::Check => 3,
            Process::Racer => 4,
            Process::Retry(n) => 100 + u64::from(n),
        }
    }
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Process::First => f.write_str("p1"),
            Process::Duplicate => f.write_str("dup"),
            Process::Retry(n) => write!(f, "r{n}"),
            Process::Check => f.write_str("check"),
            Process::Racer => f.write_str("racer"),
        }
    }
}

/// Where in a process a fault strikes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Site {
    /// The process's store call number `index` (from 0), whichever of its tasks made it
    /// (the execution, a heartbeat, a write the driver spawned).
    Call {
        /// The call's number within the process.
        index: u32,
        /// What the call was in the run that found the point (the same number may be
        /// another call in a run with other faults).
        operation: Operation,
    },
    /// The work reached the await point `name` for the `occurrence`th time (from 0).
    Point {
        /// The point's name, such as `debit:effect-done` or `undo-debit:start`.
        name: String,
        /// How many times the process reached it before.
        occurrence: u32,
    },
}

/// A fault point: a process and a site in it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FaultPoint {
    /// The process.
    pub process: Process,
    /// The site.
    pub site: Site,
}

impl FaultPoint {
    /// True when `other` is the same place: the same process and call number (whatever
    /// operation it was), or the same await point and occurrence.
    pub fn same_place(&self, other: &FaultPoint) -> bool {
        self.process == other.process
            && match (&self.site, &other.site) {
                (Site::Call { index: a, .. }, Site::Call { index: b, .. }) => a == b,
                (a @ Site::Point { .. }, b @ Site::Point { .. }) => a == b,
                _ => false,
            }
    }
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.site {
            Site::Call { index, operation } => {
                write!(f, "{} call #{index} ({operation})", self.process)
            }
            Site::Point { name, occurrence } => {
                write!(f, "{} at `{name}`", self.process)?;
                if *occurrence > 0 {
                    write!(f, " (time {})", occurrence + 1)?;
                }
                Ok(())
            }
        }
    }
}

/// What goes wrong at a fault point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// The call fails (`StoreError::Unavailable`) before it reaches the store.
    ErrorBefore,
    /// The call applies, then its answer is lost (`StoreError::Unavailable`).
    LostAnswer,
    /// The call hangs for [`Timing::hang`], far past the store timeout, then applies
    /// (a request stuck in the network that lands late), whether or not anyone still waits.
    HangThenApply,
    /// The call hangs for [`Timing::hang`], then fails without applying.
    HangNoApply,
    /// The caller goes away: its `execute` future is dropped while this call is pending,
    /// before it applied. The call still applies if the task that made it survives.
    DropBefore,
    /// The call applies, then the caller's `execute` future is dropped.
    DropAfter,
    /// The process crashes at this call, before it applies: the call and every later
    /// call of the process never reach the store, and its futures are dropped.
    CrashBefore,
    /// The call applies, then the process crashes.
    CrashAfter,
    /// The caller's `execute` future is dropped while the work waits at this point.
    DropAtPoint,
    /// The process crashes while the work waits at this point.
    CrashAtPoint,
    /// The work stalls at this point for [`Timing::stall`] (two leases), then goes on:
    /// heartbeats must keep the lease.
    StallAtPoint,
    /// The whole process pauses here for [`Timing::stall`] (a stop-the-world pause, a
    /// suspended VM): its work waits, and every store call any of its tasks starts
    /// meanwhile (heartbeats included) leaves only once it resumes. Its timers run on (a
    /// call waiting out the pause may time out first), as a real process's fire at once
    /// when it resumes; a call already on its way when the pause began lands. A
    /// [`Process::Racer`] retries once the lease has run out; the process then goes on and
    /// must start no new effect under the lease it lost.
    PauseAtPoint,
    /// From this point of the work on, for [`Timing::stall`], every store call of the
    /// process fails before it reaches the store (a network partition of that process
    /// alone), while its work goes on; a [`Process::Racer`] retries once the lease has run
    /// out (as the store last granted or renewed it). The owner must stop by its own clock.
    PartitionAtPoint,
    /// This call and every store call of the process for [`Timing::stall`] fail before
    /// they reach the store; a [`Process::Racer`] retries as for
    /// [`Fault::PartitionAtPoint`].
    PartitionAtCall,
    /// The call applies, and a copy of it (a request delivered twice) applies again once
    /// the process's `execute` has ended: after its release or its result, while whatever
    /// else runs (the duplicate, the racer, a write of the process still in flight) goes
    /// on. The work's own commit (its transaction) is never copied.
    DuplicatedLate,
    /// The call applies, and a copy of it applies again just after the store next grants
    /// the key to another process, before that owner hears of its grant: a stale write
    /// meeting a live owner's record. A copy that meets no such grant lands before the run's
    /// last retry, as do copies sent after their process's `execute` ended.
    DuplicatedAfterTakeover,
}

impl Fault {
    /// Every fault that strikes at a store call.
    pub const AT_CALLS: [Fault; 11] = [
        Fault::ErrorBefore,
        Fault::LostAnswer,
        Fault::HangThenApply,
        Fault::HangNoApply,
        Fault::DropBefore,
        Fault::DropAfter,
        Fault::CrashBefore,
        Fault::CrashAfter,
        Fault::PartitionAtCall,
        Fault::DuplicatedLate,
        Fault::DuplicatedAfterTakeover,
    ];

    /// Every fault that strikes at an await point of the work.
    pub const AT_POINTS: [Fault; 5] = [
        Fault::DropAtPoint,
        Fault::CrashAtPoint,
        Fault::StallAtPoint,
        Fault::PauseAtPoint,
        Fault::PartitionAtPoint,
    ];

    /// True for the faults that cut a live process off (a pause, a partition), after
    /// which a [`Process::Racer`] retries beside it.
    pub fn cuts_off(self) -> bool {
        matches!(
            self,
            Fault::PauseAtPoint | Fault::PartitionAtPoint | Fault::PartitionAtCall
        )
    }

    /// The faults that can strike at `site`.
    pub fn for_site(site: &Site) -> &'static [Fault] {
        match site {
            Site::Call { .. } => &Self::AT_CALLS,
            Site::Point { .. } => &Self::AT_POINTS,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fault::ErrorBefore => "fails before it applies",
            Fault::LostAnswer => "applies, its answer lost",
            Fault::HangThenApply => "hangs past the store timeout, then applies",
            Fault::HangNoApply => "hangs past the store timeout, never applies",
            Fault::DropBefore => "the caller drops execute before it applies",
            Fault::DropAfter => "the caller drops execute after it applies",
            Fault::CrashBefore => "the process crashes before it applies",
            Fault::CrashAfter => "the process crashes after it applies",
            Fault::DropAtPoint => "the caller drops execute here",
            Fault::CrashAtPoint => "the process crashes here",
            Fault::StallAtPoint => "the work stalls here for two leases",
            Fault::PauseAtPoint => "the whole process pauses here for two leases",
            Fault::PartitionAtPoint => "from here the process is cut off for two leases",
            Fault::PartitionAtCall => {
                "from this call the process is cut off for two leases, never applies"
            }
            Fault::DuplicatedLate => "applies, and a copy applies again once the process ended",
            Fault::DuplicatedAfterTakeover => {
                "applies, and a copy applies again just after the key is granted to another"
            }
        })
    }
}

/// A fault at a point: one entry of a run's plan.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PlacedFault {
    /// Where.
    pub point: FaultPoint,
    /// What.
    pub fault: Fault,
}

impl fmt::Display for PlacedFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.point, self.fault)
    }
}

/// The error an injected store fault answers with, as the source of `Unavailable`.
#[derive(Debug, thiserror::Error)]
#[error("a fault injected by the explorer")]
pub(crate) struct Injected;

fn injected(operation: Operation) -> StoreError {
    StoreError::Unavailable {
        operation,
        source: Box::new(Injected),
    }
}

/// How a process is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kill {
    Drop,
    Crash,
}

/// A request to the process's supervisor to drop its `execute`; answered once the future
/// is gone.
pub(crate) struct KillRequest {
    pub(crate) kill: Kill,
    pub(crate) done: oneshot::Sender<()>,
}

#[derive(Default)]
struct ProcessState {
    calls: u32,
    points: HashMap<String, u32>,
    crashed: bool,
    supervisor: Option<mpsc::UnboundedSender<KillRequest>>,
    /// Paused until then: its store calls wait.
    paused_until: Option<Instant>,
    /// Cut off until then: its store calls fail.
    partitioned_until: Option<Instant>,
}

/// A copy of a store call, kept to land again later.
pub(crate) struct Copy {
    /// The process that sent the call.
    pub(crate) from: Process,
    /// Lands just after the key is next granted to another process (else once `from`'s
    /// `execute` ended).
    pub(crate) after_grant: bool,
    land: Box<dyn FnOnce(Arc<World>) -> BoxFuture<()> + Send>,
}

/// A store call, made again for each copy of it that lands.
type Apply<O> = Arc<dyn Fn(Arc<dyn Store>) -> BoxFuture<Result<O, StoreError>> + Send + Sync>;
type Observe<O> = Arc<dyn Fn(&O) -> Vec<Event> + Send + Sync>;
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Everything one run shares: the store under test, the plan, the ledger, and each
/// process's counters.
pub(crate) struct World {
    pub(crate) inner: Arc<dyn Store>,
    pub(crate) plan: Vec<PlacedFault>,
    pub(crate) ledger: Ledger,
    pub(crate) timing: Timing,
    /// Tokio's time is paused (the store is on a virtual clock).
    pub(crate) paused: bool,
    /// The run's clock: the store's (virtual), or this machine's beside a server.
    clock: Arc<dyn Clock>,
    /// For a target with a clock per process: what makes each process's store handle,
    /// and the run's clock its clock is skewed from.
    per_process: Option<(ProcessFactory, VirtualClock)>,
    /// Each process's store handle, made at its first call.
    handles: tokio::sync::Mutex<HashMap<Process, Arc<dyn Store>>>,
    /// The retryable scenario's first run answered `Retryable` (shared by all processes,
    /// as a downstream system's state would be).
    pub(crate) retryable_returned: AtomicBool,
    /// The undo that answers `Retryable` once did so (shared, likewise).
    pub(crate) undo_retried: AtomicBool,
    processes: Mutex<HashMap<Process, ProcessState>>,
    /// Copies of calls still to land.
    copies: Mutex<Vec<Copy>>,
    over: watch::Sender<bool>,
    /// When the racer retries, once a pause or a partition asked for it.
    racer: watch::Sender<Option<Instant>>,
    /// The tasks of crashed processes, parked until the run ends (with how many waits
    /// each): the only tasks allowed to outlive every process.
    parked: Mutex<HashMap<tokio::task::Id, usize>>,
}

impl World {
    pub(crate) fn new(
        inner: Arc<dyn Store>,
        per_process: Option<(ProcessFactory, VirtualClock)>,
        plan: Vec<PlacedFault>,
        timing: Timing,
        paused: bool,
        clock: Arc<dyn Clock>,
    ) -> Arc<Self> {
        Arc::new(Self {
            clock,
            per_process,
            handles: tokio::sync::Mutex::new(HashMap::new()),
            inner,
            plan,
            ledger: Ledger::default(),
            timing,
            paused,
            retryable_returned: AtomicBool::new(false),
            undo_retried: AtomicBool::new(false),
            processes: Mutex::new(HashMap::new()),
            copies: Mutex::new(Vec::new()),
            over: watch::Sender::new(false),
            racer: watch::Sender::new(None),
            parked: Mutex::new(HashMap::new()),
        })
    }

    /// Now, on the run's clock.
    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// `process`'s clock, when processes have clocks of their own.
    fn clock_of(&self, process: Process) -> Option<ProcessClock> {
        let (_, base) = self.per_process.as_ref()?;
        let (ahead, by) = match process {
            Process::First => (false, self.timing.skew),
            // The final check reads the run's own store, on the exact clock.
            Process::Check => return None,
            _ => (true, self.timing.skew),
        };
        Some(ProcessClock::new(base.clone(), ahead, by))
    }

    /// Now, on `process`'s clock: comparable with the leases the store grants it.
    pub(crate) fn now_of(&self, process: Process) -> Timestamp {
        self.clock_of(process)
            .map_or_else(|| self.now(), |clock| clock.now())
    }

    /// The store as `process` reaches it: its own handle (made at its first call) where
    /// processes have clocks of their own, else the one store.
    async fn store_of(
        &self,
        process: Process,
        operation: Operation,
    ) -> Result<Arc<dyn Store>, StoreError> {
        let (Some((make, _)), Some(clock)) = (&self.per_process, self.clock_of(process)) else {
            return Ok(Arc::clone(&self.inner));
        };
        let mut handles = self.handles.lock().await;
        if let Some(store) = handles.get(&process) {
            return Ok(Arc::clone(store));
        }
        let store = make(clock)
            .await
            .map_err(|source| StoreError::Unavailable { operation, source })?;
        handles.insert(process, Arc::clone(&store));
        Ok(store)
    }

    /// Cuts `process` off from now for [`Timing::stall`]: paused (its calls wait) or
    /// partitioned (its calls fail), and asks for the racer to retry once the lease the
    /// process holds has run out (as the store last granted or renewed it). Answers when the cut ends.
    pub(crate) fn cut_off(&self, process: Process, fault: Fault) -> Instant {
        let until = Instant::now() + self.timing.stall;
        {
            let mut processes = self.processes();
            let state = processes.entry(process).or_default();
            if fault == Fault::PauseAtPoint {
                state.paused_until = Some(until);
            } else {
                state.partitioned_until = Some(until);
            }
        }
        self.ledger.push(Event::CutOff {
            process,
            paused: fault == Fault::PauseAtPoint,
        });
        // A quarter lease after the lease the store last granted or renewed it ended: the
        // store has let it go by then, unless a renewal still on its way lands.
        let left =
            held_until(&self.ledger.snapshot(), process).map_or(self.timing.lease, |until| {
                Duration::from_millis(
                    until
                        .as_unix_millis()
                        .saturating_sub(self.now_of(process).as_unix_millis()),
                )
            });
        let at = Instant::now() + left + self.timing.lease / 4;
        self.racer.send_if_modified(|racer| {
            let first = racer.is_none();
            if first {
                *racer = Some(at);
            }
            first
        });
        until
    }

    /// Keeps a copy of a call to land later.
    fn keep_copy<O: Send + 'static>(
        &self,
        from: Process,
        operation: Operation,
        after_grant: bool,
        apply: Apply<O>,
        observe: Observe<O>,
    ) {
        let land = Box::new(move |world: Arc<World>| -> BoxFuture<()> {
            Box::pin(async move {
                let result = match world.store_of(from, operation).await {
                    Ok(store) => off_the_clock(world.paused, apply(store)).await,
                    Err(err) => Err(err),
                };
                if let Ok(outcome) = result {
                    for event in observe(&outcome) {
                        world.ledger.push(event);
                    }
                }
            })
        });
        self.copies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Copy {
                from,
                after_grant,
                land,
            });
    }

    /// Lands, in the order they were sent, the copies `pick` chooses.
    pub(crate) async fn land_copies(self: &Arc<Self>, pick: impl Fn(&Copy) -> bool) {
        let picked: Vec<Copy> = {
            let mut copies = self.copies.lock().unwrap_or_else(PoisonError::into_inner);
            let (picked, kept) = copies.drain(..).partition(|copy| pick(copy));
            *copies = kept;
            picked
        };
        for copy in picked {
            (copy.land)(Arc::clone(self)).await;
        }
    }

    /// When the racer must retry: waits until a cut asks for it.
    pub(crate) async fn racer_wanted(&self) -> Instant {
        let mut racer = self.racer.subscribe();
        loop {
            if let Some(at) = *racer.borrow_and_update() {
                return at;
            }
            if racer.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// True once a cut asked for the racer.
    pub(crate) fn racer_asked(&self) -> bool {
        self.racer.borrow().is_some()
    }

    /// Until when `process` is paused, or partitioned, now.
    fn cut(&self, process: Process) -> (Option<Instant>, bool) {
        let now = Instant::now();
        let processes = self.processes();
        let Some(state) = processes.get(&process) else {
            return (None, false);
        };
        (
            state.paused_until.filter(|until| *until > now),
            state.partitioned_until.is_some_and(|until| until > now),
        )
    }

    fn processes(&self) -> MutexGuard<'_, HashMap<Process, ProcessState>> {
        self.processes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Routes `process`'s kill requests to its supervisor, or nowhere (`None`: the
    /// supervisor is done, and a late request is answered at once).
    pub(crate) fn supervise(
        &self,
        process: Process,
        supervisor: Option<mpsc::UnboundedSender<KillRequest>>,
    ) {
        self.processes().entry(process).or_default().supervisor = supervisor;
    }

    pub(crate) fn crashed(&self, process: Process) -> bool {
        self.processes()
            .get(&process)
            .is_some_and(|state| state.crashed)
    }

    /// The run is over: everything still waiting on a dead process gives up, and the
    /// ledger stops counting.
    pub(crate) fn end(&self) {
        self.ledger.close();
        self.over.send_replace(true);
    }

    /// Waits until the run is over: a dead process's calls and effects never happen.
    pub(crate) async fn dead(&self) {
        let mut parked = Parked {
            world: self,
            task: None,
        };
        let mut over = self.over.subscribe();
        let mut wait = pin!(over.wait_for(|over| *over));
        // Counted under the task polling it now: a future polled once by its caller and
        // then moved to a task of its own (the driver's durable writes) moves with it.
        poll_fn(|cx| {
            parked.under(tokio::task::try_id());
            wait.as_mut().poll(cx).map(drop)
        })
        .await;
    }

    /// How many tasks wait in [`World::dead`].
    pub(crate) fn parked_tasks(&self) -> usize {
        self.parked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// The planned fault at `point`, recording that the point was reached.
    fn strike(&self, point: FaultPoint) -> Option<Fault> {
        let fault = self
            .plan
            .iter()
            .find(|planned| planned.point.same_place(&point))
            .map(|planned| planned.fault);
        if let Some(fault) = fault {
            self.ledger.push(Event::Faulted(PlacedFault {
                point: point.clone(),
                fault,
            }));
        }
        self.ledger.push(Event::Reached(point));
        fault
    }

    /// Numbers `process`'s next store call and finds its fault.
    fn next_call(&self, process: Process, operation: Operation) -> Option<Fault> {
        let index = {
            let mut processes = self.processes();
            let state = processes.entry(process).or_default();
            state.calls += 1;
            state.calls - 1
        };
        self.strike(FaultPoint {
            process,
            site: Site::Call { index, operation },
        })
    }

    /// Counts `process`'s arrival at the await point `name` and finds its fault.
    pub(crate) fn next_point(&self, process: Process, name: &str) -> Option<Fault> {
        let occurrence = {
            let mut processes = self.processes();
            let state = processes.entry(process).or_default();
            let seen = state.points.entry(name.to_owned()).or_default();
            *seen += 1;
            *seen - 1
        };
        self.strike(FaultPoint {
            process,
            site: Site::Point {
                name: name.to_owned(),
                occurrence,
            },
        })
    }

    /// Stops `process`: a crash first kills its store handle, so nothing it still runs
    /// reaches the store; then its supervisor drops its `execute`. Returns once the future
    /// is gone (at once when it already ended).
    pub(crate) async fn kill(&self, process: Process, kill: Kill) {
        let supervisor = {
            let mut processes = self.processes();
            let state = processes.entry(process).or_default();
            if kill == Kill::Crash {
                state.crashed = true;
            }
            state.supervisor.clone()
        };
        if let Some(supervisor) = supervisor {
            let (done, gone) = oneshot::channel();
            if supervisor.send(KillRequest { kill, done }).is_ok() {
                let _ = gone.await;
            }
        }
    }

    /// Applies a call to the store in a task of its own, so that what the store answered
    /// is recorded even when the caller stops waiting (a request once sent lands).
    async fn apply<O: Send + 'static>(
        self: &Arc<Self>,
        process: Process,
        operation: Operation,
        delay: Option<Duration>,
        apply: Apply<O>,
        observe: Observe<O>,
    ) -> Result<O, StoreError> {
        let world = Arc::clone(self);
        let task = tokio::spawn(async move {
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            let result = match world.store_of(process, operation).await {
                Ok(store) => off_the_clock(world.paused, apply(store)).await,
                Err(err) => Err(err),
            };
            if let Ok(outcome) = &result {
                let events = observe(outcome);
                let granted = events.iter().find_map(|event| match event {
                    Event::Claimed { process, .. } => Some(*process),
                    _ => None,
                });
                for event in events {
                    world.ledger.push(event);
                }
                if let Some(owner) = granted {
                    // Before the new owner hears of its grant: the copy meets its record.
                    world
                        .land_copies(|copy| copy.after_grant && copy.from != owner)
                        .await;
                }
            }
            result
        });
        match task.await {
            Ok(result) => result,
            // The store under test panicked: the caller sees its panic, as it would inline.
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            // Cancelled: only a runtime shutting down does that, at the end of a run.
            Err(_) => Err(injected(operation)),
        }
    }
}

/// Counts the task that polls a wait in [`World::dead`] as parked while the wait lives.
struct Parked<'a> {
    world: &'a World,
    task: Option<tokio::task::Id>,
}

impl Parked<'_> {
    fn under(&mut self, task: Option<tokio::task::Id>) {
        if task == self.task {
            return;
        }
        let mut parked = self
            .world
            .parked
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = self.task {
            leave(&mut parked, old);
        }
        if let Some(new) = task {
            *parked.entry(new).or_default() += 1;
        }
        self.task = task;
    }
}

fn leave(parked: &mut HashMap<tokio::task::Id, usize>, task: tokio::task::Id) {
    if let Some(waits) = parked.get_mut(&task) {
        *waits -= 1;
        if *waits == 0 {
            parked.remove(&task);
        }
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        if let Some(task) = self.task {
            leave(
                &mut self
                    .world
                    .parked
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
                task,
            );
        }
    }
}

/// One process's handle on the store under test: numbers its calls and injects the run's
/// faults.
pub(crate) struct ProcessStore {
    pub(crate) process: Process,
    pub(crate) world: Arc<World>,
}

impl ProcessStore {
    async fn call<O: Send + 'static>(
        &self,
        operation: Operation,
        step: Option<String>,
        by_work: bool,
        apply: Apply<O>,
        observe: Observe<O>,
    ) -> Result<O, StoreError> {
        let (world, process) = (&self.world, self.process);
        if world.crashed(process) {
            world.dead().await;
            return Err(injected(operation));
        }
        let (paused, partitioned) = world.cut(process);
        if let Some(until) = paused {
            // A paused process sends nothing: the call leaves once it resumes (if its
            // caller, whose timers ran on meanwhile, still waits for it).
            tokio::time::sleep_until(until).await;
        }
        world.ledger.push(Event::Call {
            process,
            operation,
            step,
            by_work,
        });
        if partitioned {
            // Unnumbered: no other fault can strike a call that never leaves.
            return Err(injected(operation));
        }
        let fault = world.next_call(process, operation);
        match fault {
            None | Some(Fault::DropAtPoint | Fault::CrashAtPoint | Fault::StallAtPoint) => {
                world.apply(process, operation, None, apply, observe).await
            }
            Some(Fault::ErrorBefore) => Err(injected(operation)),
            Some(Fault::LostAnswer) => {
                let _ = world.apply(process, operation, None, apply, observe).await;
                Err(injected(operation))
            }
            Some(Fault::HangThenApply) => {
                world
                    .apply(process, operation, Some(world.timing.hang), apply, observe)
                    .await
            }
            Some(Fault::HangNoApply) => {
                tokio::time::sleep(world.timing.hang).await;
                Err(injected(operation))
            }
            Some(Fault::DropBefore) => {
                world.kill(process, Kill::Drop).await;
                // Only a task that outlived the caller gets here: its call goes on.
                world.apply(process, operation, None, apply, observe).await
            }
            Some(Fault::DropAfter) => {
                let result = world.apply(process, operation, None, apply, observe).await;
                world.kill(process, Kill::Drop).await;
                result
            }
            Some(Fault::CrashBefore) => {
                world.kill(process, Kill::Crash).await;
                world.dead().await;
                Err(injected(operation))
            }
            Some(Fault::CrashAfter) => {
                let _ = world.apply(process, operation, None, apply, observe).await;
                world.kill(process, Kill::Crash).await;
                world.dead().await;
                Err(injected(operation))
            }
            Some(fault @ (Fault::DuplicatedLate | Fault::DuplicatedAfterTakeover)) => {
                // The work's own commit is its transaction, which no network replays; the
                // driver's writes are what a copy can repeat.
                if by_work {
                    return world.apply(process, operation, None, apply, observe).await;
                }
                world.keep_copy(
                    process,
                    operation,
                    fault == Fault::DuplicatedAfterTakeover,
                    Arc::clone(&apply),
                    Arc::clone(&observe),
                );
                world.apply(process, operation, None, apply, observe).await
            }
            Some(
                fault @ (Fault::PartitionAtCall | Fault::PauseAtPoint | Fault::PartitionAtPoint),
            ) => {
                world.cut_off(process, fault);
                Err(injected(operation))
            }
        }
    }

    /// `complete` made by the work itself inside "its own transaction": the work's effect
    /// is recorded exactly when the store applies the completion, as a business row
    /// committed with it would be.
    pub(crate) async fn commit(&self, completion: &Completion) -> Result<WriteOutcome, StoreError> {
        let (lease, bytes) = (completion.lease().clone(), completion.bytes().to_vec());
        let process = self.process;
        let world = Arc::clone(&self.world);
        self.call(
            Operation::Complete,
            None,
            true,
            Arc::new(move |store| {
                let (lease, bytes) = (lease.clone(), bytes.clone());
                Box::pin(async move { store.complete(&lease, &bytes).await })
            }),
            Arc::new(move |outcome| match outcome {
                WriteOutcome::Applied => vec![
                    Event::Effect {
                        process,
                        effect: Effect::Work,
                        at: world.now_of(process),
                    },
                    Event::Finished {
                        process,
                        at: world.now_of(process),
                    },
                ],
                WriteOutcome::Fenced => Vec::new(),
            }),
        )
        .await
    }
}

fn finished(world: &Arc<World>, process: Process) -> Observe<WriteOutcome> {
    let world = Arc::clone(world);
    Arc::new(move |outcome| match outcome {
        WriteOutcome::Applied => vec![Event::Finished {
            process,
            at: world.now_of(process),
        }],
        WriteOutcome::Fenced => Vec::new(),
    })
}

fn nothing<O>() -> Observe<O> {
    Arc::new(|_| Vec::new())
}

#[async_trait]
impl Store for ProcessStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let request = request.clone();
        let process = self.process;
        self.call(
            Operation::Claim,
            None,
            false,
            Arc::new(move |store| {
                let request = request.clone();
                Box::pin(async move { store.claim(&request).await })
            }),
            Arc::new(move |outcome| match outcome {
                ClaimOutcome::Claimed { lease, resumed, .. } => vec![Event::Claimed {
                    process,
                    token: lease.token,
                    lease_until: lease.lease_until,
                    resumed: *resumed,
                }],
                _ => Vec::new(),
            }),
        )
        .await
    }

    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        let (lease, response) = (lease.clone(), response.to_vec());
        self.call(
            Operation::Complete,
            None,
            false,
            Arc::new(move |store| {
                let (lease, response) = (lease.clone(), response.clone());
                Box::pin(async move { store.complete(&lease, &response).await })
            }),
            finished(&self.world, self.process),
        )
        .await
    }

    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        let (lease, response) = (lease.clone(), response.to_vec());
        self.call(
            Operation::Fail,
            None,
            false,
            Arc::new(move |store| {
                let (lease, response) = (lease.clone(), response.clone());
                Box::pin(async move { store.fail(&lease, &response).await })
            }),
            finished(&self.world, self.process),
        )
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        let lease = lease.clone();
        let process = self.process;
        self.call(
            Operation::Release,
            None,
            false,
            Arc::new(move |store| {
                let lease = lease.clone();
                Box::pin(async move { store.release(&lease).await })
            }),
            Arc::new(move |outcome| match outcome {
                WriteOutcome::Applied => vec![Event::Released { process }],
                WriteOutcome::Fenced => Vec::new(),
            }),
        )
        .await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        let lease = lease.clone();
        let (process, asked) = (self.process, lease.lease_until);
        self.call(
            Operation::Renew,
            None,
            false,
            Arc::new(move |store| {
                let lease = lease.clone();
                Box::pin(async move { store.renew(&lease, extend).await })
            }),
            Arc::new(move |outcome| match outcome {
                RenewOutcome::Renewed(lease) => vec![Event::Renewed {
                    process,
                    asked,
                    lease_until: lease.lease_until,
                }],
                RenewOutcome::Fenced => Vec::new(),
            }),
        )
        .await
    }

    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        let (lease, step, value) = (lease.clone(), step.clone(), value.to_vec());
        let (process, name) = (self.process, step.as_str().to_owned());
        self.call(
            Operation::Checkpoint,
            Some(name.clone()),
            false,
            Arc::new(move |store| {
                let (lease, step, value) = (lease.clone(), step.clone(), value.clone());
                Box::pin(async move { store.checkpoint(&lease, &step, &value).await })
            }),
            Arc::new(move |outcome| match outcome {
                WriteOutcome::Applied => vec![Event::Checkpointed {
                    process,
                    step: name.clone(),
                }],
                WriteOutcome::Fenced => Vec::new(),
            }),
        )
        .await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let key = key.clone();
        self.call(
            Operation::Get,
            None,
            false,
            Arc::new(move |store| {
                let key = key.clone();
                Box::pin(async move { store.get(&key).await })
            }),
            nothing(),
        )
        .await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        // Not a transition of any execution: passed through, never faulted.
        self.world.inner.purge_expired(limit).await
    }

    fn expiry(&self) -> Expiry {
        self.world.inner.expiry()
    }

    fn max_record_bytes(&self) -> Option<usize> {
        self.world.inner.max_record_bytes()
    }
}
