//! What the work of one process records its effects with and waits at fault points
//! through.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{Context, store::WriteOutcome};

use crate::explore::faults::{Fault, Kill, Process, ProcessStore, World};
use crate::explore::ledger::{Effect, Event};

/// What the work of one process uses to record its effects and to wait at fault points.
#[derive(Clone)]
pub(crate) struct Probe {
    pub(crate) process: Process,
    pub(crate) world: Arc<World>,
    pub(crate) store: Arc<ProcessStore>,
}

impl Probe {
    /// An await point: the explorer may drop the caller, crash the process or stall here.
    pub(crate) async fn point(&self, name: &str) {
        if self.world.crashed(self.process) {
            return self.world.dead().await;
        }
        match self.world.next_point(self.process, name) {
            Some(Fault::DropAtPoint) => self.world.kill(self.process, Kill::Drop).await,
            Some(Fault::CrashAtPoint) => {
                self.world.kill(self.process, Kill::Crash).await;
                self.world.dead().await;
            }
            Some(Fault::StallAtPoint) => self.work_for(self.world.timing.stall).await,
            Some(Fault::PauseAtPoint) => {
                let until = self.world.cut_off(self.process, Fault::PauseAtPoint);
                self.world.ledger.push(Event::WorkTime {
                    process: self.process,
                    duration: self.world.timing.stall,
                });
                tokio::time::sleep_until(until).await;
            }
            Some(Fault::PartitionAtPoint) => {
                self.world.cut_off(self.process, Fault::PartitionAtPoint);
            }
            _ => {}
        }
    }

    /// Records an effect; a crashed process has none.
    pub(crate) async fn effect(&self, effect: Effect) {
        if self.world.crashed(self.process) {
            return self.world.dead().await;
        }
        self.world.ledger.push(Event::Effect {
            process: self.process,
            effect,
            at: self.world.now_of(self.process),
        });
    }

    /// The work's own time: a sleep, counted toward the process's bound.
    pub(crate) async fn work_for(&self, duration: Duration) {
        self.world.ledger.push(Event::WorkTime {
            process: self.process,
            duration,
        });
        tokio::time::sleep(duration).await;
    }

    /// The work's own commit, bounded by the store timeout as an application would bound
    /// it (and counted as the work's own time).
    pub(super) async fn commit(
        &self,
        completion: &idem_core::store::Completion,
    ) -> Result<WriteOutcome, String> {
        let timeout = self.world.timing.store_timeout;
        self.world.ledger.push(Event::WorkTime {
            process: self.process,
            duration: timeout,
        });
        match tokio::time::timeout(timeout, self.store.commit(completion)).await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err("the commit timed out".into()),
        }
    }

    pub(super) fn started(&self, ctx: &Context) {
        self.world.ledger.push(Event::WorkStarted {
            process: self.process,
            token: ctx.token(),
            resumed: ctx.resumed(),
        });
    }

    pub(super) fn returned(&self) {
        self.world.ledger.push(Event::WorkReturned {
            process: self.process,
        });
    }

    pub(super) fn retryable_already_returned(&self) -> bool {
        self.world
            .retryable_returned
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(super) fn mark_retryable_returned(&self) {
        self.world
            .retryable_returned
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
