//! One process's handle on the store under test: each call numbered, its planned fault
//! injected, and what the store answered recorded in the ledger.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Key, Record, Store, StoreError, key::StepName, record::Lease, store::ClaimOutcome,
    store::ClaimRequest, store::Completion, store::Expiry, store::Operation, store::RenewOutcome,
    store::WriteOutcome,
};

use super::world::{Apply, Observe, World, injected};
use super::{Fault, Kill, Process};
use crate::explore::ledger::{Effect, Event};

/// One process's handle on the store under test: numbers its calls and injects the run's
/// faults.
pub(crate) struct ProcessStore {
    pub(crate) process: Process,
    pub(crate) world: Arc<World>,
}

impl ProcessStore {
    async fn call<O: Send + 'static>(
        &self,
        operation: Operation,
        step: Option<String>,
        by_work: bool,
        apply: Apply<O>,
        observe: Observe<O>,
    ) -> Result<O, StoreError> {
        let (world, process) = (&self.world, self.process);
        if world.crashed(process) {
            world.dead().await;
            return Err(injected(operation));
        }
        let (paused, partitioned) = world.cut(process);
        if let Some(until) = paused {
            // A paused process sends nothing: the call leaves once it resumes (if its
            // caller, whose timers ran on meanwhile, still waits for it).
            tokio::time::sleep_until(until).await;
        }
        world.ledger.push(Event::Call {
            process,
            operation,
            step,
            by_work,
        });
        if partitioned {
            // Unnumbered: no other fault can strike a call that never leaves.
            return Err(injected(operation));
        }
        let fault = world.next_call(process, operation);
        match fault {
            None | Some(Fault::DropAtPoint | Fault::CrashAtPoint | Fault::StallAtPoint) => {
                world.apply(process, operation, None, apply, observe).await
            }
            Some(Fault::ErrorBefore) => Err(injected(operation)),
            Some(Fault::LostAnswer) => {
                let _ = world.apply(process, operation, None, apply, observe).await;
                Err(injected(operation))
            }
            Some(Fault::HangThenApply) => {
                world
                    .apply(process, operation, Some(world.timing.hang), apply, observe)
                    .await
            }
            Some(Fault::HangNoApply) => {
                tokio::time::sleep(world.timing.hang).await;
                Err(injected(operation))
            }
            Some(Fault::DropBefore) => {
                world.kill(process, Kill::Drop).await;
                // Only a task that outlived the caller gets here: its call goes on.
                world.apply(process, operation, None, apply, observe).await
            }
            Some(Fault::DropAfter) => {
                let result = world.apply(process, operation, None, apply, observe).await;
                world.kill(process, Kill::Drop).await;
                result
            }
            Some(Fault::CrashBefore) => {
                world.kill(process, Kill::Crash).await;
                world.dead().await;
                Err(injected(operation))
            }
            Some(Fault::CrashAfter) => {
                let _ = world.apply(process, operation, None, apply, observe).await;
                world.kill(process, Kill::Crash).await;
                world.dead().await;
                Err(injected(operation))
            }
            Some(fault @ (Fault::DuplicatedLate | Fault::DuplicatedAfterTakeover)) => {
                // The work's own commit is its transaction, which no network replays; the
                // driver's writes are what a copy can repeat.
                if by_work {
                    return world.apply(process, operation, None, apply, observe).await;
                }
                world.keep_copy(
                    process,
                    operation,
                    fault == Fault::DuplicatedAfterTakeover,
                    Arc::clone(&apply),
                    Arc::clone(&observe),
                );
                world.apply(process, operation, None, apply, observe).await
            }
            Some(
                fault @ (Fault::PartitionAtCall | Fault::PauseAtPoint | Fault::PartitionAtPoint),
            ) => {
                world.cut_off(process, fault);
                Err(injected(operation))
            }
        }
    }

    /// `complete` made by the work itself inside "its own transaction": the work's effect
    /// is recorded exactly when the store applies the completion, as a business row
    /// committed with it would be.
    pub(crate) async fn commit(&self, completion: &Completion) -> Result<WriteOutcome, StoreError> {
        let (lease, bytes) = (completion.lease().clone(), completion.bytes().to_vec());
        let process = self.process;
        let world = Arc::clone(&self.world);
        self.call(
            Operation::Complete,
            None,
            true,
            Arc::new(move |store| {
                let (lease, bytes) = (lease.clone(), bytes.clone());
                Box::pin(async move { store.complete(&lease, &bytes).await })
            }),
            Arc::new(move |outcome| match outcome {
                WriteOutcome::Applied => vec![
                    Event::Effect {
                        process,
                        effect: Effect::Work,
                        at: world.now_of(process),
                    },
                    Event::Finished {
                        process,
                        at: world.now_of(process),
                    },
                ],
                WriteOutcome::Fenced => Vec::new(),
            }),
        )
        .await
    }
}

