//! Model-based testing: random operation sequences, every answer compared with the pure
//! state machine's.
//!
//! With a manual clock (stores that keep time in the process), the sequences also move
//! time by random steps, durations range from a millisecond to hours, and times are
//! compared exactly: leases that outlive retention, takeovers near the end of retention
//! and heartbeats past it are all generated. On a server's own clock, time cannot be
//! moved, so durations are zero (over at once), one or two hours (live for the whole run):
//! a one- or two-hour lease on a zero retention is the lease that outlives retention.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::machine::{self, Transition};
use idem_core::{
    Admin, Clock, Fingerprint, Key, ManualClock, Record, Store, Timestamp, key::StepName,
    record::AttemptId, record::Lease, store::ClaimOutcome, store::ClaimRequest, store::Expiry,
    store::RenewOutcome,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};

use crate::support::{HOUR, ZERO};

const SCOPES: [&str; 2] = ["tenant-a/op", "tenant-b/op"];
const KEYS: [&str; 2] = ["k0", "k1"];
const FINGERPRINTS: [&str; 2] = ["f0", "f1"];
const STEPS: [&str; 2] = ["debit", "charge"];
const ATTEMPTS: usize = 3;
/// Larger than any sequence can create, so a purge is deterministic.
const PURGE_LIMIT: usize = 1000;
/// Bounds the search for a smaller failing sequence.
const MAX_SHRINK_STEPS: usize = 512;

/// A generated duration.
#[derive(Clone, Copy, Debug)]
enum Span {
    Zero,
    Millisecond,
    HalfSecond,
    Minute,
    Hour,
    TwoHours,
}

impl Span {
    fn duration(self) -> Duration {
        match self {
            Span::Zero => ZERO,
            Span::Millisecond => Duration::from_millis(1),
            Span::HalfSecond => Duration::from_millis(500),
            Span::Minute => Duration::from_secs(60),
            Span::Hour => HOUR,
            Span::TwoHours => 2 * HOUR,
        }
    }
}

/// One generated operation. Lease indexes pick among the leases claimed so far.
#[derive(Clone, Debug)]
enum Op {
    Claim {
        scope: usize,
        key: usize,
        fingerprint: usize,
        attempt: usize,
        lease: Span,
        retention: Span,
    },
    Complete {
        lease: usize,
        response: u8,
    },
    Fail {
        lease: usize,
        response: u8,
    },
    Release {
        lease: usize,
    },
    Renew {
        lease: usize,
        extend: Span,
    },
    Checkpoint {
        lease: usize,
        step: usize,
        value: u8,
    },
    Get {
        scope: usize,
        key: usize,
    },
    Purge,
    /// Moves the manual clock (only generated when there is one).
    Advance(Span),
    /// An operator's release (only generated for stores with `Admin`).
    ReleaseKeyOutcome {
        scope: usize,
        key: usize,
    },
    /// An operator's deletion (only generated for stores with `Admin`).
    Delete {
        scope: usize,
        key: usize,
    },
}

/// Durations that can be compared on any clock: over at once, or live for the whole run.
fn untimed_span() -> BoxedStrategy<Span> {
    prop_oneof![Just(Span::Zero), Just(Span::Hour), Just(Span::TwoHours)].boxed()
}

/// Every duration, for a clock the sequence moves itself.
fn timed_span() -> BoxedStrategy<Span> {
    prop_oneof![
        Just(Span::Zero),
        Just(Span::Millisecond),
        Just(Span::HalfSecond),
        Just(Span::Minute),
        Just(Span::Hour),
        Just(Span::TwoHours),
    ]
    .boxed()
}

fn op(timed: bool, admin: bool) -> BoxedStrategy<Op> {
    let span = if timed { timed_span() } else { untimed_span() };
    let lease = 0..8usize;
    let ops = prop_oneof![
        4 => (0..SCOPES.len(), 0..KEYS.len(), 0..FINGERPRINTS.len(), 0..ATTEMPTS, span.clone(), span.clone()).prop_map(
            |(scope, key, fingerprint, attempt, lease, retention)| Op::Claim { scope, key, fingerprint, attempt, lease, retention }
        ),
        2 => (lease.clone(), any::<u8>()).prop_map(|(lease, response)| Op::Complete { lease, response }),
        1 => (lease.clone(), any::<u8>()).prop_map(|(lease, response)| Op::Fail { lease, response }),
        1 => lease.clone().prop_map(|lease| Op::Release { lease }),
        1 => (lease.clone(), span.clone()).prop_map(|(lease, extend)| Op::Renew { lease, extend }),
        1 => (lease, 0..STEPS.len(), any::<u8>()).prop_map(|(lease, step, value)| Op::Checkpoint { lease, step, value }),
        1 => (0..SCOPES.len(), 0..KEYS.len()).prop_map(|(scope, key)| Op::Get { scope, key }),
        1 => Just(Op::Purge),
    ];
    let ops = if timed {
        prop_oneof![4 => ops, 1 => span.prop_map(Op::Advance)].boxed()
    } else {
        ops.boxed()
    };
    if admin {
        let target = (0..SCOPES.len(), 0..KEYS.len());
        prop_oneof![
            8 => ops,
            1 => target.clone().prop_map(|(scope, key)| Op::ReleaseKeyOutcome { scope, key }),
            1 => target.prop_map(|(scope, key)| Op::Delete { scope, key }),
        ]
        .boxed()
    } else {
        ops
    }
}

