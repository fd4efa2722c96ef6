//! The explorer on the memory store: every scenario, every single fault at every fault
//! point it reaches, and a bounded sample of pairs, with no violation. And the explorer
//! can fail: stores broken on purpose are reported, each by the check its flaw breaks.

use std::convert::Infallible;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Admin, ClaimOutcome, ClaimRequest, Expiry, Key, Lease, MemoryStore, Record, RenewOutcome,
    StepName, Store, StoreError, WriteOutcome,
};
use idem_testkit::explore::{DEFAULT_SEED, Explorer, Mode, Report, Scenario, Target};

fn memory() -> Target {
    Target::virtual_time("memory", |clock| async move {
        Ok::<_, Infallible>(MemoryStore::with_clock(clock))
    })
}

/// Pairs sampled per scenario: enough to meet the two-fault paths (a fault in the
/// takeover after a crash) while the whole test stays within seconds.
const PAIRS: usize = 300;

#[test]
fn every_single_fault_and_sampled_pairs_on_memory() {
    let report = Explorer::new(memory())
        .mode(Mode::exhaustive_with_pairs(DEFAULT_SEED, PAIRS))
        .run()
        .expect("the exploration runs");
    println!("{report}");
    assert!(report.passed(), "{report}");
    assert!(
        report.runs() > report.fault_points() * 3,
        "{}",
        report.summary()
    );
}

/// How a store is broken on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    /// `complete` answers Applied and stores nothing.
    LosesCompletedResults,
    /// `claim` takes over any in-progress record, live lease or not (an operator release,
    /// then the claim): every claim is answered Claimed.
    ClaimsEveryKey,
    /// `checkpoint` answers Applied and stores nothing.
    ForgetsCheckpoints,
}

/// The memory store with one flaw.
struct Flawed {
    inner: MemoryStore,
    flaw: Flaw,
}

#[async_trait]
impl Store for Flawed {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let outcome = self.inner.claim(request).await?;
        if self.flaw == Flaw::ClaimsEveryKey && matches!(outcome, ClaimOutcome::InFlight { .. }) {
            self.inner.release_key(&request.key).await?;
            return self.inner.claim(request).await;
        }
        Ok(outcome)
    }

    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        if self.flaw == Flaw::LosesCompletedResults {
            return Ok(WriteOutcome::Applied);
        }
        self.inner.complete(lease, response).await
    }

    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.inner.fail(lease, response).await
    }

    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        self.inner.release(lease).await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        self.inner.renew(lease, extend).await
    }

    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        if self.flaw == Flaw::ForgetsCheckpoints && !step.as_str().starts_with("idem.") {
            return Ok(WriteOutcome::Applied);
        }
        self.inner.checkpoint(lease, step, value).await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }

    fn expiry(&self) -> Expiry {
        self.inner.expiry()
    }
}

fn explore_flawed(flaw: Flaw, scenarios: &[Scenario]) -> Report {
    let target = Target::virtual_time(format!("{flaw:?}"), move |clock| async move {
        Ok::<_, Infallible>(Flawed {
            inner: MemoryStore::with_clock(clock),
            flaw,
        })
    });
    Explorer::new(target)
        .scenarios(scenarios.iter().copied())
        .run()
        .expect("the exploration runs")
}

/// The report has violations of `kind`, and prints them.
fn assert_found(report: &Report, kind: &str) {
    println!("{report}");
    assert!(
        report.by_kind().contains_key(kind),
        "expected violations of kind `{kind}`:\n{report}"
    );
}

#[test]
fn a_store_that_loses_completed_results_is_reported() {
    let report = explore_flawed(Flaw::LosesCompletedResults, &[Scenario::Plain]);
    // Even the fault-free run: the retry after the result runs the work again.
    assert_found(&report, "result lost");
    assert_found(&report, "effect repeated");
}

#[test]
fn a_store_that_answers_claimed_to_every_claim_is_reported() {
    let report = explore_flawed(
        Flaw::ClaimsEveryKey,
        &[Scenario::Plain, Scenario::WaitDuplicate],
    );
    // A retry after a crash, or the waiting duplicate, is granted the key while the
    // first owner's lease lives, and runs the effect again.
    assert_found(&report, "effect repeated");
    assert!(
        report.violations().any(|v| {
            matches!(&v.broken, idem_testkit::explore::Broken::Repeated { why, .. } if why.contains("lease was live"))
        }),
        "{report}"
    );
}

#[test]
fn a_store_that_forgets_checkpoints_is_reported() {
    let report = explore_flawed(Flaw::ForgetsCheckpoints, &[Scenario::Steps]);
    // A crash after a step's checkpoint "landed": the takeover runs the step again.
    assert_found(&report, "effect repeated");
}
