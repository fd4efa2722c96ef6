//! The suite proves it can fail: deliberately broken stores are reported, each by the cases
//! that guard the behaviour it breaks, and by no case named for another behaviour.

mod common;

use std::sync::Arc;

use idem_core::{MemoryStore, SystemClock};
use idem_testkit::explore::{Explorer, Fault, Report as ExploreReport, Scenario, Target, Timing};
use idem_testkit::{AdminCase, AdminSuite, Case, CaseName, Namespace, Report, Suite};

use common::*;

/// An admin suite over stores with `flaw`, all on one shared backend.
fn admin_suite(flaw: Option<Flaw>) -> AdminSuite {
    let make = factory(flaw, Setup::default());
    AdminSuite::new(move |namespace| make(Arc::new(SystemClock), namespace))
}

/// A suite over stores with `flaw`, all on one shared backend.
fn suite(flaw: Option<Flaw>) -> Suite {
    suite_with(flaw, Setup::default())
}

/// A suite over stores with `flaw` made as `setup` says, all on one shared backend.
fn suite_with(flaw: Option<Flaw>, setup: Setup) -> Suite {
    let make = factory(flaw, setup);
    if setup.manual_clock {
        Suite::with_manual_clock(move |clock, namespace| make(Arc::new(clock), namespace))
    } else {
        Suite::new(move |namespace| make(Arc::new(SystemClock), namespace))
    }
}

/// Stores that declare (and, unflawed, enforce) a record limit.
const LIMITED: Setup = Setup {
    limit: Some(LIMIT),
    manual_clock: false,
};
/// Stores on the suite's manual clock.
const MANUAL: Setup = Setup {
    limit: None,
    manual_clock: true,
};

