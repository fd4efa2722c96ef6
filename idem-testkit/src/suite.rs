//! Running the cases: one at a time, or all with a report.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use idem_core::{ManualClock, Store};

use crate::cases::{
    claim, concurrency, driver, edges, fencing, long_work, namespaces, payloads, retention, saga,
    security,
};
use crate::{Capabilities, Namespace, model, quiet};

crate::__with_cases!(enum ());

type StoreFuture = Pin<Box<dyn Future<Output = Arc<dyn Store>> + Send>>;
pub(crate) type Factory = Arc<dyn Fn(Namespace) -> StoreFuture + Send + Sync>;

/// A store factory with its capabilities: runs conformance cases.
///
/// The factory receives a [`Namespace`] chosen by the suite and must return a store that
/// keeps its records under it (a table, a key prefix) and sees nothing outside it.
///
/// ```
/// use idem_core::MemoryStore;
/// use idem_testkit::{Case, Suite};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let suite = Suite::new(|_namespace| async { MemoryStore::new() });
/// suite.run(Case::ScopesAreIsolated).await; // panics if the store breaks the case
/// let report = suite.run_all().await;
/// assert!(report.passed(), "{report}");
/// # });
/// ```
#[derive(Clone)]
pub struct Suite {
    factory: Factory,
    capabilities: Capabilities,
    /// Set by `run_all`: failures go into the report, not onto stderr.
    quiet: bool,
}

impl Suite {
    /// A suite over stores made by `factory`, each in the namespace it is given.
    pub fn new<F, Fut, S>(factory: F) -> Self
    where
        F: Fn(Namespace) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = S> + Send + 'static,
        S: Store + 'static,
    {
        let factory = Arc::new(factory);
        Self {
            factory: Arc::new(move |namespace| {
                let made = factory(namespace);
                Box::pin(async move { Arc::new(made.await) as Arc<dyn Store> })
            }),
            capabilities: Capabilities::default(),
            quiet: false,
        }
    }

    /// A suite over stores that read the [`ManualClock`] they are given: the suite makes
    /// one clock (shared by every store this suite makes, and by nothing else) and moves it
    /// in the cases that need time to pass, the model-based one included.
    ///
    /// ```
    /// use idem_core::MemoryStore;
    /// use idem_testkit::{Case, Suite};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let suite = Suite::with_manual_clock(|clock, _namespace| async move { MemoryStore::with_clock(clock) });
    /// suite.run(Case::GetHidesAbsentRecords).await;
    /// # });
    /// ```
    pub fn with_manual_clock<F, Fut, S>(factory: F) -> Self
    where
        F: Fn(ManualClock, Namespace) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = S> + Send + 'static,
        S: Store + 'static,
    {
        let clock = ManualClock::new();
        let mut suite = {
            let clock = clock.clone();
            Self::new(move |namespace| factory(clock.clone(), namespace))
        };
        suite.capabilities.manual_clock = Some(clock);
        suite
    }

    /// A suite over stores on a server whose address is in the environment variable
    /// `variable`; the factory receives that address and the namespace.
    ///
    /// - Set: the suite.
    /// - Unset: `None` after a loud notice on stderr, so the caller skips; or a panic when
    ///   `IDEM_REQUIRE_SERVICES=1`, so CI never skips a backend (see [`crate::service_url`]).
    ///
    /// ```no_run
    /// use idem_core::MemoryStore;
    /// use idem_testkit::{Case, Suite};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// // MemoryStore stands in for a server-backed store built from the address.
    /// if let Some(suite) = Suite::for_service("IDEM_TEST_EXAMPLE_URL", |_url, _namespace| async { MemoryStore::new() }) {
    ///     suite.run(Case::ScopesAreIsolated).await;
    /// }
    /// # });
    /// ```
    pub fn for_service<F, Fut, S>(variable: &str, factory: F) -> Option<Self>
    where
        F: Fn(String, Namespace) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = S> + Send + 'static,
        S: Store + 'static,
    {
        let address = crate::service_url(variable)?;
        Some(Self::new(move |namespace| {
            factory(address.clone(), namespace)
        }))
    }

