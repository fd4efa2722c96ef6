//! Flaws of the fenced writes and what they store: the fence, the fingerprint, atomicity,
//! retried results, the record limit, the expiry of a late result.

use idem_testkit::Case;

use crate::common::{Flaw, Setup};
use crate::support::{LIMITED, MANUAL, assert_reported, suite, suite_with};

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
