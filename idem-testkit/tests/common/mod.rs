//! Stores broken on purpose: the state machine over a shared backend with one flaw, for
//! the tests that prove the suite, the explorer and the linearizability checker catch
//! each flaw.

#![allow(dead_code)] // each test binary uses the flaws it needs

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::machine::{self, Transition};
use idem_core::record::ValuePart;
use idem_core::{
    Admin, Clock, Fingerprint, Key, Record, State, Store, StoreError, Timestamp, admin::ListQuery,
    admin::Page, admin::ReleaseKeyOutcome, admin::Stats, key::StepName, raw::MAX_DURATION,
    raw::select_page, raw::storage_name, record::AttemptId, record::Lease, store::ClaimOutcome,
    store::ClaimRequest, store::Operation, store::RenewOutcome, store::WriteOutcome,
};
use idem_testkit::Namespace;

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Flaw {
    /// `complete` writes whatever the record's token or state.
    SkipsFenceOnComplete,
    /// Completion overwrites the fingerprint.
    ForgetsFingerprintOnCompletion,
    /// `claim` reads, lets other tasks run, then writes: not atomic.
    NonAtomicClaim,
    /// `purge_expired` also removes expired records whose lease is live.
    PurgesLiveLeases,
    /// An expired record counts as absent even while a live lease holds it (an earlier
    /// contract).
    ExpiredIsAbsentDespiteLease,
    /// Storage names are `<namespace><scope length>:<scope>:<key>`, with nothing ending the
    /// namespace, and purge matches names by the raw namespace prefix (DynamoDB's
    /// early layout).
    UnterminatedNamespace,
    /// Names are right, but purge deletes absent records of every namespace on the backend.
    PurgeReachesOtherNamespaces,
    /// Durations reach the backend unclamped, and it refuses those past a century
    /// (PostgreSQL's and Redis's early failures).
    RefusesLongDurations,
    /// An operator's release ends the lease but keeps the token and the attempt: the owner
    /// is not fenced.
    ReleaseKeepsTheOwner,
    /// `list` ignores the cursor: every page starts from the beginning.
    ListForgetsTheCursor,
    /// A takeover's claim answers no checkpoints (a store that reads steps from the wrong
    /// column): the new owner redoes steps, and a saga forgets it was compensating.
    TakeoverForgetsSteps,
    /// `complete` reads the record, checks the fence, lets other tasks run, then writes:
    /// a takeover between the check and the write is overwritten.
    NonAtomicComplete,
    /// `complete` or `fail` retried by the same lease stores the retry's bytes over the
    /// first ones (still answering Applied).
    RewritesOnRetry,
    /// The record limit is checked against each write alone, never counting the steps the
    /// record already holds.
    LimitIgnoresSteps,
    /// The record limit is enforced on results and checkpoints but not on failures.
    LimitSparesFailures,
    /// A lease is live while `now <= lease_until`: one millisecond too long.
    LeaseLiveAtItsEnd,
    /// A record expires once `now > expires_at`: one millisecond too late.
    PresentAtItsExpiry,
    /// `complete` and `fail` keep `expires_at` as it was: a result stored after the
    /// retention ended is absent the moment it is stored.
    KeepsExpiryOnFinish,
    /// A release keeps a record with no step until its retention ends (an earlier
    /// contract): a corrected request under the key is a mismatch.
    ReleaseKeepsAnEmptyRecord,
    /// A release ends the record's lifetime even when it holds steps: the next claim
    /// starts afresh and runs those steps again.
    ReleaseForgetsSteps,
    /// A release sets `lease_until = now` even after the lease ran out: the end moves to
    /// the release, past the one the record was kept for.
    ReleaseMovesTheLeaseEnd,
    /// Takeovers, renewals and checkpoints keep `expires_at` as it was (an earlier
    /// contract): a record whose owner stops at the end of its retention is absent the
    /// moment the lease lapses, and its steps run again.
    ExpiryIgnoresTheLease,
    /// Claims answer leases without the request's retention (a store that builds its
    /// lease with `Lease::new` alone), so renewals and checkpoints keep nothing past the
    /// lease.
    LeaseWithoutRetention,
    /// A renewal applies to a lease that has ended (released, or run out) while nobody
    /// took over: a late heartbeat holds the key for an owner that is gone.
    RenewsEndedLeases,
    /// A late claim of the attempt whose lease ended takes the record over again.
    LateClaimTakesOver,
    /// A checkpoint of an undo's end mark answers Applied and writes nothing: a takeover
    /// reads the undo as started and never ended.
    DropsUndoEndMarks,
    /// A checkpoint keeps the record one retention past the end of the lease it is
    /// handed, not the record's: an older copy of the lease (same attempt and token, after
    /// a purge) leaves the record short of its own lease end, and a release then loses
    /// its steps.
    CheckpointExpiryFromTheLeaseCopy,
    /// `complete` reads the record in one round trip and writes in another, with no
    /// condition on the write (a claim made atomic, a completion left as GET then SET):
    /// a takeover between the two is overwritten.
    CompleteOverTwoRoundTrips,
    /// `renew` reads the record in one round trip and writes it back with the new lease
    /// in another: a takeover between the two is undone, and the old owner holds the key
    /// again.
    RenewOverTwoRoundTrips,
    /// Every claim leaves a task of the store's running for ever (a watcher it never
    /// stops).
    LeaksATaskPerClaim,
}

