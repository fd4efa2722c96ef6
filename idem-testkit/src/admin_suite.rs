//! The admin conformance suite: the operator's side of a store ([`idem_core::Admin`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use idem_core::{Admin, ManualClock, Store};

use crate::cases::admin;
use crate::suite::{CaseName, block_on_new_runtime, on_own_thread, run_each};
use crate::{Capabilities, Namespace, Report, Suite, model};

crate::__with_admin_cases!(enum ());

impl CaseName for AdminCase {
    fn name(self) -> &'static str {
        AdminCase::name(self)
    }

    fn description(self) -> &'static str {
        AdminCase::description(self)
    }
}

type AdminFuture = Pin<Box<dyn Future<Output = Arc<dyn Admin>> + Send>>;
type AdminFactory = Arc<dyn Fn(Namespace) -> AdminFuture + Send + Sync>;

/// A factory of stores that implement [`Admin`]: runs the admin cases.
///
/// Built like a [`Suite`], from a factory that receives a [`Namespace`] (and a clock or an
/// address). The admin cases include a model-based run in which operator releases and
/// deletions interleave with every other operation.
///
/// ```
/// use idem_core::MemoryStore;
/// use idem_testkit::{AdminCase, AdminSuite};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let suite = AdminSuite::new(|_namespace| async { MemoryStore::new() });
/// suite.run(AdminCase::ReleaseKeyFencesTheOwner).await;
/// assert!(suite.run_all().await.passed());
/// # });
/// ```
#[derive(Clone)]
pub struct AdminSuite {
    /// The same stores, as plain stores, for what the admin cases share with the others.
    suite: Suite,
    factory: AdminFactory,
}

fn erase<F, Fut, S>(factory: F) -> AdminFactory
where
    F: Fn(Namespace) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = S> + Send + 'static,
    S: Admin + 'static,
{
    let factory = Arc::new(factory);
    Arc::new(move |namespace| {
        let made = factory(namespace);
        Box::pin(async move { Arc::new(made.await) as Arc<dyn Admin> })
    })
}

impl AdminSuite {
    fn from_admin(factory: AdminFactory, clock: Option<ManualClock>) -> Self {
        let plain = Arc::clone(&factory);
        let suite = Suite::new(move |namespace| {
            let made = plain(namespace);
            async move { as_store(&made.await) }
        })
        .with_clock(clock);
        Self { suite, factory }
    }

    /// A suite over stores made by `factory`, each in the namespace it is given.
    pub fn new<F, Fut, S>(factory: F) -> Self
    where
        F: Fn(Namespace) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = S> + Send + 'static,
        S: Admin + 'static,
    {
        Self::from_admin(erase(factory), None)
    }

    /// A suite over stores that read the [`ManualClock`] they are given (see
    /// [`Suite::with_manual_clock`]).
    pub fn with_manual_clock<F, Fut, S>(factory: F) -> Self
    where
        F: Fn(ManualClock, Namespace) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = S> + Send + 'static,
        S: Admin + 'static,
    {
        let clock = ManualClock::new();
        let given = clock.clone();
        let factory = erase(move |namespace| factory(given.clone(), namespace));
        Self::from_admin(factory, Some(clock))
    }

    /// A suite over stores on a server whose address is in `variable` (see
    /// [`Suite::for_service`]).
    pub fn for_service<F, Fut, S>(variable: &str, factory: F) -> Option<Self>
    where
        F: Fn(String, Namespace) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = S> + Send + 'static,
        S: Admin + 'static,
    {
        let address = crate::service_url(variable)?;
        Some(Self::new(move |namespace| {
            factory(address.clone(), namespace)
        }))
    }

    /// Declares what the store can do.
    #[must_use]
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> Self {
        self.suite = self.suite.with_capabilities(capabilities);
        self
    }

    /// Runs one case on fresh stores; panics with the broken behaviour if it fails.
    pub async fn run(&self, case: AdminCase) {
        let caps = self.suite.capabilities();
        if case == AdminCase::MatchesTheStateMachineWithAdmin {
            return self.run_model().await;
        }
        if case == AdminCase::AdminReachesOnlyItsNamespace {
            let base = Namespace::fresh();
            let short = (self.factory)(base.clone()).await;
            let long = (self.factory)(base.extended()).await;
            return admin::admin_reaches_only_its_namespace(short.as_ref(), long.as_ref()).await;
        }
        let store = (self.factory)(Namespace::fresh()).await;
        let s = store.as_ref();
        match case {
            AdminCase::ListFiltersAndOrders => admin::list_filters_and_orders(s, caps).await,
            AdminCase::ListPagesThroughEveryRecordOnce => {
                admin::list_pages_through_every_record_once(s).await
            }
            AdminCase::ListLeavesResponsesOutUnlessAsked => {
                admin::list_leaves_responses_out_unless_asked(s).await
            }
            AdminCase::StatsCountWhatTheStoreHolds => {
                admin::stats_count_what_the_store_holds(s, caps).await
            }
            AdminCase::ReleaseKeyFencesTheOwner => admin::release_key_fences_the_owner(s).await,
            AdminCase::ReleaseKeyRacesTheOwnersComplete => {
                admin::release_key_races_the_owners_complete(store).await
            }
            AdminCase::DeleteRemovesOneRecord => admin::delete_removes_one_record(s).await,
            AdminCase::RawShowsWhatIsStored => admin::raw_shows_what_is_stored(s).await,
            AdminCase::MatchesTheStateMachineWithAdmin
            | AdminCase::AdminReachesOnlyItsNamespace => {
                unreachable!("handled above")
            }
        }
    }

    async fn run_model(&self) {
        let factory = Arc::clone(&self.factory);
        let clock = self.suite.capabilities().manual_clock.clone();
        on_own_thread(self.suite.is_quiet(), move || {
            model::run_admin(move || factory(Namespace::fresh()), clock)
        })
        .await;
    }

    /// Runs one case on a new multi-threaded Tokio runtime; what the generated tests call.
    pub fn run_blocking(&self, case: AdminCase) {
        block_on_new_runtime(self.run(case));
    }

    /// Runs every admin case and reports which failed and why (see [`Suite::run_all`]).
    pub async fn run_all(&self) -> Report<AdminCase> {
        let quiet = Self {
            suite: self.suite.quietly(),
            factory: Arc::clone(&self.factory),
        };
        run_each(AdminCase::ALL, move |case| {
            let suite = quiet.clone();
            async move { suite.run(case).await }
        })
        .await
    }
}

impl fmt::Debug for AdminSuite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminSuite")
            .field("suite", &self.suite)
            .finish_non_exhaustive()
    }
}

/// An `Arc<dyn Admin>` as a plain store, for code that takes `dyn Store`.
pub(crate) fn as_store(admin: &Arc<dyn Admin>) -> Arc<dyn Store> {
    Arc::new(Arc::clone(admin))
}
