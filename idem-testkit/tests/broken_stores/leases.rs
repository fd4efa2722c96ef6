//! Flaws of claims, takeovers, renewals and releases.

use idem_testkit::Case;

use crate::common::{Flaw, Setup};
use crate::support::{MANUAL, assert_reported, suite, suite_with};

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