/// The record limit of the stores that declare one here: small, so the cases stay quick.
pub(crate) const LIMIT: usize = 64 * 1024;

/// A key-value backend shared by every store one factory makes, as a server is.
pub(crate) type Backend = Arc<Mutex<HashMap<String, Record>>>;

/// The state machine over a shared backend, under a namespace, with one flaw (or none).
pub(crate) struct FlawedStore {
    pub(crate) backend: Backend,
    pub(crate) namespace: String,
    pub(crate) flaw: Option<Flaw>,
    /// The record limit the store declares and (but for its flaw) enforces.
    pub(crate) limit: Option<usize>,
    pub(crate) clock: Arc<dyn Clock>,
}

impl FlawedStore {
    fn has(&self, flaw: Flaw) -> bool {
        self.flaw == Some(flaw)
    }

    fn name(&self, key: &Key) -> String {
        if self.has(Flaw::UnterminatedNamespace) {
            format!("{}{}", self.namespace, storage_name::key_name(key))
        } else {
            storage_name::namespaced_key_name(&self.namespace, key)
        }
    }

    fn in_namespace(&self, name: &str) -> bool {
        match self.flaw {
            Some(Flaw::UnterminatedNamespace) => name.starts_with(&self.namespace),
            Some(Flaw::PurgeReachesOtherNamespaces) => true,
            _ => name.starts_with(&storage_name::namespace_prefix(&self.namespace)),
        }
    }

    /// The record as this store's rules see it. With the old contract's flaw, an expired
    /// record's live lease is ignored: the record looks as if its lease had just ended.
    fn seen(&self, record: Option<&Record>, now: Timestamp) -> Option<Record> {
        let mut record = record?.clone();
        if self.has(Flaw::ExpiredIsAbsentDespiteLease) && record.is_expired(now) {
            record.lease_until = record.lease_until.min(now);
        }
        // `<=` where `<` belongs: at its last instant, the record looks one millisecond
        // short of it.
        let one = Duration::from_millis(1);
        if self.has(Flaw::LeaseLiveAtItsEnd) && record.lease_until == now {
            record.lease_until = now.saturating_add(one);
        }
        if self.has(Flaw::PresentAtItsExpiry) && record.expires_at == now {
            record.expires_at = now.saturating_add(one);
        }
        Some(record)
    }

    /// A write computed from what `seen` showed, with the times `seen` made up for the
    /// `<=` flaws put back as they were stored.
    fn unseen(&self, mut write: Record, stored: Option<&Record>, seen: Option<&Record>) -> Record {
        if let (Some(stored), Some(seen)) = (stored, seen) {
            let inclusive = self.has(Flaw::LeaseLiveAtItsEnd) || self.has(Flaw::PresentAtItsExpiry);
            if inclusive && write.lease_until == seen.lease_until {
                write.lease_until = stored.lease_until;
            }
            if inclusive && write.expires_at == seen.expires_at {
                write.expires_at = stored.expires_at;
            }
        }
        write
    }

