//! The suite proves it can fail: deliberately broken stores are reported, each by the cases
//! that guard the behaviour it breaks, and by no case named for another behaviour.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::machine::{self, Transition};
use idem_core::record::ValuePart;
use idem_core::{
    Admin, Clock, Fingerprint, Key, MemoryStore, Record, State, Store, StoreError, SystemClock,
    Timestamp, admin::ListQuery, admin::Page, admin::ReleaseKeyOutcome, admin::Stats,
    key::StepName, raw::MAX_DURATION, raw::select_page, raw::storage_name, record::AttemptId,
    record::Lease, store::ClaimOutcome, store::ClaimRequest, store::Operation, store::RenewOutcome,
    store::WriteOutcome,
};
use idem_testkit::explore::{Explorer, Fault, Report as ExploreReport, Scenario, Target, Timing};
use idem_testkit::{AdminCase, AdminSuite, Case, CaseName, Namespace, Report, Suite};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Flaw {
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
    /// Every claim leaves a task of the store's running for ever (a watcher it never
    /// stops).
    LeaksATaskPerClaim,
}

/// The record limit of the stores that declare one here: small, so the cases stay quick.
const LIMIT: usize = 64 * 1024;

/// A key-value backend shared by every store one factory makes, as a server is.
type Backend = Arc<Mutex<HashMap<String, Record>>>;

