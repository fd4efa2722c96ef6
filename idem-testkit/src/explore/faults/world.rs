//! What one run shares: the store under test, the plan, the ledger, each process's
//! counters, cuts and supervisor, the copies of calls still to land, and the tasks of
//! crashed processes parked until the run ends.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use idem_core::{Clock, Store, StoreError, Timestamp, store::Operation};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::{Fault, FaultPoint, PlacedFault, Process, Site};
use crate::explore::Timing;
use crate::explore::clock::{ProcessClock, VirtualClock, off_the_clock};
use crate::explore::ledger::{Event, Ledger, held_until};
use crate::explore::target::ProcessFactory;

/// The error an injected store fault answers with, as the source of `Unavailable`.
#[derive(Debug, thiserror::Error)]
#[error("a fault injected by the explorer")]
pub(crate) struct Injected;

pub(super) fn injected(operation: Operation) -> StoreError {
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
pub(super) type Apply<O> =
    Arc<dyn Fn(Arc<dyn Store>) -> BoxFuture<Result<O, StoreError>> + Send + Sync>;
pub(super) type Observe<O> = Arc<dyn Fn(&O) -> Vec<Event> + Send + Sync>;
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
    pub(super) fn keep_copy<O: Send + 'static>(
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
    pub(super) fn cut(&self, process: Process) -> (Option<Instant>, bool) {
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
    pub(super) fn next_call(&self, process: Process, operation: Operation) -> Option<Fault> {
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
    pub(super) async fn apply<O: Send + 'static>(
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