    /// A response over the limit on its own, refused before anything is read.
    fn refuse_response(&self, response: &[u8], terminal: State) -> Result<(), StoreError> {
        match self.limit {
            Some(limit) if response.len() > limit => Err(StoreError::TooLarge {
                part: part_of(terminal),
                size: response.len(),
                limit,
            }),
            _ => Ok(()),
        }
    }

    /// Whether `response` fits beside the record's steps, or the error refusing it.
    fn check_response(
        &self,
        record: &Record,
        response: &[u8],
        terminal: State,
    ) -> Result<(), StoreError> {
        let Some(limit) = self.limit else {
            return Ok(());
        };
        if terminal == State::Failed && self.has(Flaw::LimitSparesFailures) {
            return Ok(());
        }
        let beside = if self.has(Flaw::LimitIgnoresSteps) {
            0
        } else {
            steps_size(record, None)
        };
        if beside + response.len() > limit {
            return Err(StoreError::TooLarge {
                part: part_of(terminal),
                size: response.len(),
                limit,
            });
        }
        Ok(())
    }

    fn apply<O>(
        &self,
        key: &Key,
        step: impl FnOnce(Option<&Record>, Timestamp) -> Transition<O>,
    ) -> O {
        let mut records = self.backend.lock().expect("not poisoned");
        let name = self.name(key);
        let now = self.clock.now();
        let existing = self.seen(records.get(&name), now);
        let Transition { outcome, write } = step(existing.as_ref(), now);
        if let Some(record) = write {
            let record = self.unseen(record, records.get(&name), existing.as_ref());
            records.insert(name, record);
        }
        outcome
    }

    /// `complete` or `fail` through the state machine, with this store's limit and flaws.
    fn finish(
        &self,
        lease: &Lease,
        response: &[u8],
        terminal: State,
    ) -> Result<WriteOutcome, StoreError> {
        self.apply(&lease.key, |record, now| {
            let mut step = if terminal == State::Completed {
                machine::complete(record, lease, response, now)
            } else {
                machine::fail(record, lease, response, now)
            };
            match (&mut step.write, record) {
                (Some(written), Some(before)) => {
                    if let Err(err) = self.check_response(before, response, terminal) {
                        return Transition {
                            outcome: Err(err),
                            write: None,
                        };
                    }
                    if self.has(Flaw::KeepsExpiryOnFinish) {
                        written.expires_at = before.expires_at;
                    }
                }
                // The retry of a write that landed: this flaw stores it again.
                (None, Some(before))
                    if self.has(Flaw::RewritesOnRetry) && step.outcome == WriteOutcome::Applied =>
                {
                    let mut rewritten = before.clone();
                    rewritten.response = Some(response.to_vec());
                    step.write = Some(rewritten);
                }
                _ => {}
            }
            Transition {
                outcome: Ok(step.outcome),
                write: step.write,
            }
        })
    }

    /// `step` on the record as one round trip read it, written a round trip later
    /// whatever happened in between.
    async fn read_then_write<O>(
        &self,
        key: &Key,
        step: impl FnOnce(Option<&Record>, Timestamp) -> Transition<O>,
    ) -> O {
        let name = self.name(key);
        let read = self
            .backend
            .lock()
            .expect("not poisoned")
            .get(&name)
            .cloned();
        let Transition { outcome, write } = step(read.as_ref(), self.clock.now());
        // A round trip to a server in another zone.
        tokio::time::sleep(Duration::from_millis(5)).await;
        if let Some(record) = write {
            self.backend
                .lock()
                .expect("not poisoned")
                .insert(name, record);
        }
        outcome
    }