/// The state machine over a shared backend, under a namespace, with one flaw (or none).
struct FlawedStore {
    backend: Backend,
    namespace: String,
    flaw: Option<Flaw>,
    /// The record limit the store declares and (but for its flaw) enforces.
    limit: Option<usize>,
    clock: Arc<dyn Clock>,
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
        Ok(self.apply(&lease.key, |r, now| {
            let mut step = machine::release(r, lease, now);
            if let (Some(written), Some(before)) = (step.write.as_mut(), r) {
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
fn steps_size(record: &Record, except: Option<&str>) -> usize {
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
struct Setup {
    /// The record limit the stores declare.
    limit: Option<usize>,
    /// Whether they read the suite's manual clock rather than the system's.
    manual_clock: bool,
}

/// A factory of stores with `flaw` on one shared backend, reading the clock they are given.
fn factory(
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

/// An admin suite over stores with `flaw`, all on one shared backend.
fn admin_suite(flaw: Option<Flaw>) -> AdminSuite {
    let make = factory(flaw, Setup::default());
    AdminSuite::new(move |namespace| make(Arc::new(SystemClock), namespace))
}

/// A suite over stores with `flaw`, all on one shared backend.
fn suite(flaw: Option<Flaw>) -> Suite {
    suite_with(flaw, Setup::default())
}

/// A suite over stores with `flaw` made as `setup` says, all on one shared backend.
fn suite_with(flaw: Option<Flaw>, setup: Setup) -> Suite {
    let make = factory(flaw, setup);
    if setup.manual_clock {
        Suite::with_manual_clock(move |clock, namespace| make(Arc::new(clock), namespace))
    } else {
        Suite::new(move |namespace| make(Arc::new(SystemClock), namespace))
    }
}

/// Stores that declare (and, unflawed, enforce) a record limit.
const LIMITED: Setup = Setup {
    limit: Some(LIMIT),
    manual_clock: false,
};
/// Stores on the suite's manual clock.
const MANUAL: Setup = Setup {
    limit: None,
    manual_clock: true,
};

/// The report must name every case in `required` and nothing outside `required` and
/// `also_allowed`.
fn assert_reported<C: CaseName>(report: &Report<C>, required: &[C], also_allowed: &[C]) {
    let failed = report.failed();
    for case in required {
        assert!(
            failed.contains(case),
            "the suite missed the flaw: {} passed\n{report}",
            case.name()
        );
    }
    for case in &failed {
        assert!(
            required.contains(case) || also_allowed.contains(case),
            "{} failed, but it is named for another behaviour than the flaw\n{report}",
            case.name()
        );
    }
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_skips_the_fence_on_complete_is_reported() {
    let report = suite(Some(Flaw::SkipsFenceOnComplete)).run_all().await;
    assert_reported(
        &report,
        &[
            Case::StaleOwnerIsFencedAfterTakeover,
            Case::WritesAfterTheEndAreFenced,
            Case::RetriedTerminalWritesKeepTheFirstBytes,
            Case::AStaleOwnerCannotStoreItsResult,
            Case::MatchesTheStateMachine,
        ],
        // Switching a failed record to completed is a write the fence must refuse too; a
        // stale complete after a takeover overwrites whenever the race lets it; a result
        // written without the fence's bookkeeping is not kept a retention after it.
        &[
            Case::RetriedTerminalWritesAreApplied,
            Case::StaleCompletesRaceTakeovers,
            Case::LateResultsStayReplayable,
            Case::ReleaseWithoutStepsForgetsTheKey,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_forgets_the_fingerprint_is_reported() {
    let report = suite(Some(Flaw::ForgetsFingerprintOnCompletion))
        .run_all()
        .await;
    assert_reported(
        &report,
        &[
            Case::FingerprintSurvivesCompletion,
            Case::CompleteStoresTheResponse,
            Case::CompletedRecordReplays,
            Case::MatchesTheStateMachine,
        ],
        // Every case that completes a record and then replays it meets the flaw.
        &[
            Case::DifferentFingerprintIsAMismatch,
            Case::StaleOwnerIsFencedAfterTakeover,
            Case::ReplaysAreByteExact,
            Case::LargeResponsesReplayOrAreRefused,
            Case::NamespacesAreIsolated,
            Case::GetHidesAbsentRecords,
            Case::StepsRunOnceAcrossTakeovers,
            Case::AStaleOwnerCannotStoreItsResult,
            Case::WaitingDuplicatesShareOneExecution,
            Case::EncryptedValuesAreNotPlaintextAtRest,
            Case::EncryptedRecordsRefuseCopiesAndTampering,
            Case::KeyPoliciesAndBudgetsRefuseBeforeStoring,
            Case::LateResultsStayReplayable,
            Case::LeaseAndExpiryEndExactly,
            Case::RetriedTerminalWritesKeepTheFirstBytes,
            Case::StaleCompletesRaceTakeovers,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_whose_takeover_forgets_steps_is_reported() {
    let report = suite(Some(Flaw::TakeoverForgetsSteps)).run_all().await;
    assert_reported(
        &report,
        &[
            Case::ExpiredLeaseIsTakenOver,
            Case::StepsRunOnceAcrossTakeovers,
            Case::ATakeoverFinishesACrashedCompensation,
            Case::EncryptedRecordsRefuseCopiesAndTampering,
            Case::MatchesTheStateMachine,
        ],
        &[
            Case::ReleaseLetsTheNextClaimTakeOver,
            Case::AReleaseAfterTheRetentionKeepsItsSteps,
            Case::NoLeaseEndsAtTheRetentionCliff,
            Case::ACheckpointKeepsTheRecordPastItsOwnLeaseEnd,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_that_keeps_an_empty_record_is_reported() {
    let report = suite(Some(Flaw::ReleaseKeepsAnEmptyRecord)).run_all().await;
    assert_reported(
        &report,
        &[Case::ReleaseWithoutStepsForgetsTheKey],
        &[Case::MatchesTheStateMachine],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_that_forgets_steps_is_reported() {
    let report = suite(Some(Flaw::ReleaseForgetsSteps)).run_all().await;
    assert_reported(
        &report,
        &[
            Case::ReleaseLetsTheNextClaimTakeOver,
            Case::AReleaseAfterTheRetentionKeepsItsSteps,
            Case::TokensStrictlyIncrease,
        ],
        &[
            Case::MatchesTheStateMachine,
            Case::StepsRunOnceAcrossTakeovers,
            // Both release a record with a step first.
            Case::AnEndedLeaseIsNotRenewed,
            Case::ALateClaimOfTheSameAttemptTakesNothingOver,
            Case::ACheckpointKeepsTheRecordPastItsOwnLeaseEnd,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_whose_expiry_ignores_the_lease_is_reported() {
    for setup in [Setup::default(), MANUAL] {
        let report = suite_with(Some(Flaw::ExpiryIgnoresTheLease), setup)
            .run_all()
            .await;
        assert_reported(
            &report,
            &[Case::NoLeaseEndsAtTheRetentionCliff],
            &[
                Case::MatchesTheStateMachine,
                Case::ALiveLeaseIsNeverAbsent,
                Case::AReleaseAfterTheRetentionKeepsItsSteps,
                Case::AbsentRecordIsClaimedFresh,
                Case::ACheckpointKeepsTheRecordPastItsOwnLeaseEnd,
            ],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_checkpoint_expiry_from_the_lease_copy_is_reported() {
    for setup in [Setup::default(), MANUAL] {
        let report = suite_with(Some(Flaw::CheckpointExpiryFromTheLeaseCopy), setup)
            .run_all()
            .await;
        assert_reported(
            &report,
            &[Case::ACheckpointKeepsTheRecordPastItsOwnLeaseEnd],
            &[Case::MatchesTheStateMachine],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_without_its_retention_is_reported() {
    let report = suite_with(Some(Flaw::LeaseWithoutRetention), MANUAL)
        .run_all()
        .await;
    assert_reported(
        &report,
        &[
            Case::NoLeaseEndsAtTheRetentionCliff,
            Case::MatchesTheStateMachine,
        ],
        &[
            Case::ALiveLeaseIsNeverAbsent,
            Case::AReleaseAfterTheRetentionKeepsItsSteps,
            Case::AbsentRecordIsClaimedFresh,
            Case::LateResultsStayReplayable,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_renews_ended_leases_is_reported() {
    for setup in [Setup::default(), MANUAL] {
        let report = suite_with(Some(Flaw::RenewsEndedLeases), setup)
            .run_all()
            .await;
        assert_reported(
            &report,
            &[Case::AnEndedLeaseIsNotRenewed, Case::RenewExtendsTheLease],
            &[Case::MatchesTheStateMachine],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_claim_that_takes_over_is_reported() {
    for setup in [Setup::default(), MANUAL] {
        let report = suite_with(Some(Flaw::LateClaimTakesOver), setup)
            .run_all()
            .await;
        assert_reported(
            &report,
            &[Case::ALateClaimOfTheSameAttemptTakesNothingOver],
            &[Case::MatchesTheStateMachine],
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_whose_claim_is_not_atomic_is_reported() {
    let report = suite(Some(Flaw::NonAtomicClaim)).run_all().await;
    // Sequentially it is correct, so only races can catch it. The two store-level races
    // of claims must; the driver's herd of waiting duplicates and a takeover racing a
    // stale complete may (whether their race window is hit varies from run to run).
    assert_reported(
        &report,
        &[
            Case::ConcurrentClaimsHaveOneWinner,
            Case::ConcurrentTakeoversHaveOneWinner,
        ],
        &[
            Case::WaitingDuplicatesShareOneExecution,
            Case::StaleCompletesRaceTakeovers,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_purges_live_leases_is_reported() {
    let report = suite(Some(Flaw::PurgesLiveLeases)).run_all().await;
    assert_reported(
        &report,
        &[
            Case::PurgeRemovesOnlyAbsentRecords,
            Case::ALiveLeaseIsNeverAbsent,
            Case::MatchesTheStateMachine,
        ],
        &[],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_forgets_a_live_lease_past_retention_is_reported() {
    let report = suite(Some(Flaw::ExpiredIsAbsentDespiteLease))
        .run_all()
        .await;
    assert_reported(
        &report,
        &[
            Case::ALiveLeaseIsNeverAbsent,
            Case::GetHidesAbsentRecords,
            Case::MatchesTheStateMachine,
        ],
        // A lease outliving a zero retention, read back or renewed, is the flaw itself, and
        // a result stored under such a lease is what stays replayable.
        &[
            Case::PurgeRemovesOnlyAbsentRecords,
            Case::ExtremeDurationsWork,
            Case::LateResultsStayReplayable,
            Case::AReleaseAfterTheRetentionKeepsItsSteps,
            Case::ACheckpointKeepsTheRecordPastItsOwnLeaseEnd,
        ],
    );
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_refuses_long_durations_is_reported() {
    let report = suite(Some(Flaw::RefusesLongDurations)).run_all().await;
    assert_reported(&report, &[Case::ExtremeDurationsWork], &[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_whose_complete_is_not_atomic_is_reported() {
    let report = suite(Some(Flaw::NonAtomicComplete)).run_all().await;
    // Sequentially it is correct, so only a race of a stale write against a takeover can
    // catch it; the driver's races may meet it too.
    assert_reported(
        &report,
        &[Case::StaleCompletesRaceTakeovers],
        &[
            Case::AStaleOwnerCannotStoreItsResult,
            Case::WaitingDuplicatesShareOneExecution,
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_rewrites_a_retried_result_is_reported() {
    let report = suite(Some(Flaw::RewritesOnRetry)).run_all().await;
    assert_reported(
        &report,
        &[Case::RetriedTerminalWritesKeepTheFirstBytes],
        // Random sequences retry a complete with other bytes now and then.
        &[Case::MatchesTheStateMachine],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_limit_that_ignores_the_steps_is_reported() {
    let report = suite_with(Some(Flaw::LimitIgnoresSteps), LIMITED)
        .run_all()
        .await;
    assert_reported(&report, &[Case::StepsCountTowardTheRecordLimit], &[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_limit_that_spares_failures_is_reported() {
    let report = suite_with(Some(Flaw::LimitSparesFailures), LIMITED)
        .run_all()
        .await;
    assert_reported(
        &report,
        &[
            Case::LargeResponsesReplayOrAreRefused,
            Case::StepsCountTowardTheRecordLimit,
        ],
        &[],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_live_at_its_end_is_reported() {
    for setup in [Setup::default(), MANUAL] {
        let report = suite_with(Some(Flaw::LeaseLiveAtItsEnd), setup)
            .run_all()
            .await;
        assert_reported(&report, &[Case::LeaseAndExpiryEndExactly], LEASE_ENDS_MEET);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_present_at_its_expiry_is_reported() {
    for setup in [Setup::default(), MANUAL] {
        let report = suite_with(Some(Flaw::PresentAtItsExpiry), setup)
            .run_all()
            .await;
        assert_reported(&report, &[Case::LeaseAndExpiryEndExactly], EXPIRY_ENDS_MEET);
    }
}

/// Cases that meet a lease live at its end whenever a claim lands in the millisecond a
/// zero lease was granted in, or exactly when a waited-out lease ends (always, on a manual
/// clock): every case that takes over an ended lease.
const LEASE_ENDS_MEET: &[Case] = &[
    Case::AbsentRecordIsClaimedFresh,
    Case::ACheckpointKeepsTheRecordPastItsOwnLeaseEnd,
    Case::ExpiredLeaseIsTakenOver,
    Case::TokensStrictlyIncrease,
    Case::ReleaseLetsTheNextClaimTakeOver,
    Case::ReleaseWithoutStepsForgetsTheKey,
    Case::AReleaseAfterTheRetentionKeepsItsSteps,
    Case::RenewExtendsTheLease,
    Case::AnEndedLeaseIsNotRenewed,
    Case::ALateClaimOfTheSameAttemptTakesNothingOver,
    Case::NoLeaseEndsAtTheRetentionCliff,
    Case::StaleOwnerIsFencedAfterTakeover,
    Case::WritesAfterTheEndAreFenced,
    Case::NamespacesAreIsolated,
    Case::GetHidesAbsentRecords,
    Case::PurgeRemovesOnlyAbsentRecords,
    Case::ConcurrentTakeoversHaveOneWinner,
    Case::StaleCompletesRaceTakeovers,
    Case::StepsRunOnceAcrossTakeovers,
    Case::AStaleOwnerCannotStoreItsResult,
    Case::EncryptedRecordsRefuseCopiesAndTampering,
    Case::ProviderKeysSurviveTakeovers,
    Case::ATakeoverFinishesACrashedCompensation,
    Case::MatchesTheStateMachine,
];

/// Cases that meet a record present at its expiry whenever an operation lands in the
/// millisecond a zero retention was granted in, or exactly at a waited-out expiry.
const EXPIRY_ENDS_MEET: &[Case] = &[
    Case::AbsentRecordIsClaimedFresh,
    Case::ALiveLeaseIsNeverAbsent,
    Case::LateResultsStayReplayable,
    Case::ReleaseWithoutStepsForgetsTheKey,
    Case::AReleaseAfterTheRetentionKeepsItsSteps,
    Case::WritesAfterTheEndAreFenced,
    Case::NamespacesAreIsolated,
    Case::GetHidesAbsentRecords,
    Case::PurgeRemovesOnlyAbsentRecords,
    Case::MatchesTheStateMachine,
];

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_keeps_the_expiry_of_a_late_result_is_reported() {
    for setup in [Setup::default(), MANUAL] {
        let report = suite_with(Some(Flaw::KeepsExpiryOnFinish), setup)
            .run_all()
            .await;
        assert_reported(
            &report,
            &[Case::LateResultsStayReplayable],
            // The manual-clock part of that case sees the same flaw.
            &[
                Case::MatchesTheStateMachine,
                Case::GetHidesAbsentRecords,
                Case::ALiveLeaseIsNeverAbsent,
            ],
        );
    }
}

/// Which value a `complete` (the result) or a `fail` (the failure) writes.
fn part_of(terminal: State) -> ValuePart {
    if terminal == State::Failed {
        ValuePart::Failure
    } else {
        ValuePart::Result
    }
}

/// The explorer over a store with `flaw`: each run a fresh namespace on the run's virtual
/// clock.
fn explore_flawed(flaw: Flaw, scenarios: &[Scenario]) -> ExploreReport {
    explore_flawed_with(flaw, scenarios, Timing::virtual_time())
}

fn explore_flawed_with(flaw: Flaw, scenarios: &[Scenario], timing: Timing) -> ExploreReport {
    let make = factory(Some(flaw), Setup::default());
    let target = Target::virtual_time(format!("{flaw:?}"), move |clock| {
        let store = make(Arc::new(clock), Namespace::fresh());
        async move { Ok::<_, std::convert::Infallible>(store.await) }
    });
    let report = Explorer::new(target)
        .timing(timing)
        .scenarios(scenarios.iter().copied())
        .run()
        .expect("the exploration runs");
    println!("{report}");
    report
}

/// The runs of `report` that broke `kind`, each with a fault of `faults` in its plan.
fn found_with(report: &ExploreReport, kind: &str, faults: &[Fault]) -> usize {
    report
        .violations()
        .filter(|v| v.broken.kind() == kind)
        .filter(|v| v.faults.iter().any(|f| faults.contains(&f.fault)))
        .count()
}

#[test]
fn the_explorer_reports_a_renewal_landing_after_the_release() {
    // The first run answers Retryable and releases; a copy of a heartbeat's renewal lands
    // after that, and this store extends the lease it ended: the key is held for nobody.
    let report = explore_flawed(Flaw::RenewsEndedLeases, &[Scenario::RetryableThenDone]);
    assert!(
        found_with(&report, "late grant", &[Fault::DuplicatedLate]) > 0,
        "{report}"
    );
}

#[test]
fn the_explorer_reports_a_late_claim_that_takes_over() {
    // A copy of the claim lands after the release: this store takes the key over for an
    // execute that is gone.
    let report = explore_flawed(Flaw::LateClaimTakesOver, &[Scenario::RetryableThenDone]);
    assert!(
        found_with(&report, "late grant", &[Fault::DuplicatedLate]) > 0,
        "{report}"
    );
}

#[test]
fn the_explorer_reports_an_undo_listed_interrupted_after_it_ended() {
    // The end marks are lost: whenever a takeover finishes the compensation, it reads an
    // undo that ended as one that started only, and lists it interrupted. No undo runs
    // twice and every step is listed once, so only the derived compensation tells.
    let report = explore_flawed(Flaw::DropsUndoEndMarks, &[Scenario::SagaFailsAfterSteps]);
    assert!(
        found_with(
            &report,
            "compensation misplaced",
            &[Fault::CrashAtPoint, Fault::CrashAfter]
        ) > 0,
        "{report}"
    );
    assert!(
        report
            .violations()
            .all(|v| v.broken.kind() == "compensation misplaced"),
        "{report}"
    );
}

#[test]
fn the_explorer_with_a_retention_equal_to_the_lease_finds_the_retention_cliff() {
    // A record whose owner crashed after a step is absent as soon as its lease lapses
    // when takeovers and checkpoints keep the expiry as it was: the retry claims afresh
    // and runs the step again. The retention must be as short as the lease for a run to
    // reach that edge; with the default hour, the same store passes.
    let mut timing = Timing::virtual_time();
    timing.retention = timing.lease;
    let short = explore_flawed_with(Flaw::ExpiryIgnoresTheLease, &[Scenario::Steps], timing);
    assert!(
        found_with(&short, "effect repeated", &[Fault::CrashAtPoint]) > 0,
        "{short}"
    );
    let long = explore_flawed(Flaw::ExpiryIgnoresTheLease, &[Scenario::Steps]);
    assert!(long.passed(), "{long}");
}

#[test]
fn the_explorer_reports_a_task_left_running() {
    // The explorer lets every task a run left finish before its check; one that never does
    // is reported, not waited for.
    let report = explore_flawed(Flaw::LeaksATaskPerClaim, &[Scenario::Plain]);
    let lingered = report
        .violations()
        .filter(|v| v.broken.kind() == "task lingers")
        .count();
    // Every run: the tasks its processes left, then the one the final check's claim left.
    assert_eq!(lingered, report.runs() * 2, "{report}");
    assert!(
        report
            .violations()
            .all(|v| v.broken.kind() == "task lingers"),
        "{report}"
    );
}

#[test]
fn the_unflawed_store_passes_the_explorer() {
    let make = factory(None, Setup::default());
    let target = Target::virtual_time("unflawed", move |clock| {
        let store = make(Arc::new(clock), Namespace::fresh());
        async move { Ok::<_, std::convert::Infallible>(store.await) }
    });
    let report = Explorer::new(target)
        .scenarios([Scenario::RetryableThenDone, Scenario::LongWork])
        .run()
        .expect("the exploration runs");
    assert!(report.passed(), "{report}");
}