    /// Declares what the store can do.
    #[must_use]
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> Self {
        let clock = self.capabilities.manual_clock.take();
        self.capabilities = Capabilities {
            manual_clock: capabilities.manual_clock.or(clock),
            ..capabilities
        };
        self
    }

    /// Runs one case on a fresh store; panics with the broken behaviour if it fails.
    pub async fn run(&self, case: Case) {
        let caps = &self.capabilities;
        if case == Case::MatchesTheStateMachine {
            return self.run_model().await;
        }
        if case == Case::NamespacesAreIsolated {
            let base = Namespace::fresh();
            let short = (self.factory)(base.clone()).await;
            let long = (self.factory)(base.extended()).await;
            return namespaces::namespaces_are_isolated(short.as_ref(), long.as_ref()).await;
        }
        let store = (self.factory)(Namespace::fresh()).await;
        let s = store.as_ref();
        match case {
            Case::AbsentKeyIsClaimedFresh => claim::absent_key_is_claimed_fresh(s).await,
            Case::AbsentRecordIsClaimedFresh => {
                claim::absent_record_is_claimed_fresh(s, caps).await
            }
            Case::DifferentFingerprintIsAMismatch => {
                claim::different_fingerprint_is_a_mismatch(s).await
            }
            Case::CompletedRecordReplays => claim::completed_record_replays(s).await,
            Case::FailedRecordReplaysFailure => claim::failed_record_replays_failure(s).await,
            Case::LiveLeaseIsInFlight => claim::live_lease_is_in_flight(s).await,
            Case::SameAttemptGetsItsLeaseBack => claim::same_attempt_gets_its_lease_back(s).await,
            Case::ExpiredLeaseIsTakenOver => claim::expired_lease_is_taken_over(s).await,
            Case::LeaseAndExpiryEndExactly => edges::lease_and_expiry_end_exactly(s, caps).await,
            Case::TokensStrictlyIncrease => claim::tokens_strictly_increase(s).await,
            Case::CompleteStoresTheResponse => fencing::complete_stores_the_response(s).await,
            Case::FailStoresTheFailure => fencing::fail_stores_the_failure(s).await,
            Case::ReleaseLetsTheNextClaimTakeOver => {
                fencing::release_lets_the_next_claim_take_over(s).await
            }
            Case::ReleaseWithoutStepsForgetsTheKey => {
                fencing::release_without_steps_forgets_the_key(s).await
            }
            Case::RenewExtendsTheLease => fencing::renew_extends_the_lease(s).await,
            Case::CheckpointRecordsSteps => fencing::checkpoint_records_steps(s).await,
            Case::StaleOwnerIsFencedAfterTakeover => {
                fencing::stale_owner_is_fenced_after_takeover(s).await
            }
            Case::WritesAfterTheEndAreFenced => fencing::writes_after_the_end_are_fenced(s).await,
            Case::RetriedTerminalWritesAreApplied => {
                fencing::retried_terminal_writes_are_applied(s).await
            }
            Case::RetriedTerminalWritesKeepTheFirstBytes => {
                fencing::retried_terminal_writes_keep_the_first_bytes(s).await
            }
            Case::FingerprintSurvivesCompletion => {
                fencing::fingerprint_survives_completion(s).await
            }
            Case::ScopesAreIsolated => fencing::scopes_are_isolated(s).await,
            Case::ReplaysAreByteExact => payloads::replays_are_byte_exact(s).await,
            Case::LargeResponsesReplayOrAreRefused => {
                payloads::large_responses_replay_or_are_refused(s, caps).await
            }
            Case::StepsCountTowardTheRecordLimit => {
                payloads::steps_count_toward_the_record_limit(s).await
            }
            Case::KeysAtTheLimits => payloads::keys_at_the_limits(s).await,
            Case::ALiveLeaseIsNeverAbsent => retention::a_live_lease_is_never_absent(s, caps).await,
            Case::LateResultsStayReplayable => {
                retention::late_results_stay_replayable(s, caps).await
            }
            Case::AReleaseAfterTheRetentionKeepsItsSteps => {
                retention::a_release_after_the_retention_keeps_its_steps(s, caps).await
            }
            Case::AReleaseAfterItsLeaseEndedKeepsItsEnd => {
                retention::a_release_after_its_lease_ended_keeps_its_end(s, caps).await
            }
            Case::NoLeaseEndsAtTheRetentionCliff => {
                long_work::no_lease_ends_at_the_retention_cliff(s, caps).await
            }
            Case::AnEndedLeaseIsNotRenewed => {
                long_work::an_ended_lease_is_not_renewed(s, caps).await
            }
            Case::ALateClaimOfTheSameAttemptTakesNothingOver => {
                long_work::a_late_claim_of_the_same_attempt_takes_nothing_over(s, caps).await
            }
            Case::GetHidesAbsentRecords => retention::get_hides_absent_records(s, caps).await,
            Case::LifetimesAreToldApart => retention::lifetimes_are_told_apart(store, caps).await,
            Case::ACheckpointKeepsTheRecordPastItsOwnLeaseEnd => {
                retention::a_checkpoint_keeps_the_record_past_its_own_lease_end(s, caps).await
            }
            Case::ExtremeDurationsWork => retention::extreme_durations_work(s, caps).await,
            Case::PurgeRemovesOnlyAbsentRecords => {
                retention::purge_removes_only_absent_records(s, caps).await
            }
            Case::ConcurrentClaimsHaveOneWinner => {
                concurrency::concurrent_claims_have_one_winner(store).await
            }
            Case::ConcurrentTakeoversHaveOneWinner => {
                concurrency::concurrent_takeovers_have_one_winner(store).await
            }
            Case::StaleCompletesRaceTakeovers => {
                concurrency::stale_completes_race_takeovers(store).await
            }
            Case::StepsRunOnceAcrossTakeovers => {
                driver::steps_run_once_across_takeovers(store, caps).await
            }
            Case::AStaleOwnerCannotStoreItsResult => {
                driver::a_stale_owner_cannot_store_its_result(store, caps).await
            }
            Case::WaitingDuplicatesShareOneExecution => {
                driver::waiting_duplicates_share_one_execution(store).await
            }
            Case::EncryptedValuesAreNotPlaintextAtRest => {
                security::encrypted_values_are_not_plaintext_at_rest(store).await
            }
            Case::EncryptedRecordsRefuseCopiesAndTampering => {
                security::encrypted_records_refuse_copies_and_tampering(store, caps).await
            }
            Case::KeyPoliciesAndBudgetsRefuseBeforeStoring => {
                security::key_policies_and_budgets_refuse_before_storing(store).await
            }
            Case::ProviderKeysSurviveTakeovers => {
                security::provider_keys_survive_takeovers(store, caps).await
            }
            Case::AFailedSagaIsUndoneInReverseOnce => {
                saga::a_failed_saga_is_undone_in_reverse_once(store).await
            }
            Case::ATakeoverFinishesACrashedCompensation => {
                saga::a_takeover_finishes_a_crashed_compensation(store, caps).await
            }
            Case::AFailingUndoIsStoredForTheOperator => {
                saga::a_failing_undo_is_stored_for_the_operator(store).await
            }
            Case::MatchesTheStateMachine | Case::NamespacesAreIsolated => {
                unreachable!("handled above")
            }
        }
    }