fn sequence(timed: bool, admin: bool) -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(timed, admin), 1..=40)
}

/// The attempt id the model gives an operator's release; the store picks its own. Both
/// print as "operator" (see `attempt_name`).
const OPERATOR: AttemptId = AttemptId::from_bytes([0xA5; 16]);

/// The reference: the pure state machine over a map. On a manual clock it reads the same
/// clock as the store; otherwise it stands at one fixed instant, where zero spans are over
/// and hour spans live, exactly as on a real store during a run.
struct Model {
    records: BTreeMap<Key, Record>,
    now: Timestamp,
    clock: Option<ManualClock>,
}

impl Model {
    fn tick(&mut self) {
        if let Some(clock) = &self.clock {
            self.now = clock.now();
        }
    }

    fn apply<O>(
        &mut self,
        key: &Key,
        step: impl FnOnce(Option<&Record>, Timestamp) -> Transition<O>,
    ) -> O {
        let Transition { outcome, write } = step(self.records.get(key), self.now);
        if let Some(record) = write {
            self.records.insert(key.clone(), record);
        }
        outcome
    }

    /// Deletes what a store whose records vanish by themselves has deleted by now.
    fn vanish(&mut self) {
        let now = self.now;
        self.records
            .retain(|_, record| !machine::is_purgeable(record, now));
    }

    fn purge(&mut self) -> usize {
        let before = self.records.len();
        let now = self.now;
        self.records
            .retain(|_, record| !machine::is_purgeable(record, now));
        before - self.records.len()
    }
}

/// The parts of a claim outcome that must agree exactly. Times agree exactly on a shared
/// manual clock; on a server's clock they come from another clock and are only checked
/// for sanity.
fn comparable_claim(
    outcome: &ClaimOutcome,
    request: &ClaimRequest,
    exact_times: bool,
) -> Result<String, String> {
    Ok(match outcome {
        ClaimOutcome::Claimed {
            lease,
            resumed,
            steps,
            ..
        } => {
            if lease.key != request.key {
                return Err("the lease is for another key".into());
            }
            if lease.retention != request.retention {
                return Err(format!(
                    "the lease carries a retention of {:?}, not the request's {:?}",
                    lease.retention, request.retention
                ));
            }
            let times = if exact_times {
                format!(
                    ", lease until {:?}, created {:?}",
                    lease.lease_until, lease.created_at
                )
            } else {
                String::new()
            };
            format!(
                "Claimed(token {}, attempt {:?}, resumed {resumed}, steps {steps:?}{times})",
                lease.token, lease.attempt
            )
        }
        ClaimOutcome::Replay { response, .. } => format!("Replay({response:?})"),
        ClaimOutcome::ReplayFailure { response, .. } => format!("ReplayFailure({response:?})"),
        ClaimOutcome::InFlight { retry_after, .. } => {
            // Zero is the answer to a late claim of the attempt whose lease ended.
            if *retry_after > 2 * HOUR {
                return Err(format!(
                    "InFlight with an impossible retry_after {retry_after:?}"
                ));
            }
            if exact_times {
                format!("InFlight(retry after {retry_after:?})")
            } else {
                "InFlight".into()
            }
        }
        ClaimOutcome::Mismatch => "Mismatch".into(),
        other => format!("{other:?}"),
    })
}

/// An attempt id by what it is in the run: one of the generated attempts, or an
/// operator's.
fn attempt_name(attempt: &AttemptId, attempts: &[AttemptId]) -> String {
    attempts
        .iter()
        .position(|a| a == attempt)
        .map_or_else(|| "operator".to_owned(), |i| format!("attempt {i}"))
}

fn comparable_record(record: Option<&Record>, exact_times: bool, attempts: &[AttemptId]) -> String {
    match record {
        None => "None".into(),
        Some(r) => {
            let times = if exact_times {
                format!(
                    " lease until {:?} created {:?} expires {:?}",
                    r.lease_until, r.created_at, r.expires_at
                )
            } else {
                String::new()
            };
            format!(
                "Some({:?} token {} {} fingerprint {:?} response {:?} steps {:?}{times})",
                r.state,
                r.token,
                attempt_name(&r.attempt, attempts),
                r.fingerprint,
                r.response,
                r.steps
            )
        }
    }
}

