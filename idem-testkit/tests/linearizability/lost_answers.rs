//! Histories where answers go missing as they do through a faulty network: a call lands
//! and its answer is lost, or it never lands.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::key::StepName;
use idem_core::record::Lease;
use idem_core::store::{
    ClaimOutcome, ClaimRequest, Operation, RenewOutcome, StoreError, WriteOutcome,
};
use idem_core::{Key, MemoryStore, Record, Store};
use idem_testkit::linearizability::{self, CheckError, Checker, Workload};

use super::{Flaw, flawed};

/// What becomes of one call.
enum Fate {
    Answered,
    /// Takes effect; its answer is lost.
    LandsUnanswered,
    /// Never reaches the store.
    NeverLands,
}

/// A store behind a network that loses about one answer in twenty (three in five of
/// those calls land, the others never do).
struct LossyStore {
    inner: Arc<dyn Store>,
    rng: Mutex<fastrand::Rng>,
}

impl LossyStore {
    fn new(inner: Arc<dyn Store>, seed: u64) -> Self {
        Self {
            inner,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
        }
    }

    fn fate(&self) -> Fate {
        let mut rng = self.rng.lock().unwrap();
        match rng.u32(0..100) {
            0..3 => Fate::LandsUnanswered,
            3..5 => Fate::NeverLands,
            _ => Fate::Answered,
        }
    }

    /// Runs `call` on the inner store as `fate` says.
    async fn call<T, F>(
        &self,
        operation: Operation,
        call: impl FnOnce(Arc<dyn Store>) -> F + Send + 'static,
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
        T: Send + 'static,
    {
        let lost = || StoreError::Unavailable {
            operation,
            source: "the connection was cut".into(),
        };
        let inner = Arc::clone(&self.inner);
        match self.fate() {
            Fate::Answered => call(inner).await,
            Fate::LandsUnanswered => {
                call(inner).await?;
                Err(lost())
            }
            Fate::NeverLands => Err(lost()),
        }
    }
}

#[async_trait]
impl Store for LossyStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let request = request.clone();
        self.call(
            Operation::Claim,
            move |s| async move { s.claim(&request).await },
        )
        .await
    }

    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        let (lease, response) = (lease.clone(), response.to_vec());
        self.call(Operation::Complete, move |s| async move {
            s.complete(&lease, &response).await
        })
        .await
    }

    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        let (lease, response) = (lease.clone(), response.to_vec());
        self.call(Operation::Fail, move |s| async move {
            s.fail(&lease, &response).await
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        let lease = lease.clone();
        self.call(Operation::Release, move |s| async move {
            s.release(&lease).await
        })
        .await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        let lease = lease.clone();
        self.call(Operation::Renew, move |s| async move {
            s.renew(&lease, extend).await
        })
        .await
    }

    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        let (lease, step, value) = (lease.clone(), step.clone(), value.to_vec());
        self.call(Operation::Checkpoint, move |s| async move {
            s.checkpoint(&lease, &step, &value).await
        })
        .await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let key = key.clone();
        self.call(Operation::Get, move |s| async move { s.get(&key).await })
            .await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }
}

/// With an answer in twenty lost, no history is unexplained, in either mode of moments.
/// The histories are recorded on the wall clock, so their searches vary with the
/// machine's load: at most two searches of the twelve may run out of their budget (a
/// hundred states a call, where the runs that set it took about one; a loaded CI run saw
/// two, in the ordered mode, both decided in the other), and every history must be
/// decided in at least one mode (a history decided in neither is recorded once more, and
/// that one must be). Searching such a history again with the default budget
/// took minutes of a loaded debug build, so it is not; the length of a search is pinned
/// by the hand-written histories. A search that decides and finds a history unexplained
/// always fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_answers_are_explained() {
    let mut too_long = Vec::new();
    for seed in 1..=6 {
        // A history decided in neither mode is recorded once more (the same seed, new
        // timings): a loaded CI run saw one; the second must be decided in a mode.
        for recording in 1..=2 {
            let store = Arc::new(MemoryStore::new()) as Arc<dyn Store>;
            match check_behind_lost_answers(store, seed).await {
                Ok(undecided) if undecided.len() >= 2 && recording == 1 => continue,
                Ok(undecided) => {
                    too_long.extend(undecided.into_iter().map(|mode| (seed, mode)));
                    break;
                }
                Err(unexplained) => panic!("{unexplained}"),
            }
        }
    }
    let mut seeds: Vec<u64> = too_long.iter().map(|(seed, _)| *seed).collect();
    seeds.dedup();
    assert!(
        seeds.len() == too_long.len() && too_long.len() <= 2,
        "out of budget: {too_long:?} (a seed twice: decided in neither mode)"
    );
}

/// What the acceptance above rests on can still fail: a store whose complete skips the
/// fence, behind the same lossy network, shows an unexplained history within a few seeds
/// (as the lossless runs catch it, `SEEDS` at most), not merely one out of budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_answers_do_not_hide_a_flawed_store() {
    for seed in 1..=super::SEEDS {
        let store = flawed(Some(Flaw::SkipsFenceOnComplete)).await;
        if let Err(unexplained) = check_behind_lost_answers(store, seed).await {
            println!("seed {seed}: {unexplained}");
            return;
        }
    }
    panic!(
        "{} histories of a store whose complete skips the fence, with answers lost, were all explained",
        super::SEEDS
    );
}

/// Records one history of `inner` behind a [`LossyStore`] and checks it in both modes of
/// moments. Answers the modes whose search ran out of its budget, or the first
/// unexplained history.
async fn check_behind_lost_answers(
    inner: Arc<dyn Store>,
    seed: u64,
) -> Result<Vec<&'static str>, String> {
    let workload = Workload::default().seed(seed);
    let store = Arc::new(LossyStore::new(inner, seed)) as Arc<dyn Store>;
    let history = linearizability::record_on(&[store], &workload).await;
    let lost = history.lost();
    assert!(
        lost > workload.total_operations() / 40,
        "seed {seed}: the network lost {lost} answers, too few to test anything"
    );
    let budget = 100 * workload.total_operations() as u64;
    let mut undecided = Vec::new();
    for (mode, checker) in [
        ("ordered", Checker::default()),
        ("any order", Checker::default().moments_in_any_order()),
    ] {
        match checker.budget(budget).check(&history) {
            Ok(checked) => {
                assert_eq!(checked.lost, lost);
                println!(
                    "seed {seed}, {mode}: {lost} lost, the longest search {} states",
                    checked.longest_search
                );
            }
            Err(err @ CheckError::TooLong { .. }) => {
                println!("seed {seed}, {mode}: {err}");
                undecided.push(mode);
            }
            Err(err @ CheckError::Unexplained(_)) => {
                return Err(format!("seed {seed}, {mode}, {lost} lost: {err}"));
            }
            Err(err) => panic!("seed {seed}, {mode}, {lost} lost: {err}"),
        }
    }
    Ok(undecided)
}
