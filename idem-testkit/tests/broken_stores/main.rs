//! The suite proves it can fail: deliberately broken stores are reported, each by the cases
//! that guard the behaviour it breaks, and by no case named for another behaviour.
//!
//! `support` builds the suites and checks what a report names; the flaws are grouped by
//! what they break: `admin`, `writes` (fenced results and what they store), `leases`
//! (claims, takeovers, renewals, releases), `expiry` (when leases and records end),
//! `namespaces`, and `explorer` (the flaws the fault explorer must find).

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod expiry;
mod explorer;
mod leases;
mod namespaces;
mod support;
mod writes;

use idem_core::MemoryStore;
use idem_testkit::{AdminCase, AdminSuite, Case, Suite};

use common::Flaw;
use support::{LIMITED, MANUAL, admin_suite, suite, suite_with};

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