fn comparable_renew(outcome: &RenewOutcome, exact_times: bool) -> String {
    match outcome {
        RenewOutcome::Renewed(lease) if exact_times => format!(
            "Renewed(token {}, until {:?})",
            lease.token, lease.lease_until
        ),
        RenewOutcome::Renewed(lease) => format!("Renewed(token {})", lease.token),
        RenewOutcome::Fenced => "Fenced".into(),
    }
}

/// Runs one sequence on a fresh store and on the model; the first disagreement is an error.
/// `admin` is the same store's operator side, when it has one.
async fn check_sequence(
    store: &dyn Store,
    admin: Option<&dyn Admin>,
    ops: &[Op],
    clock: Option<&ManualClock>,
) -> Result<(), String> {
    let vanish = store.expiry() == Expiry::Vanishes;
    let exact = clock.is_some();
    let attempts: Vec<AttemptId> = (0..ATTEMPTS).map(|_| AttemptId::random()).collect();
    let mut model = Model {
        records: BTreeMap::new(),
        now: Timestamp::now(),
        clock: clock.cloned(),
    };
    // Leases held so far, pairwise: what the store granted and what the model granted.
    let mut leases: Vec<(Lease, Lease)> = Vec::new();
    let key = |scope: usize, key: usize| Key::new(SCOPES[scope], KEYS[key]).expect("valid");
    let store_error =
        |i: usize, err: idem_core::StoreError| format!("op {i}: the store failed: {err}");

    for (i, op) in ops.iter().enumerate() {
        model.tick();
        if vanish {
            model.vanish();
        }
        let lease_at = |index: usize| leases.get(index % leases.len().max(1)).cloned();
        let (actual, expected) = match *op {
            Op::Claim {
                scope,
                key: k,
                fingerprint,
                attempt,
                lease,
                retention,
            } => {
                let request = ClaimRequest::new(
                    key(scope, k),
                    Fingerprint::of_bytes(FINGERPRINTS[fingerprint]),
                    lease.duration(),
                    retention.duration(),
                )
                .with_attempt(attempts[attempt]);
                let actual = store.claim(&request).await.map_err(|e| store_error(i, e))?;
                let expected = model.apply(&request.key, |r, now| {
                    // A run's few hundred claims start at token 1: never near the last.
                    machine::claim(r, &request, now).expect("no token at its limit")
                });
                if let (
                    ClaimOutcome::Claimed { lease: a, .. },
                    ClaimOutcome::Claimed { lease: e, .. },
                ) = (&actual, &expected)
                {
                    leases.push((a.clone(), e.clone()));
                }
                (
                    comparable_claim(&actual, &request, exact)
                        .map_err(|e| format!("op {i}: {e}"))?,
                    comparable_claim(&expected, &request, exact)?,
                )
            }
            Op::Complete { lease, response } | Op::Fail { lease, response } => {
                let Some((held, modelled)) = lease_at(lease) else {
                    continue;
                };
                let body = vec![response; usize::from(response % 4)];
                let (actual, expected) = if matches!(op, Op::Complete { .. }) {
                    (
                        store.complete(&held, &body).await,
                        model.apply(&held.key, |r, now| {
                            machine::complete(r, &modelled, &body, now)
                        }),
                    )
                } else {
                    (
                        store.fail(&held, &body).await,
                        model.apply(&held.key, |r, now| machine::fail(r, &modelled, &body, now)),
                    )
                };
                (
                    format!("{:?}", actual.map_err(|e| store_error(i, e))?),
                    format!("{expected:?}"),
                )
            }
            Op::Release { lease } => {
                let Some((held, modelled)) = lease_at(lease) else {
                    continue;
                };
                let actual = store.release(&held).await.map_err(|e| store_error(i, e))?;
                let expected = model.apply(&held.key, |r, now| machine::release(r, &modelled, now));
                (format!("{actual:?}"), format!("{expected:?}"))
            }
            Op::Renew { lease, extend } => {
                let Some((held, modelled)) = lease_at(lease) else {
                    continue;
                };
                let actual = store
                    .renew(&held, extend.duration())
                    .await
                    .map_err(|e| store_error(i, e))?;
                let expected = model.apply(&held.key, |r, now| {
                    machine::renew(r, &modelled, extend.duration(), now)
                });
                (
                    comparable_renew(&actual, exact),
                    comparable_renew(&expected, exact),
                )
            }
            Op::Checkpoint { lease, step, value } => {
                let Some((held, modelled)) = lease_at(lease) else {
                    continue;
                };
                let name = StepName::new(STEPS[step]).expect("valid");
                let actual = store
                    .checkpoint(&held, &name, &[value])
                    .await
                    .map_err(|e| store_error(i, e))?;
                let expected = model.apply(&held.key, |r, now| {
                    machine::checkpoint(r, &modelled, &name, &[value], now)
                });
                (format!("{actual:?}"), format!("{expected:?}"))
            }
            Op::Get { scope, key: k } => {
                let k = key(scope, k);
                let actual = store.get(&k).await.map_err(|e| store_error(i, e))?;
                let expected = machine::visible(model.records.get(&k), model.now);
                (
                    comparable_record(actual.as_ref(), exact, &attempts),
                    comparable_record(expected, exact, &attempts),
                )
            }
            Op::Purge => {
                let actual = store
                    .purge_expired(PURGE_LIMIT)
                    .await
                    .map_err(|e| store_error(i, e))?;
                (
                    format!("purged {actual}"),
                    format!("purged {}", model.purge()),
                )
            }
            Op::Advance(span) => {
                if let Some(clock) = clock {
                    clock.advance(span.duration());
                }
                continue;
            }
            Op::ReleaseKeyOutcome { scope, key: k } => {
                let Some(admin) = admin else { continue };
                let k = key(scope, k);
                let actual = admin.release_key(&k).await.map_err(|e| store_error(i, e))?;
                let expected = model.apply(&k, |r, now| {
                    machine::release_key(r, OPERATOR, now).expect("no token at its limit")
                });
                (format!("{actual:?}"), format!("{expected:?}"))
            }
            Op::Delete { scope, key: k } => {
                let Some(admin) = admin else { continue };
                let k = key(scope, k);
                let actual = admin.delete(&k).await.map_err(|e| store_error(i, e))?;
                let expected = model.records.remove(&k).is_some();
                (format!("deleted {actual}"), format!("deleted {expected}"))
            }
        };
        if actual != expected {
            let mut report = String::new();
            let _ = writeln!(report, "step {i} diverged: {op:?}");
            let _ = writeln!(report, "  the store answered:         {actual}");
            let _ = writeln!(report, "  the state machine answered: {expected}");
            return Err(report);
        }
    }
    Ok(())
}