    fn refuse(&self, operation: Operation, durations: &[Duration]) -> Result<(), StoreError> {
        if self.has(Flaw::RefusesLongDurations) && durations.iter().any(|d| *d > MAX_DURATION) {
            return Err(StoreError::Backend {
                operation,
                retryable: false,
                source: "interval out of range".into(),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl Store for FlawedStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.refuse(Operation::Claim, &[request.lease, request.retention])?;
        if self.has(Flaw::LeaksATaskPerClaim) {
            drop(tokio::spawn(std::future::pending::<()>()));
        }
        if self.has(Flaw::ExpiryIgnoresTheLease) {
            return Ok(self.apply(&request.key, |r, now| {
                let mut step = machine::claim(r, request, now);
                if let (Some(written), Some(before)) = (step.write.as_mut(), r)
                    && !before.is_absent(now)
                {
                    written.expires_at = before.expires_at;
                }
                step
            }));
        }
        if self.has(Flaw::LeaseWithoutRetention) {
            let outcome = self.apply(&request.key, |r, now| machine::claim(r, request, now));
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
                        machine::claim(Some(&other), request, now)
                    }
                    None => machine::claim(r, request, now),
                }
            }));
        }
        if self.has(Flaw::TakeoverForgetsSteps) {
            let outcome = self.apply(&request.key, |r, now| machine::claim(r, request, now));
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
            return Ok(self.apply(&request.key, |r, now| machine::claim(r, request, now)));
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
            machine::claim(existing.as_ref(), request, self.clock.now());
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

#[async_trait]
impl Admin for FlawedStore {
    async fn list(&self, query: &ListQuery) -> Result<Page, StoreError> {
        let mut query = query.clone();
        if self.has(Flaw::ListForgetsTheCursor) {
            query.after = None;
        }
        select_page(self.records(), &query, self.clock.now())
    }

    async fn stats(&self, top_scopes: usize) -> Result<Stats, StoreError> {
        Ok(Stats::tally(&self.records(), self.clock.now(), top_scopes))
    }

    async fn release_key(&self, key: &Key) -> Result<ReleaseKeyOutcome, StoreError> {
        let attempt = AttemptId::random();
        Ok(self.apply(key, |record, now| {
            let mut step = machine::release_key(record, attempt, now);
            if let (true, Some(written), Some(before)) = (
                self.has(Flaw::ReleaseKeepsTheOwner),
                &mut step.write,
                record,
            ) {
                written.token = before.token;
                written.attempt = before.attempt;
            }
            step
        }))
    }

    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        let name = self.name(key);
        Ok(self
            .backend
            .lock()
            .expect("not poisoned")
            .remove(&name)
            .is_some())
    }

    async fn raw(&self, key: &Key) -> Result<Option<idem_core::admin::RawRecord>, StoreError> {
        let name = self.name(key);
        let backend = self.backend.lock().expect("not poisoned");
        Ok(backend.get(&name).map(idem_core::raw::raw_of))
    }
}

/// The bytes `record`'s steps take (names and values), leaving out the step `except`,
/// whose value a checkpoint is about to replace.
pub(crate) fn steps_size(record: &Record, except: Option<&str>) -> usize {
    record
        .steps
        .iter()
        .filter(|(name, _)| Some(name.as_str()) != except)
        .map(|(name, value)| name.len() + value.len())
        .sum()
}

impl FlawedStore {
    /// This namespace's records, as its purge sees the namespace.
    fn records(&self) -> Vec<Record> {
        let records = self.backend.lock().expect("not poisoned");
        records
            .iter()
            .filter(|(name, _)| self.in_namespace(name))
            .map(|(_, record)| record.clone())
            .collect()
    }
}

/// How a suite's stores are made, besides their flaw.
#[derive(Clone, Copy, Default)]
pub(crate) struct Setup {
    /// The record limit the stores declare.
    pub(crate) limit: Option<usize>,
    /// Whether they read the suite's manual clock rather than the system's.
    pub(crate) manual_clock: bool,
}

/// A factory of stores with `flaw` on one shared backend, reading the clock they are given.
pub(crate) fn factory(
    flaw: Option<Flaw>,
    setup: Setup,
) -> impl Fn(Arc<dyn Clock>, Namespace) -> std::future::Ready<FlawedStore> + Send + Sync + 'static {
    let backend = Backend::default();
    move |clock, namespace| {
        std::future::ready(FlawedStore {
            backend: Arc::clone(&backend),
            namespace: namespace.into(),
            flaw,
            limit: setup.limit,
            clock,
        })
    }
}

/// Which value a `complete` (the result) or a `fail` (the failure) writes.
pub(crate) fn part_of(terminal: State) -> ValuePart {
    if terminal == State::Failed {
        ValuePart::Failure
    } else {
        ValuePart::Result
    }
}