fn finished(world: &Arc<World>, process: Process) -> Observe<WriteOutcome> {
    let world = Arc::clone(world);
    Arc::new(move |outcome| match outcome {
        WriteOutcome::Applied => vec![Event::Finished {
            process,
            at: world.now_of(process),
        }],
        WriteOutcome::Fenced => Vec::new(),
    })
}

fn nothing<O>() -> Observe<O> {
    Arc::new(|_| Vec::new())
}

#[async_trait]
impl Store for ProcessStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let request = request.clone();
        let process = self.process;
        self.call(
            Operation::Claim,
            None,
            false,
            Arc::new(move |store| {
                let request = request.clone();
                Box::pin(async move { store.claim(&request).await })
            }),
            Arc::new(move |outcome| match outcome {
                ClaimOutcome::Claimed { lease, resumed, .. } => vec![Event::Claimed {
                    process,
                    token: lease.token,
                    lease_until: lease.lease_until,
                    resumed: *resumed,
                }],
                _ => Vec::new(),
            }),
        )
        .await
    }

    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        let (lease, response) = (lease.clone(), response.to_vec());
        self.call(
            Operation::Complete,
            None,
            false,
            Arc::new(move |store| {
                let (lease, response) = (lease.clone(), response.clone());
                Box::pin(async move { store.complete(&lease, &response).await })
            }),
            finished(&self.world, self.process),
        )
        .await
    }

    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        let (lease, response) = (lease.clone(), response.to_vec());
        self.call(
            Operation::Fail,
            None,
            false,
            Arc::new(move |store| {
                let (lease, response) = (lease.clone(), response.clone());
                Box::pin(async move { store.fail(&lease, &response).await })
            }),
            finished(&self.world, self.process),
        )
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        let lease = lease.clone();
        let process = self.process;
        self.call(
            Operation::Release,
            None,
            false,
            Arc::new(move |store| {
                let lease = lease.clone();
                Box::pin(async move { store.release(&lease).await })
            }),
            Arc::new(move |outcome| match outcome {
                WriteOutcome::Applied => vec![Event::Released { process }],
                WriteOutcome::Fenced => Vec::new(),
            }),
        )
        .await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        let lease = lease.clone();
        let (process, asked) = (self.process, lease.lease_until);
        self.call(
            Operation::Renew,
            None,
            false,
            Arc::new(move |store| {
                let lease = lease.clone();
                Box::pin(async move { store.renew(&lease, extend).await })
            }),
            Arc::new(move |outcome| match outcome {
                RenewOutcome::Renewed(lease) => vec![Event::Renewed {
                    process,
                    asked,
                    lease_until: lease.lease_until,
                }],
                RenewOutcome::Fenced => Vec::new(),
            }),
        )
        .await
    }

    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        let (lease, step, value) = (lease.clone(), step.clone(), value.to_vec());
        let (process, name) = (self.process, step.as_str().to_owned());
        self.call(
            Operation::Checkpoint,
            Some(name.clone()),
            false,
            Arc::new(move |store| {
                let (lease, step, value) = (lease.clone(), step.clone(), value.clone());
                Box::pin(async move { store.checkpoint(&lease, &step, &value).await })
            }),
            Arc::new(move |outcome| match outcome {
                WriteOutcome::Applied => vec![Event::Checkpointed {
                    process,
                    step: name.clone(),
                }],
                WriteOutcome::Fenced => Vec::new(),
            }),
        )
        .await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let key = key.clone();
        self.call(
            Operation::Get,
            None,
            false,
            Arc::new(move |store| {
                let key = key.clone();
                Box::pin(async move { store.get(&key).await })
            }),
            nothing(),
        )
        .await
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        // Not a transition of any execution: passed through, never faulted.
        self.world.inner.purge_expired(limit).await
    }

    fn expiry(&self) -> Expiry {
        self.world.inner.expiry()
    }

    fn max_record_bytes(&self) -> Option<usize> {
        self.world.inner.max_record_bytes()
    }
}