/// Generates sequences, runs each on a fresh store, and shrinks the first failure; the
/// panic message carries what a store author needs: the shrunk sequence, the step that
/// diverged, and both answers.
pub(crate) async fn run<F, Fut>(factory: F, clock: Option<ManualClock>)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Store>>,
{
    search(false, clock, |ops, clock| {
        let made = factory();
        async move { check_sequence(made.await.as_ref(), None, &ops, clock.as_ref()).await }
    })
    .await;
}

/// [`run`] with operator releases and deletions interleaved, for stores with `Admin`.
pub(crate) async fn run_admin<F, Fut>(factory: F, clock: Option<ManualClock>)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Admin>>,
{
    search(true, clock, |ops, clock| {
        let made = factory();
        async move {
            let admin = made.await;
            let store = crate::admin_suite::as_store(&admin);
            check_sequence(store.as_ref(), Some(admin.as_ref()), &ops, clock.as_ref()).await
        }
    })
    .await;
}

async fn search<C, Fut>(admin: bool, clock: Option<ManualClock>, check: C)
where
    C: Fn(Vec<Op>, Option<ManualClock>) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let config = Config {
        failure_persistence: None,
        ..Config::default()
    };
    let cases = config.cases;
    let mut runner = TestRunner::new(config);
    let strategy = sequence(clock.is_some(), admin);
    for case in 0..cases {
        let mut tree = strategy
            .new_tree(&mut runner)
            .expect("the strategy always generates");
        let Err(first) = check(tree.current(), clock.clone()).await else {
            continue;
        };
        let (mut smallest, mut reason) = (tree.current(), first);
        let mut steps = 0;
        while steps < MAX_SHRINK_STEPS && tree.simplify() {
            steps += 1;
            match check(tree.current(), clock.clone()).await {
                Err(why) => (smallest, reason) = (tree.current(), why),
                Ok(()) => {
                    if !tree.complicate() {
                        break;
                    }
                }
            }
        }
        let listing: String = smallest
            .iter()
            .enumerate()
            .map(|(i, op)| format!("  {i}: {op:?}\n"))
            .collect();
        panic!(
            "the store disagrees with the state machine (sequence {case} of {cases}, shrunk in \
             {steps} steps to {} operations)\n{reason}the shrunk sequence, from a fresh store:\n{listing}",
            smallest.len()
        );
    }
}
