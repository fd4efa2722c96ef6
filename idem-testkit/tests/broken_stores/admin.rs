//! Admin flaws: an operator's release that does not fence, a listing that forgets its
//! cursor, an admin that reaches other namespaces.

use idem_testkit::AdminCase;

use crate::common::Flaw;
use crate::support::{admin_suite, assert_reported};

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