    /// The model's generator is not `Send`, so it runs on a thread of its own with its own
    /// runtime; the stores it makes live on that runtime.
    async fn run_model(&self) {
        let factory = Arc::clone(&self.factory);
        let clock = self.capabilities.manual_clock.clone();
        on_own_thread(self.quiet, move || {
            model::run(move || factory(Namespace::fresh()), clock)
        })
        .await;
    }

    /// Runs one case on a new multi-threaded Tokio runtime; what the generated tests call.
    pub fn run_blocking(&self, case: Case) {
        block_on_new_runtime(self.run(case));
    }

    /// Runs every case, each in its own task so one failure does not hide the next, and
    /// reports which failed and why. Failures go into the [`Report`] (whole: for the
    /// model-based case, the shrunk sequence, the operation that diverged, and both
    /// answers), not onto stderr.
    pub async fn run_all(&self) -> Report {
        let mut quiet = self.clone();
        quiet.quiet = true;
        run_each(Case::ALL, move |case| {
            let suite = quiet.clone();
            async move { suite.run(case).await }
        })
        .await
    }

    /// The same suite, its failures kept out of stderr (for a report).
    pub(crate) fn quietly(&self) -> Self {
        let mut quiet = self.clone();
        quiet.quiet = true;
        quiet
    }

