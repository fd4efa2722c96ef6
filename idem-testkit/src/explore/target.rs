//! The store an exploration runs against, on virtual or real time, and the runners that
//! make one run of a scenario on it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use idem_core::{BoxError, Key, Store, key::KeyError};

use super::run::{self, RunOutcome};
use super::{ExploreError, PlacedFault, ProcessClock, Scenario, Timing, VirtualClock};
use std::time::Duration;

pub(super) type StoreFuture = Pin<Box<dyn Future<Output = Result<Arc<dyn Store>, BoxError>>>>;
pub(super) type VirtualFactory = Arc<dyn Fn(VirtualClock) -> StoreFuture + Send + Sync>;
pub(super) type RealFactory = Arc<dyn Fn() -> StoreFuture + Send + Sync>;
/// Makes one process's handle on the run's store, reading that process's clock.
pub(crate) type ProcessFactory = Arc<dyn Fn(ProcessClock) -> SendStoreFuture + Send + Sync>;
pub(crate) type SendStoreFuture =
    Pin<Box<dyn Future<Output = Result<Arc<dyn Store>, BoxError>> + Send>>;
pub(super) type SharedFactory = Arc<
    dyn Fn(VirtualClock) -> Pin<Box<dyn Future<Output = Result<ProcessFactory, BoxError>>>>
        + Send
        + Sync,
>;

#[derive(Clone)]
pub(super) enum Time {
    Virtual(VirtualFactory),
    Real(RealFactory),
    PerProcess(SharedFactory),
}

/// The store an exploration runs against, and whose clock it keeps.
#[derive(Clone)]
pub struct Target {
    pub(super) name: String,
    pub(super) time: Time,
}

impl Target {
    /// A store on the process's clock: `factory` makes a fresh one for every run, on the
    /// [`VirtualClock`] it is given (which follows the run's paused Tokio clock), inside
    /// that run's runtime.
    pub fn virtual_time<F, Fut, S, E>(name: impl Into<String>, factory: F) -> Self
    where
        F: Fn(VirtualClock) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<S, E>> + 'static,
        S: Store + 'static,
        E: Into<BoxError>,
    {
        let factory = Arc::new(factory);
        Self {
            name: name.into(),
            time: Time::Virtual(Arc::new(move |clock| {
                let made = factory(clock);
                Box::pin(async move {
                    made.await
                        .map(|store| Arc::new(store) as Arc<dyn Store>)
                        .map_err(Into::into)
                })
            })),
        }
    }

    /// A store on a server's clock: `factory` is called once per exploration, inside its
    /// (multi-threaded, real-time) runtime; runs tell themselves apart by key.
    pub fn real_time<F, Fut, S, E>(name: impl Into<String>, factory: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<S, E>> + 'static,
        S: Store + 'static,
        E: Into<BoxError>,
    {
        let factory = Arc::new(factory);
        Self {
            name: name.into(),
            time: Time::Real(Arc::new(move || {
                let made = factory();
                Box::pin(async move {
                    made.await
                        .map(|store| Arc::new(store) as Arc<dyn Store>)
                        .map_err(Into::into)
                })
            })),
        }
    }

    /// A store shared by processes whose clocks differ: `run` makes what one run shares (a
    /// store, a database file) on the run's [`VirtualClock`], and `process` makes each
    /// simulated process's handle on it, reading that process's [`ProcessClock`] (the
    /// run's clock skewed by [`Timing::skew`](super::Timing::skew)), as processes on
    /// machines whose clocks differ would. For stores that trust their caller's clock
    /// (memory, SQLite across processes).
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use idem_core::MemoryStore;
    /// use idem_testkit::explore::{Explorer, Mode, Scenario, Target, Timing};
    ///
    /// let target = Target::per_process_clocks(
    ///     "memory, skewed clocks",
    ///     |clock| async move { Ok::<_, Infallible>(MemoryStore::with_clock(clock)) },
    ///     |store: MemoryStore, clock| async move { Ok::<_, Infallible>(store.sharing_with_clock(clock)) },
    /// );
    /// let mut timing = Timing::virtual_time();
    /// timing.skew = Duration::from_millis(10);
    /// let report = Explorer::new(target)
    ///     .timing(timing)
    ///     .scenarios([Scenario::WaitDuplicate])
    ///     .mode(Mode::sampled(7, 4))
    ///     .run()?;
    /// assert!(report.passed(), "{report}");
    /// # Ok::<(), idem_testkit::explore::ExploreError>(())
    /// ```
    pub fn per_process_clocks<R, F, Fut, P, PFut, S, E>(
        name: impl Into<String>,
        run: F,
        process: P,
    ) -> Self
    where
        F: Fn(VirtualClock) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + 'static,
        R: Clone + Send + Sync + 'static,
        P: Fn(R, ProcessClock) -> PFut + Send + Sync + 'static,
        PFut: Future<Output = Result<S, E>> + Send + 'static,
        S: Store + 'static,
        E: Into<BoxError> + 'static,
    {
        let (run, process) = (Arc::new(run), Arc::new(process));
        Self {
            name: name.into(),
            time: Time::PerProcess(Arc::new(move |clock| {
                let made = run(clock);
                let process = Arc::clone(&process);
                Box::pin(async move {
                    let shared = made.await.map_err(Into::into)?;
                    let factory: ProcessFactory = Arc::new(move |clock| {
                        let made = process(shared.clone(), clock);
                        Box::pin(async move {
                            made.await
                                .map(|store| Arc::new(store) as Arc<dyn Store>)
                                .map_err(Into::into)
                        })
                    });
                    Ok(factory)
                })
            })),
        }
    }

    /// The target's name, as reports print it.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn is_virtual(&self) -> bool {
        !matches!(self.time, Time::Real(_))
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("virtual_time", &self.is_virtual())
            .finish_non_exhaustive()
    }
}

