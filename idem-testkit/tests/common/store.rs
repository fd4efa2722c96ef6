//! The `Store` calls of a [`FlawedStore`]: the state machine's transitions, each flaw
//! bending the one it breaks.

use std::time::Duration;

use async_trait::async_trait;
use idem_core::machine::{self, Transition};
use idem_core::record::ValuePart;
use idem_core::{
    Fingerprint, Key, Record, State, Store, StoreError, key::StepName, record::AttemptId,
    record::Lease, store::ClaimOutcome, store::ClaimRequest, store::Operation, store::RenewOutcome,
    store::WriteOutcome,
};

use super::flaw::Flaw;
use super::flawed_store::{FlawedStore, machine_claim, steps_size};

#[async_trait]
impl Store for FlawedStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.refuse(Operation::Claim, &[request.lease, request.retention])?;
        if self.has(Flaw::LeaksATaskPerClaim) {
            drop(tokio::spawn(std::future::pending::<()>()));
        }
        if self.has(Flaw::ExpiryIgnoresTheLease) {
            return Ok(self.apply(&request.key, |r, now| {
                let mut step = machine_claim(r, request, now);
                if let (Some(written), Some(before)) = (step.write.as_mut(), r)
                    && !before.is_absent(now)
                {
                    written.expires_at = before.expires_at;
                }
                step
            }));
        }
        if self.has(Flaw::LeaseWithoutRetention) {
            let outcome = self.apply(&request.key, |r, now| machine_claim(r, request, now));
            return Ok(match outcome {
                ClaimOutcome::Claimed {
                    lease,
                    resumed,
                    steps,
                    ..
                } => ClaimOutcome::claimed(lease.with_retention(Duration::ZERO), resumed, steps),
                other => other,
            });
        }
        if self.has(Flaw::LateClaimTakesOver) {
            return Ok(self.apply(&request.key, |r, now| {
                // The attempt whose lease ended looks like any other to this store.
                let ended_own = r.filter(|record| {
                    record.state == State::InProgress
                        && record.attempt == request.attempt
                        && !record.lease_is_live(now)
                        && !record.is_absent(now)
                });
                match ended_own {
                    Some(record) => {
                        let mut other = record.clone();
                        other.attempt = AttemptId::from_bytes([0xee; 16]);
                        machine_claim(Some(&other), request, now)
                    }
                    None => machine_claim(r, request, now),
                }
            }));
        }
        if self.has(Flaw::TakeoverForgetsSteps) {
            let outcome = self.apply(&request.key, |r, now| machine_claim(r, request, now));
            return Ok(match outcome {
                ClaimOutcome::Claimed {
                    lease,
                    resumed: true,
                    ..
                } => ClaimOutcome::claimed(lease, true, Default::default()),
                other => other,
            });
        }
        if !self.has(Flaw::NonAtomicClaim) {
            return Ok(self.apply(&request.key, |r, now| machine_claim(r, request, now)));
        }
        let name = self.name(&request.key);
        let existing = self
            .backend
            .lock()
            .expect("not poisoned")
            .get(&name)
            .cloned();
        tokio::task::yield_now().await;
        let Transition { outcome, write } =
            machine_claim(existing.as_ref(), request, self.clock.now());
        if let Some(record) = write {
            self.backend
                .lock()
                .expect("not poisoned")
                .insert(name, record);
        }
        Ok(outcome)
    }

    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.refuse_response(response, State::Completed)?;
        if self.has(Flaw::CompleteOverTwoRoundTrips) {
            return Ok(self
                .read_then_write(&lease.key, |r, now| {
                    machine::complete(r, lease, response, now)
                })
                .await);
        }
        if self.has(Flaw::NonAtomicComplete) {
            let name = self.name(&lease.key);
            let existing = self
                .backend
                .lock()
                .expect("not poisoned")
                .get(&name)
                .cloned();
            let Transition { outcome, write } =
                machine::complete(existing.as_ref(), lease, response, self.clock.now());
            // The fence was checked on what was read; the write lands on whatever is there
            // by now.
            tokio::task::yield_now().await;
            if let Some(record) = write {
                self.backend
                    .lock()
                    .expect("not poisoned")
                    .insert(name, record);
            }
            return Ok(outcome);
        }
        if !matches!(
            self.flaw,
            Some(Flaw::SkipsFenceOnComplete | Flaw::ForgetsFingerprintOnCompletion)
        ) {
            return self.finish(lease, response, State::Completed);
        }
        Ok(
            self.apply(&lease.key, |record, now| match (self.flaw, record) {
                (Some(Flaw::SkipsFenceOnComplete), Some(record)) => {
                    let mut written = record.clone();
                    written.state = State::Completed;
                    written.response = Some(response.to_vec());
                    Transition {
                        outcome: WriteOutcome::Applied,
                        write: Some(written),
                    }
                }
                (Some(Flaw::ForgetsFingerprintOnCompletion), _) => {
                    let mut step = machine::complete(record, lease, response, now);
                    if let Some(written) = &mut step.write {
                        written.fingerprint = Fingerprint::from_bytes([0; 32]);
                    }
                    step
                }
                _ => machine::complete(record, lease, response, now),
            }),
        )
    }

    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        if !self.has(Flaw::LimitSparesFailures) {
            self.refuse_response(response, State::Failed)?;
        }
        self.finish(lease, response, State::Failed)
    }

    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        let kept = self.has(Flaw::ReleaseKeepsAnEmptyRecord);
        let forgets = self.has(Flaw::ReleaseForgetsSteps);
        let moves = self.has(Flaw::ReleaseMovesTheLeaseEnd);
        Ok(self.apply(&lease.key, |r, now| {
            let mut step = machine::release(r, lease, now);
            if let (Some(written), Some(before)) = (step.write.as_mut(), r) {
                if moves {
                    written.lease_until = now;
                }
                let stepless = before.steps.is_empty();
                if kept && stepless {
                    written.expires_at = before.expires_at;
                }
                if forgets {
                    written.expires_at = now;
                }
            }
            step
        }))
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        self.refuse(Operation::Renew, &[extend])?;
        if self.has(Flaw::RenewOverTwoRoundTrips) {
            return Ok(self
                .read_then_write(&lease.key, |r, now| machine::renew(r, lease, extend, now))
                .await);
        }
        Ok(self.apply(&lease.key, |r, now| {
            match r {
                // A lease that ended looks live to this store, for the moment of the call.
                Some(record) if self.has(Flaw::RenewsEndedLeases) && !record.is_absent(now) => {
                    let mut live = record.clone();
                    live.lease_until = live
                        .lease_until
                        .max(now.saturating_add(Duration::from_millis(1)));
                    machine::renew(Some(&live), lease, extend, now)
                }
                Some(record) if self.has(Flaw::ExpiryIgnoresTheLease) => {
                    let mut step = machine::renew(r, lease, extend, now);
                    if let Some(written) = step.write.as_mut() {
                        written.expires_at = record.expires_at;
                    }
                    step
                }
                _ => machine::renew(r, lease, extend, now),
            }
        }))
    }

    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        let size = step.as_str().len() + value.len();
        let too_large = |limit| StoreError::TooLarge {
            part: ValuePart::Step(step.as_str().to_owned()),
            size,
            limit,
        };
        if let Some(limit) = self.limit.filter(|limit| size > *limit) {
            return Err(too_large(limit));
        }
        self.apply(&lease.key, |r, now| {
            let mut written = machine::checkpoint(r, lease, step, value, now);
            if self.has(Flaw::DropsUndoEndMarks)
                && step.as_str().starts_with("idem.undone:")
                && written.outcome == WriteOutcome::Applied
            {
                written.write = None;
            }
            if let (Some(after), Some(before)) = (written.write.as_mut(), r)
                && self.has(Flaw::ExpiryIgnoresTheLease)
            {
                after.expires_at = before.expires_at;
            }
            if let (Some(after), Some(before)) = (written.write.as_mut(), r)
                && self.has(Flaw::CheckpointExpiryFromTheLeaseCopy)
            {
                after.expires_at =
                    machine::kept_past(before.expires_at, lease.lease_until, lease.retention);
            }
            let beside = match (self.limit, r) {
                (Some(_), Some(before)) if !self.has(Flaw::LimitIgnoresSteps) => {
                    steps_size(before, Some(step.as_str()))
                }
                _ => 0,
            };
            match self.limit {
                Some(limit) if written.write.is_some() && beside + size > limit => Transition {
                    outcome: Err(too_large(limit)),
                    write: None,
                },
                _ => Transition {
                    outcome: Ok(written.outcome),
                    write: written.write,
                },
            }
        })
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let records = self.backend.lock().expect("not poisoned");
        let now = self.clock.now();
        let seen = self.seen(records.get(&self.name(key)), now);
        Ok(machine::visible(seen.as_ref(), now).cloned())
    }

    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let mut records = self.backend.lock().expect("not poisoned");
        let now = self.clock.now();
        let doomed: Vec<String> = records
            .iter()
            .filter(|(name, _)| self.in_namespace(name))
            .filter(|(_, r)| match self.flaw {
                Some(Flaw::PurgesLiveLeases) => r.is_expired(now),
                Some(Flaw::LeaseLiveAtItsEnd | Flaw::PresentAtItsExpiry) => self
                    .seen(Some(r), now)
                    .is_some_and(|r| machine::is_purgeable(&r, now)),
                _ => machine::is_purgeable(r, now),
            })
            .map(|(name, _)| name.clone())
            .take(limit)
            .collect();
        doomed.iter().for_each(|name| drop(records.remove(name)));
        Ok(doomed.len())
    }

    fn max_record_bytes(&self) -> Option<usize> {
        self.limit
    }
}