    /// The clock the stores read, when the suite moves it.
    pub(crate) fn with_clock(mut self, clock: Option<ManualClock>) -> Self {
        self.capabilities.manual_clock = clock;
        self
    }

    pub(crate) fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    pub(crate) fn is_quiet(&self) -> bool {
        self.quiet
    }
}

/// Runs each case in a task of its own and reports which failed and why.
pub(crate) async fn run_each<C, F, Fut>(cases: &[C], run: F) -> Report<C>
where
    C: CaseName,
    F: Fn(C) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut results = Vec::with_capacity(cases.len());
    for &case in cases {
        let outcome = tokio::spawn(quiet::Quiet::new(run(case))).await;
        let failure = outcome.err().map(|err| match err.try_into_panic() {
            Ok(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "the case panicked".to_owned()),
            Err(err) => format!("the case did not finish: {err}"),
        });
        results.push(CaseResult { case, failure });
    }
    Report { results }
}

/// A kind of conformance case: [`Case`] or [`AdminCase`](crate::AdminCase).
pub trait CaseName: Copy + PartialEq + fmt::Debug + Send + 'static {
    /// The case's name, which is also its generated test's name.
    fn name(self) -> &'static str;
    /// What the case checks.
    fn description(self) -> &'static str;
}

impl CaseName for Case {
    fn name(self) -> &'static str {
        Case::name(self)
    }

    fn description(self) -> &'static str {
        Case::description(self)
    }
}

impl fmt::Debug for Suite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Suite")
            .field("capabilities", &self.capabilities)
            .finish_non_exhaustive()
    }
}

/// The result of one case in [`Suite::run_all`].
#[derive(Clone, Debug)]
pub struct CaseResult<C = Case> {
    /// The case.
    pub case: C,
    /// Why it failed, whole (every line the case reported), or `None` when it passed.
    pub failure: Option<String>,
}

/// What [`Suite::run_all`] found.
#[derive(Clone, Debug)]
pub struct Report<C = Case> {
    /// One result per case, in order.
    pub results: Vec<CaseResult<C>>,
}

impl<C: CaseName> Report<C> {
    /// True when every case passed.
    pub fn passed(&self) -> bool {
        self.results.iter().all(|r| r.failure.is_none())
    }

    /// The cases that failed.
    pub fn failed(&self) -> Vec<C> {
        self.results
            .iter()
            .filter(|r| r.failure.is_some())
            .map(|r| r.case)
            .collect()
    }
}

impl<C: CaseName> fmt::Display for Report<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failed = self.failed();
        writeln!(
            f,
            "{} passed, {} failed",
            self.results.len() - failed.len(),
            failed.len()
        )?;
        for result in &self.results {
            if let Some(why) = &result.failure {
                writeln!(
                    f,
                    "  FAILED {} ({})",
                    result.case.name(),
                    result.case.description()
                )?;
                for line in why.lines() {
                    writeln!(f, "    {line}")?;
                }
            }
        }
        Ok(())
    }
}

/// Runs the future `make` builds on a thread and a current-thread runtime of its own (the
/// model's generator is not `Send`; the stores it makes live on that runtime), passing a
/// panic on as it was.
pub(crate) async fn on_own_thread<F, Fut>(quiet: bool, make: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let run = tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a Tokio runtime for the model-based case")
            .block_on(quiet::maybe(quiet, make()))
    });
    if let Err(err) = run.await {
        match err.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(err) => panic!("the model-based case did not finish: {err}"),
        }
    }
}

/// Runs `case` on a new multi-threaded Tokio runtime: what the generated tests call.
pub(crate) fn block_on_new_runtime(case: impl Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a Tokio runtime for the case")
        .block_on(case);
}