/// The report must name every case in `required` and nothing outside `required` and
/// `also_allowed`.
fn assert_reported<C: CaseName>(report: &Report<C>, required: &[C], also_allowed: &[C]) {
    let failed = report.failed();
    for case in required {
        assert!(
            failed.contains(case),
            "the suite missed the flaw: {} passed\n{report}",
            case.name()
        );
    }
    for case in &failed {
        assert!(
            required.contains(case) || also_allowed.contains(case),
            "{} failed, but it is named for another behaviour than the flaw\n{report}",
            case.name()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_unbroken_references_pass() {
    for report in [
        Suite::new(|_| async { MemoryStore::new() }).run_all().await,
        suite(None).run_all().await,
        suite_with(None, LIMITED).run_all().await,
        suite_with(None, MANUAL).run_all().await,
    ] {
        assert!(report.passed(), "{report}");
        assert_eq!(report.results.len(), Case::ALL.len());
    }
    for report in [
        AdminSuite::new(|_| async { MemoryStore::new() })
            .run_all()
            .await,
        admin_suite(None).run_all().await,
    ] {
        assert!(report.passed(), "{report}");
        assert_eq!(report.results.len(), AdminCase::ALL.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_release_that_does_not_fence_the_owner_is_reported() {
    let report = admin_suite(Some(Flaw::ReleaseKeepsTheOwner))
        .run_all()
        .await;
    assert_reported(
        &report,
        &[
            AdminCase::ReleaseKeyFencesTheOwner,
            AdminCase::ReleaseKeyRacesTheOwnersComplete,
            AdminCase::MatchesTheStateMachineWithAdmin,
        ],
        &[],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listing_that_forgets_its_cursor_is_reported() {
    let report = admin_suite(Some(Flaw::ListForgetsTheCursor))
        .run_all()
        .await;
    // The filters' case pages through stuck work under a scope prefix too.
    assert_reported(
        &report,
        &[
            AdminCase::ListPagesThroughEveryRecordOnce,
            AdminCase::ListFiltersAndOrders,
        ],
        &[],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admin_that_reaches_other_namespaces_is_reported() {
    let report = admin_suite(Some(Flaw::PurgeReachesOtherNamespaces))
        .run_all()
        .await;
    assert_reported(
        &report,
        &[AdminCase::AdminReachesOnlyItsNamespace],
        // Cases that count or page through what the store holds (or what its purge
        // deleted) see other namespaces too.
        &[
            AdminCase::MatchesTheStateMachineWithAdmin,
            AdminCase::ListFiltersAndOrders,
            AdminCase::ListPagesThroughEveryRecordOnce,
            AdminCase::StatsCountWhatTheStoreHolds,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_skips_the_fence_on_complete_is_reported() {
    let report = suite(Some(Flaw::SkipsFenceOnComplete)).run_all().await;
    assert_reported(
        &report,
        &[
            Case::StaleOwnerIsFencedAfterTakeover,
            Case::WritesAfterTheEndAreFenced,
            Case::RetriedTerminalWritesKeepTheFirstBytes,
            Case::AStaleOwnerCannotStoreItsResult,
            Case::MatchesTheStateMachine,
        ],
        // Switching a failed record to completed is a write the fence must refuse too; a
        // stale complete after a takeover overwrites whenever the race lets it; a result
        // written without the fence's bookkeeping is not kept a retention after it.
        &[
            Case::RetriedTerminalWritesAreApplied,
            Case::StaleCompletesRaceTakeovers,
            Case::LateResultsStayReplayable,
            Case::ReleaseWithoutStepsForgetsTheKey,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_forgets_the_fingerprint_is_reported() {
    let report = suite(Some(Flaw::ForgetsFingerprintOnCompletion))
        .run_all()
        .await;
    assert_reported(
        &report,
        &[
            Case::FingerprintSurvivesCompletion,
            Case::CompleteStoresTheResponse,
            Case::CompletedRecordReplays,
            Case::MatchesTheStateMachine,
        ],
        // Every case that completes a record and then replays it meets the flaw.
        &[
            Case::DifferentFingerprintIsAMismatch,
            Case::StaleOwnerIsFencedAfterTakeover,
            Case::ReplaysAreByteExact,
            Case::LargeResponsesReplayOrAreRefused,
            Case::NamespacesAreIsolated,
            Case::GetHidesAbsentRecords,
            Case::StepsRunOnceAcrossTakeovers,
            Case::AStaleOwnerCannotStoreItsResult,
            Case::WaitingDuplicatesShareOneExecution,
            Case::EncryptedValuesAreNotPlaintextAtRest,
            Case::EncryptedRecordsRefuseCopiesAndTampering,
            Case::KeyPoliciesAndBudgetsRefuseBeforeStoring,
            Case::LateResultsStayReplayable,
            Case::LeaseAndExpiryEndExactly,
            Case::RetriedTerminalWritesKeepTheFirstBytes,
            Case::StaleCompletesRaceTakeovers,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_whose_takeover_forgets_steps_is_reported() {
    let report = suite(Some(Flaw::TakeoverForgetsSteps)).run_all().await;
    assert_reported(
        &report,
        &[
            Case::ExpiredLeaseIsTakenOver,
            Case::StepsRunOnceAcrossTakeovers,
            Case::ATakeoverFinishesACrashedCompensation,
            Case::EncryptedRecordsRefuseCopiesAndTampering,
            Case::MatchesTheStateMachine,
        ],
        &[
            Case::ReleaseLetsTheNextClaimTakeOver,
            Case::AReleaseAfterTheRetentionKeepsItsSteps,
            Case::NoLeaseEndsAtTheRetentionCliff,
            Case::ACheckpointKeepsTheRecordPastItsOwnLeaseEnd,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_that_keeps_an_empty_record_is_reported() {
    let report = suite(Some(Flaw::ReleaseKeepsAnEmptyRecord)).run_all().await;
    assert_reported(
        &report,
        &[Case::ReleaseWithoutStepsForgetsTheKey],
        &[Case::MatchesTheStateMachine],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_that_moves_an_ended_lease_is_reported() {
    let report = suite(Some(Flaw::ReleaseMovesTheLeaseEnd)).run_all().await;
    assert_reported(
        &report,
        &[Case::AReleaseAfterItsLeaseEndedKeepsItsEnd],
        &[Case::MatchesTheStateMachine],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_that_forgets_steps_is_reported() {
    let report = suite(Some(Flaw::ReleaseForgetsSteps)).run_all().await;
    assert_reported(
        &report,
        &[
            Case::ReleaseLetsTheNextClaimTakeOver,
            Case::AReleaseAfterTheRetentionKeepsItsSteps,
            Case::TokensStrictlyIncrease,
        ],
        &[
            Case::MatchesTheStateMachine,
            Case::StepsRunOnceAcrossTakeovers,
            // Each releases a record with a step first.
            Case::AReleaseAfterItsLeaseEndedKeepsItsEnd,
            Case::AnEndedLeaseIsNotRenewed,
            Case::ALateClaimOfTheSameAttemptTakesNothingOver,
            Case::ACheckpointKeepsTheRecordPastItsOwnLeaseEnd,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_whose_expiry_ignores_the_lease_is_reported() {
    for setup in [Setup::default(), MANUAL] {
        let report = suite_with(Some(Flaw::ExpiryIgnoresTheLease), setup)
            .run_all()
            .await;
        assert_reported(
            &report,
            &[Case::NoLeaseEndsAtTheRetentionCliff],
            &[
                Case::MatchesTheStateMachine,
                Case::ALiveLeaseIsNeverAbsent,
                Case::AReleaseAfterTheRetentionKeepsItsSteps,
                Case::AbsentRecordIsClaimedFresh,
                Case::ACheckpointKeepsTheRecordPastItsOwnLeaseEnd,
            ],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_checkpoint_expiry_from_the_lease_copy_is_reported() {
    for setup in [Setup::default(), MANUAL] {
        let report = suite_with(Some(Flaw::CheckpointExpiryFromTheLeaseCopy), setup)
            .run_all()
            .await;
        assert_reported(
            &report,
            &[Case::ACheckpointKeepsTheRecordPastItsOwnLeaseEnd],
            &[Case::MatchesTheStateMachine],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_without_its_retention_is_reported() {
    let report = suite_with(Some(Flaw::LeaseWithoutRetention), MANUAL)
        .run_all()
        .await;
    assert_reported(
        &report,
        &[
            Case::NoLeaseEndsAtTheRetentionCliff,
            Case::MatchesTheStateMachine,
        ],
        &[
            Case::ALiveLeaseIsNeverAbsent,
            Case::AReleaseAfterTheRetentionKeepsItsSteps,
            Case::AbsentRecordIsClaimedFresh,
            Case::LateResultsStayReplayable,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_renews_ended_leases_is_reported() {
    for setup in [Setup::default(), MANUAL] {
        let report = suite_with(Some(Flaw::RenewsEndedLeases), setup)
            .run_all()
            .await;
        assert_reported(
            &report,
            &[Case::AnEndedLeaseIsNotRenewed, Case::RenewExtendsTheLease],
            &[Case::MatchesTheStateMachine],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_claim_that_takes_over_is_reported() {
    for setup in [Setup::default(), MANUAL] {
        let report = suite_with(Some(Flaw::LateClaimTakesOver), setup)
            .run_all()
            .await;
        assert_reported(
            &report,
            &[Case::ALateClaimOfTheSameAttemptTakesNothingOver],
            &[Case::MatchesTheStateMachine],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_whose_claim_is_not_atomic_is_reported() {
    let report = suite(Some(Flaw::NonAtomicClaim)).run_all().await;
    // Sequentially it is correct, so only races can catch it. The two store-level races
    // of claims must; the driver's herd of waiting duplicates and a takeover racing a
    // stale complete may (whether their race window is hit varies from run to run).
    assert_reported(
        &report,
        &[
            Case::ConcurrentClaimsHaveOneWinner,
            Case::ConcurrentTakeoversHaveOneWinner,
        ],
        &[
            Case::WaitingDuplicatesShareOneExecution,
            Case::StaleCompletesRaceTakeovers,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_purges_live_leases_is_reported() {
    let report = suite(Some(Flaw::PurgesLiveLeases)).run_all().await;
    assert_reported(
        &report,
        &[
            Case::PurgeRemovesOnlyAbsentRecords,
            Case::ALiveLeaseIsNeverAbsent,
            Case::MatchesTheStateMachine,
        ],
        &[],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_forgets_a_live_lease_past_retention_is_reported() {
    let report = suite(Some(Flaw::ExpiredIsAbsentDespiteLease))
        .run_all()
        .await;
    assert_reported(
        &report,
        &[
            Case::ALiveLeaseIsNeverAbsent,
            Case::GetHidesAbsentRecords,
            Case::MatchesTheStateMachine,
        ],
        // A lease outliving a zero retention, read back or renewed, is the flaw itself, and
        // a result stored under such a lease is what stays replayable.
        &[
            Case::PurgeRemovesOnlyAbsentRecords,
            Case::ExtremeDurationsWork,
            Case::LateResultsStayReplayable,
            Case::AReleaseAfterTheRetentionKeepsItsSteps,
            Case::ACheckpointKeepsTheRecordPastItsOwnLeaseEnd,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_whose_namespaces_meet_is_reported() {
    let report = suite(Some(Flaw::UnterminatedNamespace)).run_all().await;
    assert_reported(&report, &[Case::NamespacesAreIsolated], &[]);
    let failure = report
        .results
        .iter()
        .find(|r| r.case == Case::NamespacesAreIsolated)
        .and_then(|r| r.failure.as_deref())
        .unwrap_or_default();
    assert!(failure.contains("replayed the response"), "{failure}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_whose_purge_reaches_other_namespaces_is_reported() {
    let report = suite(Some(Flaw::PurgeReachesOtherNamespaces))
        .run_all()
        .await;
    assert_reported(
        &report,
        &[Case::NamespacesAreIsolated],
        // Cases that count what a purge deleted see the other namespaces' records too.
        &[
            Case::PurgeRemovesOnlyAbsentRecords,
            Case::LifetimesAreToldApart,
            Case::MatchesTheStateMachine,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_refuses_long_durations_is_reported() {
    let report = suite(Some(Flaw::RefusesLongDurations)).run_all().await;
    assert_reported(&report, &[Case::ExtremeDurationsWork], &[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_whose_complete_is_not_atomic_is_reported() {
    let report = suite(Some(Flaw::NonAtomicComplete)).run_all().await;
    // Sequentially it is correct, so only a race of a stale write against a takeover can
    // catch it; the driver's races may meet it too.
    assert_reported(
        &report,
        &[Case::StaleCompletesRaceTakeovers],
        &[
            Case::AStaleOwnerCannotStoreItsResult,
            Case::WaitingDuplicatesShareOneExecution,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_rewrites_a_retried_result_is_reported() {
    let report = suite(Some(Flaw::RewritesOnRetry)).run_all().await;
    assert_reported(
        &report,
        &[Case::RetriedTerminalWritesKeepTheFirstBytes],
        // Random sequences retry a complete with other bytes now and then.
        &[Case::MatchesTheStateMachine],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_limit_that_ignores_the_steps_is_reported() {
    let report = suite_with(Some(Flaw::LimitIgnoresSteps), LIMITED)
        .run_all()
        .await;
    assert_reported(&report, &[Case::StepsCountTowardTheRecordLimit], &[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_limit_that_spares_failures_is_reported() {
    let report = suite_with(Some(Flaw::LimitSparesFailures), LIMITED)
        .run_all()
        .await;
    assert_reported(
        &report,
        &[
            Case::LargeResponsesReplayOrAreRefused,
            Case::StepsCountTowardTheRecordLimit,
        ],
        &[],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_live_at_its_end_is_reported() {
    for setup in [Setup::default(), MANUAL] {
        let report = suite_with(Some(Flaw::LeaseLiveAtItsEnd), setup)
            .run_all()
            .await;
        assert_reported(&report, &[Case::LeaseAndExpiryEndExactly], LEASE_ENDS_MEET);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_present_at_its_expiry_is_reported() {
    for setup in [Setup::default(), MANUAL] {
        let report = suite_with(Some(Flaw::PresentAtItsExpiry), setup)
            .run_all()
            .await;
        assert_reported(&report, &[Case::LeaseAndExpiryEndExactly], EXPIRY_ENDS_MEET);
    }
}

/// Cases that meet a lease live at its end whenever a claim lands in the millisecond a
/// zero lease was granted in, or exactly when a waited-out lease ends (always, on a manual
/// clock): every case that takes over an ended lease.
const LEASE_ENDS_MEET: &[Case] = &[
    Case::AbsentRecordIsClaimedFresh,
    Case::ACheckpointKeepsTheRecordPastItsOwnLeaseEnd,
    Case::ExpiredLeaseIsTakenOver,
    Case::TokensStrictlyIncrease,
    Case::ReleaseLetsTheNextClaimTakeOver,
    Case::ReleaseWithoutStepsForgetsTheKey,
    Case::AReleaseAfterTheRetentionKeepsItsSteps,
    Case::RenewExtendsTheLease,
    Case::AnEndedLeaseIsNotRenewed,
    Case::ALateClaimOfTheSameAttemptTakesNothingOver,
    Case::NoLeaseEndsAtTheRetentionCliff,
    Case::StaleOwnerIsFencedAfterTakeover,
    Case::WritesAfterTheEndAreFenced,
    Case::NamespacesAreIsolated,
    Case::GetHidesAbsentRecords,
    Case::PurgeRemovesOnlyAbsentRecords,
    Case::ConcurrentTakeoversHaveOneWinner,
    Case::StaleCompletesRaceTakeovers,
    Case::StepsRunOnceAcrossTakeovers,
    Case::AStaleOwnerCannotStoreItsResult,
    Case::EncryptedRecordsRefuseCopiesAndTampering,
    Case::ProviderKeysSurviveTakeovers,
    Case::ATakeoverFinishesACrashedCompensation,
    Case::MatchesTheStateMachine,
];

/// Cases that meet a record present at its expiry whenever an operation lands in the
/// millisecond a zero retention was granted in, or exactly at a waited-out expiry.
const EXPIRY_ENDS_MEET: &[Case] = &[
    Case::AbsentRecordIsClaimedFresh,
    Case::ALiveLeaseIsNeverAbsent,
    Case::LateResultsStayReplayable,
    Case::ReleaseWithoutStepsForgetsTheKey,
    Case::AReleaseAfterTheRetentionKeepsItsSteps,
    Case::WritesAfterTheEndAreFenced,
    Case::NamespacesAreIsolated,
    Case::GetHidesAbsentRecords,
    Case::PurgeRemovesOnlyAbsentRecords,
    Case::MatchesTheStateMachine,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_report_carries_the_whole_failure_of_the_model_based_case() {
    let report = suite(Some(Flaw::SkipsFenceOnComplete)).run_all().await;
    let failure = report
        .results
        .iter()
        .find(|r| r.case == Case::MatchesTheStateMachine)
        .and_then(|r| r.failure.clone())
        .expect("the model-based case failed");
    for part in [
        "shrunk in",
        "diverged",
        "the store answered",
        "the state machine answered",
        "the shrunk sequence",
        "Claim {",
    ] {
        assert!(failure.contains(part), "missing {part:?} in:\n{failure}");
    }
    // The report's text carries it all, indented under the case.
    let text = report.to_string();
    assert!(text.contains("FAILED matches_the_state_machine"), "{text}");
    assert!(text.contains("the shrunk sequence"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_keeps_the_expiry_of_a_late_result_is_reported() {
    for setup in [Setup::default(), MANUAL] {
        let report = suite_with(Some(Flaw::KeepsExpiryOnFinish), setup)
            .run_all()
            .await;
        assert_reported(
            &report,
            &[Case::LateResultsStayReplayable],
            // The manual-clock part of that case sees the same flaw.
            &[
                Case::MatchesTheStateMachine,
                Case::GetHidesAbsentRecords,
                Case::ALiveLeaseIsNeverAbsent,
            ],
        );
    }
}

/// The explorer over a store with `flaw`: each run a fresh namespace on the run's virtual
/// clock.
fn explore_flawed(flaw: Flaw, scenarios: &[Scenario]) -> ExploreReport {
    explore_flawed_with(flaw, scenarios, Timing::virtual_time())
}

fn explore_flawed_with(flaw: Flaw, scenarios: &[Scenario], timing: Timing) -> ExploreReport {
    let make = factory(Some(flaw), Setup::default());
    let target = Target::virtual_time(format!("{flaw:?}"), move |clock| {
        let store = make(Arc::new(clock), Namespace::fresh());
        async move { Ok::<_, std::convert::Infallible>(store.await) }
    });
    let report = Explorer::new(target)
        .timing(timing)
        .scenarios(scenarios.iter().copied())
        .run()
        .expect("the exploration runs");
    println!("{report}");
    report
}

/// The runs of `report` that broke `kind`, each with a fault of `faults` in its plan.
fn found_with(report: &ExploreReport, kind: &str, faults: &[Fault]) -> usize {
    report
        .violations()
        .filter(|v| v.broken.kind() == kind)
        .filter(|v| v.faults.iter().any(|f| faults.contains(&f.fault)))
        .count()
}

#[test]
fn the_explorer_reports_a_renewal_landing_after_the_release() {
    // The first run answers Retryable and releases; a copy of a heartbeat's renewal lands
    // after that, and this store extends the lease it ended: the key is held for nobody.
    let report = explore_flawed(Flaw::RenewsEndedLeases, &[Scenario::RetryableThenDone]);
    assert!(
        found_with(&report, "late grant", &[Fault::DuplicatedLate]) > 0,
        "{report}"
    );
}

#[test]
fn the_explorer_reports_a_late_claim_that_takes_over() {
    // A copy of the claim lands after the release: this store takes the key over for an
    // execute that is gone.
    let report = explore_flawed(Flaw::LateClaimTakesOver, &[Scenario::RetryableThenDone]);
    assert!(
        found_with(&report, "late grant", &[Fault::DuplicatedLate]) > 0,
        "{report}"
    );
}

#[test]
fn the_explorer_reports_an_undo_listed_interrupted_after_it_ended() {
    // The end marks are lost: whenever a takeover finishes the compensation, it reads an
    // undo that ended as one that started only, and lists it interrupted. No undo runs
    // twice and every step is listed once, so only the derived compensation tells.
    let report = explore_flawed(Flaw::DropsUndoEndMarks, &[Scenario::SagaFailsAfterSteps]);
    assert!(
        found_with(
            &report,
            "compensation misplaced",
            &[Fault::CrashAtPoint, Fault::CrashAfter]
        ) > 0,
        "{report}"
    );
    assert!(
        report
            .violations()
            .all(|v| v.broken.kind() == "compensation misplaced"),
        "{report}"
    );
}

#[test]
fn the_explorer_with_a_retention_equal_to_the_lease_finds_the_retention_cliff() {
    // A record whose owner crashed after a step is absent as soon as its lease lapses
    // when takeovers and checkpoints keep the expiry as it was: the retry claims afresh
    // and runs the step again. The retention must be as short as the lease for a run to
    // reach that edge; with the default hour, the same store passes.
    let mut timing = Timing::virtual_time();
    timing.retention = timing.lease;
    let short = explore_flawed_with(Flaw::ExpiryIgnoresTheLease, &[Scenario::Steps], timing);
    assert!(
        found_with(&short, "effect repeated", &[Fault::CrashAtPoint]) > 0,
        "{short}"
    );
    let long = explore_flawed(Flaw::ExpiryIgnoresTheLease, &[Scenario::Steps]);
    assert!(long.passed(), "{long}");
}

#[test]
fn the_explorer_reports_a_task_left_running() {
    // The explorer lets every task a run left finish before its check; one that never does
    // is reported, not waited for.
    let report = explore_flawed(Flaw::LeaksATaskPerClaim, &[Scenario::Plain]);
    let lingered = report
        .violations()
        .filter(|v| v.broken.kind() == "task lingers")
        .count();
    // Every run: the tasks its processes left, then the one the final check's claim left.
    assert_eq!(lingered, report.runs() * 2, "{report}");
    assert!(
        report
            .violations()
            .all(|v| v.broken.kind() == "task lingers"),
        "{report}"
    );
}

#[test]
fn the_unflawed_store_passes_the_explorer() {
    let make = factory(None, Setup::default());
    let target = Target::virtual_time("unflawed", move |clock| {
        let store = make(Arc::new(clock), Namespace::fresh());
        async move { Ok::<_, std::convert::Infallible>(store.await) }
    });
    let report = Explorer::new(target)
        .scenarios([Scenario::RetryableThenDone, Scenario::LongWork])
        .run()
        .expect("the exploration runs");
    assert!(report.passed(), "{report}");
}
