//! Flaws of when leases and records end: expiry kept past the lease, the retention,
//! purges, the exact end of a lease and of a record, and durations past a century.

use idem_testkit::Case;

use crate::common::{Flaw, Setup};
use crate::support::{MANUAL, assert_reported, suite, suite_with};

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
async fn a_store_that_refuses_long_durations_is_reported() {
    let report = suite(Some(Flaw::RefusesLongDurations)).run_all().await;
    assert_reported(&report, &[Case::ExtremeDurationsWork], &[]);
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