/// Makes one run of a scenario with a plan of faults.
pub(super) trait Runner {
    fn run(
        &mut self,
        scenario: Scenario,
        plan: Vec<PlacedFault>,
    ) -> Result<RunOutcome, ExploreError>;
}

/// A fresh paused runtime, clock and store per run: every run starts at the same time
/// and leaves nothing behind.
pub(super) struct VirtualRunner {
    pub(super) factory: VirtualStores,
    pub(super) target: String,
    pub(super) timing: Timing,
    pub(super) keys: Keys,
}

impl Runner for VirtualRunner {
    fn run(
        &mut self,
        scenario: Scenario,
        plan: Vec<PlacedFault>,
    ) -> Result<RunOutcome, ExploreError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .map_err(ExploreError::Runtime)?;
        let key = self.keys.next(scenario)?;
        let (factory, timing) = (self.factory.clone(), self.timing);
        let target = self.target.clone();
        runtime.block_on(async move {
            let clock = VirtualClock::new();
            let failed = |source| ExploreError::Store {
                target: target.clone(),
                source,
            };
            let (store, processes) = match factory {
                VirtualStores::One(factory) => {
                    (factory(clock.clone()).await.map_err(failed)?, None)
                }
                VirtualStores::PerProcess(shared) => {
                    let processes = shared(clock.clone()).await.map_err(failed)?;
                    // The store every process shares, on the exact clock: what the final
                    // reads and the store's own answers (its expiry, its limits) use.
                    let exact = ProcessClock::new(clock.clone(), true, Duration::ZERO);
                    (processes(exact).await.map_err(failed)?, Some(processes))
                }
            };
            Ok(run::run(store, processes, scenario, plan, timing, key, Some(clock)).await)
        })
    }
}

/// How a virtual-time runner makes a run's store: one for all its processes, or one
/// handle per process on a shared one, each on its own clock.
#[derive(Clone)]
pub(super) enum VirtualStores {
    One(VirtualFactory),
    PerProcess(SharedFactory),
}

/// One real-time runtime and store for the whole exploration.
pub(super) struct RealRunner {
    pub(super) runtime: tokio::runtime::Runtime,
    pub(super) store: Arc<dyn Store>,
    pub(super) timing: Timing,
    pub(super) keys: Keys,
}

impl Runner for RealRunner {
    fn run(
        &mut self,
        scenario: Scenario,
        plan: Vec<PlacedFault>,
    ) -> Result<RunOutcome, ExploreError> {
        let key = self.keys.next(scenario)?;
        let store = Arc::clone(&self.store);
        Ok(self.runtime.block_on(run::run(
            store,
            None,
            scenario,
            plan,
            self.timing,
            key,
            None,
        )))
    }
}

/// A key per run, unique across explorations sharing a server.
pub(super) struct Keys {
    nonce: String,
    next: u64,
}

impl Keys {
    pub(super) fn new() -> Self {
        Self {
            nonce: format!(
                "{}-{}",
                std::process::id(),
                idem_core::Timestamp::now().as_unix_millis()
            ),
            next: 0,
        }
    }

    fn next(&mut self, scenario: Scenario) -> Result<Key, KeyError> {
        self.next += 1;
        Key::new(
            format!("explore/{}", scenario.name()),
            format!("{}-{}", self.nonce, self.next),
        )
    }
}
