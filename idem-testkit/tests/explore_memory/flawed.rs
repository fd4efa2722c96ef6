//! The memory store broken on purpose, one flaw at a time, and the explorer over it.

use std::convert::Infallible;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::record::ValuePart;
use idem_core::{
    Admin, Key, MemoryStore, Record, State, Store, StoreError, key::StepName, record::Lease,
    store::ClaimOutcome, store::ClaimRequest, store::Expiry, store::Operation, store::RenewOutcome,
    store::WriteOutcome,
};
use idem_testkit::explore::{Explorer, PlacedFault, Report, RunReport, Scenario, Target};

/// How a store is broken on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flaw {
    /// `complete` answers Applied and stores nothing.
    LosesCompletedResults,
    /// `claim` takes over any in-progress record, live lease or not (an operator release,
    /// then the claim): every claim is answered Claimed.
    ClaimsEveryKey,
    /// `checkpoint` answers Applied and stores nothing.
    ForgetsCheckpoints,
    /// `renew` answers Renewed with the lease as it was, extending nothing.
    RenewsWithoutExtending,
    /// Every checkpoint of a work's step fails before it applies.
    FailsStepCheckpoints,
    /// The undos' marks (`idem.undo:STEP`) are refused as too large: no undo ever runs,
    /// and each is reported pending.
    RefusesUndoMarks,
    /// `checkpoint`, `complete` and `fail` fence on the record's state alone: any write
    /// to a record in progress applies, whichever owner holds it now.
    FenceChecksOnlyState,
    /// A `complete` retried by the owner whose first try landed answers Fenced.
    RetriedCompleteFenced,
}

/// The memory store with one flaw.
struct Flawed {
    inner: MemoryStore,
    flaw: Flaw,
}

impl Flawed {
    /// `lease` as the record's current owner, when the flaw lets any owner's write
    /// through to a record in progress.
    async fn fence(&self, lease: &Lease) -> Result<Lease, StoreError> {
        if self.flaw != Flaw::FenceChecksOnlyState {
            return Ok(lease.clone());
        }
        Ok(match self.inner.get(&lease.key).await? {
            Some(record) if record.state == State::InProgress => {
                let mut current = lease.clone();
                current.token = record.token;
                current.attempt = record.attempt;
                current
            }
            _ => lease.clone(),
        })
    }
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
        if self.flaw == Flaw::RetriedCompleteFenced
            && self.inner.get(&lease.key).await?.is_some_and(|record| {
                record.state == State::Completed && record.token == lease.token
            })
        {
            return Ok(WriteOutcome::Fenced);
        }
        self.inner
            .complete(&self.fence(lease).await?, response)
            .await
    }

    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.inner.fail(&self.fence(lease).await?, response).await
    }

    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        self.inner.release(lease).await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        if self.flaw == Flaw::RenewsWithoutExtending {
            // Fenced exactly when a correct store would fence, so only the extension is
            // missing.
            let owned = self.inner.get(&lease.key).await?.is_some_and(|record| {
                record.state == State::InProgress
                    && record.token == lease.token
                    && record.attempt == lease.attempt
            });
            return Ok(if owned {
                RenewOutcome::Renewed(lease.clone())
            } else {
                RenewOutcome::Fenced
            });
        }
        self.inner.renew(lease, extend).await
    }

    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        let own = step.as_str().starts_with("idem.");
        match self.flaw {
            Flaw::ForgetsCheckpoints if !own => return Ok(WriteOutcome::Applied),
            Flaw::FailsStepCheckpoints if !own => {
                return Err(StoreError::Unavailable {
                    operation: Operation::Checkpoint,
                    source: "the checkpoint never reached the store".into(),
                });
            }
            Flaw::RefusesUndoMarks if step.as_str().starts_with("idem.undo") => {
                return Err(StoreError::TooLarge {
                    part: ValuePart::Step(step.as_str().to_owned()),
                    size: value.len() + step.as_str().len(),
                    limit: 0,
                });
            }
            _ => {}
        }
        self.inner
            .checkpoint(&self.fence(lease).await?, step, value)
            .await
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

pub(crate) fn flawed(flaw: Flaw) -> Target {
    Target::virtual_time(format!("{flaw:?}"), move |clock| async move {
        Ok::<_, Infallible>(Flawed {
            inner: MemoryStore::with_clock(clock),
            flaw,
        })
    })
}

pub(crate) fn explore_flawed(flaw: Flaw, scenarios: &[Scenario]) -> Report {
    Explorer::new(flawed(flaw))
        .scenarios(scenarios.iter().copied())
        .run()
        .expect("the exploration runs")
}

/// One run of `scenario` with `faults` on a store broken by `flaw`, printed.
pub(crate) fn run_flawed(flaw: Flaw, scenario: Scenario, faults: Vec<PlacedFault>) -> RunReport {
    let run = Explorer::new(flawed(flaw))
        .run_plan(scenario, faults)
        .expect("the exploration runs");
    println!("{run}");
    run
}
