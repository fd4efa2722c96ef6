//! Flaws that let namespaces meet.

use idem_testkit::Case;

use crate::common::Flaw;
use crate::support::{assert_reported, suite};

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
