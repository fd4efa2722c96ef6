//! Faults, the points where they strike, and the store handle each simulated process
//! calls through: every call of a process is numbered (its fault point), and the plan of
//! a run says which fault, if any, strikes at which.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Key, Record, Store, StoreError, key::StepName, record::Lease, store::ClaimOutcome,
    store::ClaimRequest, store::Completion, store::Expiry, store::Operation, store::RenewOutcome,
    store::WriteOutcome,
};
use tokio::sync::{mpsc, oneshot, watch};

use super::Timing;
use super::clock::off_the_clock;
use super::ledger::{Effect, Event, Ledger};

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
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Process::First => f.write_str("p1"),
            Process::Duplicate => f.write_str("dup"),
            Process::Retry(n) => write!(f, "r{n}"),
            Process::Check => f.write_str("check"),
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
}

impl Fault {
    /// Every fault that strikes at a store call.
    pub const AT_CALLS: [Fault; 8] = [
        Fault::ErrorBefore,
        Fault::LostAnswer,
        Fault::HangThenApply,
        Fault::HangNoApply,
        Fault::DropBefore,
        Fault::DropAfter,
        Fault::CrashBefore,
        Fault::CrashAfter,
    ];

    /// Every fault that strikes at an await point of the work.
    pub const AT_POINTS: [Fault; 3] =
        [Fault::DropAtPoint, Fault::CrashAtPoint, Fault::StallAtPoint];

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
}

type Apply<O> = Box<dyn FnOnce(Arc<dyn Store>) -> BoxFuture<Result<O, StoreError>> + Send>;
type Observe<O> = Box<dyn FnOnce(&O) -> Vec<Event> + Send>;
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
    /// The retryable scenario's first run answered `Retryable` (shared by all processes,
    /// as a downstream system's state would be).
    pub(crate) retryable_returned: AtomicBool,
    /// The undo that answers `Retryable` once did so (shared, likewise).
    pub(crate) undo_retried: AtomicBool,
    processes: Mutex<HashMap<Process, ProcessState>>,
    over: watch::Sender<bool>,
}

impl World {
    pub(crate) fn new(
        inner: Arc<dyn Store>,
        plan: Vec<PlacedFault>,
        timing: Timing,
        paused: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            inner,
            plan,
            ledger: Ledger::default(),
            timing,
            paused,
            retryable_returned: AtomicBool::new(false),
            undo_retried: AtomicBool::new(false),
            processes: Mutex::new(HashMap::new()),
            over: watch::Sender::new(false),
        })
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
        let mut over = self.over.subscribe();
        let _ = over.wait_for(|over| *over).await;
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
            let result = off_the_clock(world.paused, apply(Arc::clone(&world.inner))).await;
            if let Ok(outcome) = &result {
                for event in observe(outcome) {
                    world.ledger.push(event);
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
        world.ledger.push(Event::Call {
            process,
            operation,
            step,
            by_work,
        });
        let fault = world.next_call(process, operation);
        match fault {
            None | Some(Fault::DropAtPoint | Fault::CrashAtPoint | Fault::StallAtPoint) => {
                world.apply(operation, None, apply, observe).await
            }
            Some(Fault::ErrorBefore) => Err(injected(operation)),
            Some(Fault::LostAnswer) => {
                let _ = world.apply(operation, None, apply, observe).await;
                Err(injected(operation))
            }
            Some(Fault::HangThenApply) => {
                world
                    .apply(operation, Some(world.timing.hang), apply, observe)
                    .await
            }
            Some(Fault::HangNoApply) => {
                tokio::time::sleep(world.timing.hang).await;
                Err(injected(operation))
            }
            Some(Fault::DropBefore) => {
                world.kill(process, Kill::Drop).await;
                // Only a task that outlived the caller gets here: its call goes on.
                world.apply(operation, None, apply, observe).await
            }
            Some(Fault::DropAfter) => {
                let result = world.apply(operation, None, apply, observe).await;
                world.kill(process, Kill::Drop).await;
                result
            }
            Some(Fault::CrashBefore) => {
                world.kill(process, Kill::Crash).await;
                world.dead().await;
                Err(injected(operation))
            }
            Some(Fault::CrashAfter) => {
                let _ = world.apply(operation, None, apply, observe).await;
                world.kill(process, Kill::Crash).await;
                world.dead().await;
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
        self.call(
            Operation::Complete,
            None,
            true,
            Box::new(move |store| Box::pin(async move { store.complete(&lease, &bytes).await })),
            Box::new(move |outcome| match outcome {
                WriteOutcome::Applied => vec![
                    Event::Effect {
                        process,
                        effect: Effect::Work,
                    },
                    Event::Finished { process },
                ],
                WriteOutcome::Fenced => Vec::new(),
            }),
        )
        .await
    }
}

fn finished(process: Process) -> Observe<WriteOutcome> {
    Box::new(move |outcome| match outcome {
        WriteOutcome::Applied => vec![Event::Finished { process }],
        WriteOutcome::Fenced => Vec::new(),
    })
}

fn nothing<O>() -> Observe<O> {
    Box::new(|_| Vec::new())
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
            Box::new(move |store| Box::pin(async move { store.claim(&request).await })),
            Box::new(move |outcome| match outcome {
                ClaimOutcome::Claimed { lease, .. } => vec![Event::Claimed {
                    process,
                    token: lease.token,
                    lease_until: lease.lease_until,
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
            Box::new(move |store| Box::pin(async move { store.complete(&lease, &response).await })),
            finished(self.process),
        )
        .await
    }

    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        let (lease, response) = (lease.clone(), response.to_vec());
        self.call(
            Operation::Fail,
            None,
            false,
            Box::new(move |store| Box::pin(async move { store.fail(&lease, &response).await })),
            finished(self.process),
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
            Box::new(move |store| Box::pin(async move { store.release(&lease).await })),
            Box::new(move |outcome| match outcome {
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
            Box::new(move |store| Box::pin(async move { store.renew(&lease, extend).await })),
            Box::new(move |outcome| match outcome {
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
            Box::new(move |store| {
                Box::pin(async move { store.checkpoint(&lease, &step, &value).await })
            }),
            Box::new(move |outcome| match outcome {
                WriteOutcome::Applied => vec![Event::Checkpointed {
                    process,
                    step: name,
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
            Box::new(move |store| Box::pin(async move { store.get(&key).await })),
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
