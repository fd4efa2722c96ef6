//! The clients: each makes calls one at a time on a handful of keys, from what it has
//! learnt (the leases it holds, the ones it lost), and records every call.

use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Fingerprint, Key, Store, StoreError, Timestamp, key::KeyError, key::StepName,
    record::AttemptId, record::Lease, store::ClaimOutcome, store::ClaimRequest,
    store::RenewOutcome, store::WriteOutcome,
};

use super::history::{Answer, Call, History, Operation};

/// What a recorded run does: how many clients, on how many keys, how many calls, and the
/// seed that picks them.
///
/// The defaults (8 clients, 4 keys, 2 000 calls) take a second or two on a local server.
///
/// ```
/// use std::time::Duration;
/// use idem_testkit::linearizability::Workload;
///
/// let workload = Workload::default()
///     .clients(4)
///     .keys(2)
///     .operations(500)
///     .seed(7)
///     .call_timeout(Duration::from_secs(2));
/// assert_eq!(workload.total_operations(), 500);
/// ```
#[derive(Clone, Debug)]
pub struct Workload {
    clients: usize,
    keys: usize,
    operations: usize,
    seed: u64,
    call_timeout: Duration,
    scope: String,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            clients: 8,
            keys: 4,
            operations: 2_000,
            seed: 1,
            call_timeout: Duration::from_secs(5),
            scope: "linearizable".to_owned(),
        }
    }
}

/// The leases a claim asks for: short ones end while the run goes on, so takeovers
/// happen; an hour never ends within a run.
const LEASES: [Duration; 4] = [
    Duration::from_millis(20),
    Duration::from_millis(60),
    Duration::from_millis(250),
    Duration::from_secs(3600),
];
/// The retentions: shorter than some leases too (a store must keep a live owner's record
/// whatever its retention), and an hour, after which a key only replays.
const RETENTIONS: [Duration; 5] = [
    Duration::ZERO,
    Duration::from_millis(30),
    Duration::from_millis(100),
    Duration::from_millis(400),
    Duration::from_secs(3600),
];
/// Step names, one of them an undo's end mark as the driver writes it (a store must keep
/// it as any other step).
const STEPS: [&str; 4] = ["reserve", "charge", "notify", "idem.undone:charge"];

impl Workload {
    /// How many clients call at once (at least 1).
    pub fn clients(mut self, clients: usize) -> Self {
        self.clients = clients.max(1);
        self
    }

    /// How many keys they share (at least 1): fewer keys, more contention.
    pub fn keys(mut self, keys: usize) -> Self {
        self.keys = keys.max(1);
        self
    }

    /// How many calls the clients make in all.
    pub fn operations(mut self, operations: usize) -> Self {
        self.operations = operations;
        self
    }

    /// The seed of every choice the clients make; print it with a failure to replay the
    /// same calls (the answers depend on timing too).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// How long a call may take before its answer counts as lost (default 5 s).
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// The scope of the keys (default `linearizable`); keys are `k0`, `k1`, ...
    ///
    /// # Errors
    /// When `scope` is not a valid key scope (see [`Key::new`]).
    ///
    /// ```
    /// use idem_testkit::linearizability::Workload;
    ///
    /// assert!(Workload::default().scope("payments").is_ok());
    /// assert!(Workload::default().scope("").is_err());
    /// ```
    pub fn scope(mut self, scope: impl Into<String>) -> Result<Self, KeyError> {
        let scope = scope.into();
        Key::new(scope.clone(), "k0")?;
        self.scope = scope;
        Ok(self)
    }

    /// The calls the run makes in all.
    pub fn total_operations(&self) -> usize {
        self.operations
    }

    /// The seed.
    pub fn seed_value(&self) -> u64 {
        self.seed
    }

    fn key(&self, n: usize) -> Key {
        // `scope` checked it, and `k` with digits is a valid key.
        Key::new(self.scope.clone(), format!("k{n}")).expect("a valid scope and key")
    }
}

/// Runs `workload` against `store` and returns every call with its answer and times.
///
/// The store must be empty under the workload's scope (a fresh namespace).
pub async fn record(store: Arc<dyn Store>, workload: &Workload) -> History {
    record_on(&[store], workload).await
}

/// As [`record`], with client `i` calling `stores[i % stores.len()]`: several stores over
/// one database (separate pools, connections or processes' worth of clients).
///
/// # Panics
/// When `stores` is empty.
pub async fn record_on(stores: &[Arc<dyn Store>], workload: &Workload) -> History {
    assert!(!stores.is_empty(), "record_on needs at least one store");
    let clock = RunClock::start();
    let mut clients = tokio::task::JoinSet::new();
    for client in 0..workload.clients {
        let share = workload.operations / workload.clients
            + usize::from(client < workload.operations % workload.clients);
        let store = Arc::clone(&stores[client % stores.len()]);
        let workload = workload.clone();
        clients.spawn(async move {
            Client::new(client, &workload, clock)
                .run(store, share)
                .await
        });
    }
    let mut operations = Vec::with_capacity(workload.operations);
    while let Some(done) = clients.join_next().await {
        operations.extend(done.expect("a linearizability client panicked"));
    }
    operations.sort_by_key(|o: &Operation| o.invoked_ns);
    History { operations }
}

/// The clock calls are timed by: the wall clock at the run's start plus a monotonic
/// clock's count since, so real-time order holds below the millisecond and calls keep
/// their order through a step of the wall clock (the store's clock, which steps with
/// it, then no longer matches the windows: run on a machine whose clock is not stepped).
#[derive(Clone, Copy)]
struct RunClock {
    unix_ns_at_start: u64,
    start: std::time::Instant,
}

impl RunClock {
    fn start() -> Self {
        let unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Self {
            unix_ns_at_start: unix_ns,
            start: std::time::Instant::now(),
        }
    }

    fn now_ns(&self) -> u64 {
        let elapsed = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.unix_ns_at_start.saturating_add(elapsed)
    }
}

/// What one client knows about one key.
#[derive(Default)]
struct Known {
    /// The lease it believes it holds, and the claim that won it.
    held: Option<(Lease, ClaimRequest)>,
    /// Leases it held before: a late write with one must be fenced (or be a retry).
    old: Vec<Lease>,
}

struct Client {
    id: usize,
    rng: fastrand::Rng,
    keys: Vec<Key>,
    known: Vec<Known>,
    fingerprints: [Fingerprint; 2],
    timeout: Duration,
    clock: RunClock,
    written: u64,
    /// A claim to make again after a wait, on the key that answered `InFlight`.
    retry: Option<(usize, Duration)>,
}

impl Client {
    fn new(id: usize, workload: &Workload, clock: RunClock) -> Self {
        let keys: Vec<Key> = (0..workload.keys).map(|n| workload.key(n)).collect();
        Self {
            id,
            rng: fastrand::Rng::with_seed(
                workload
                    .seed
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    .wrapping_add(id as u64),
            ),
            known: keys.iter().map(|_| Known::default()).collect(),
            keys,
            fingerprints: [Fingerprint::of_bytes("A"), Fingerprint::of_bytes("B")],
            timeout: workload.call_timeout,
            clock,
            written: 0,
            retry: None,
        }
    }

    async fn run(mut self, store: Arc<dyn Store>, calls: usize) -> Vec<Operation> {
        let mut operations = Vec::with_capacity(calls);
        let mut lost_in_a_row: u32 = 0;
        for _ in 0..calls {
            let (k, call) = match self.retry.take() {
                // Back after `retry_after`, as the driver comes back: right at the end of
                // the lease that kept it out, racing the owner's late calls.
                Some((k, wait)) => {
                    tokio::time::sleep(wait).await;
                    (k, Call::Claim(self.claim_request(k)))
                }
                None => {
                    // Skewed: the first keys are hot (owners race takeovers on them), the
                    // last are quiet (a late call finds its record as it left it).
                    let n = self.keys.len();
                    let k = self.rng.usize(0..n).min(self.rng.usize(0..n));
                    let call = match self.late_call(k).await {
                        Some(call) => call,
                        None => self.next_call(k),
                    };
                    (k, call)
                }
            };
            let operation = self.make(store.as_ref(), call).await;
            self.learn(k, &operation);
            if let Answer::Claim(ClaimOutcome::InFlight { retry_after, .. }) = &operation.answer
                && *retry_after <= Duration::from_secs(1)
                && self.rng.bool()
            {
                self.retry = Some((k, *retry_after));
            }
            lost_in_a_row = if operation.is_lost() {
                lost_in_a_row + 1
            } else {
                0
            };
            operations.push(operation);
            // A little time between calls, so that short leases and retentions end
            // while the run goes on; longer after a lost answer, doubling with each
            // one in a row up to about a second, as a client backs off while its
            // server is down. (Every lost call may still land until the grace after it,
            // so a client hammering a server that is down would only make a history
            // whose every order has to be tried.)
            let pause = if lost_in_a_row > 0 {
                self.rng.u64(20..=60) << (lost_in_a_row - 1).min(4)
            } else {
                self.rng.u64(0..=3)
            };
            if pause > 0 {
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }
        operations
    }

    /// Now and then, a worker that holds a short lease waits until about its end and then
    /// makes a call with it: a result, a heartbeat or a step just before the end (racing
    /// the takeovers that come right at it), or the claim that won it sent again just
    /// after. Answers the call, when it waited.
    async fn late_call(&mut self, k: usize) -> Option<Call> {
        let (lease, request) = self.known[k].held.clone()?;
        let left = lease
            .lease_until
            .saturating_duration_since(Timestamp::now());
        if left > Duration::from_secs(1) || self.rng.u8(0..4) != 0 {
            return None;
        }
        let millis = Duration::from_millis;
        let (call, wait) = match self.rng.u8(0..10) {
            0..3 => (
                Call::Complete(lease, self.value("ok")),
                left.saturating_sub(millis(self.rng.u64(0..=3))),
            ),
            // Either side of the end: a heartbeat just in time, or one just too late.
            3..5 => (
                Call::Renew(lease, LEASES[self.rng.usize(0..LEASES.len())]),
                (left + millis(self.rng.u64(0..=6))).saturating_sub(millis(3)),
            ),
            5..8 => (Call::Claim(request), left + millis(self.rng.u64(1..=6))),
            _ => {
                let step = self.step();
                (
                    Call::Checkpoint(lease, step, self.value("step")),
                    left.saturating_sub(millis(self.rng.u64(0..=3))),
                )
            }
        };
        tokio::time::sleep(wait).await;
        Some(call)
    }

    fn value(&mut self, what: &str) -> Vec<u8> {
        self.written += 1;
        format!("{what}-c{}-{}", self.id, self.written).into_bytes()
    }

    fn claim_request(&mut self, k: usize) -> ClaimRequest {
        let fingerprint = self.fingerprints[usize::from(self.rng.u8(0..10) == 0)];
        ClaimRequest::new(
            self.keys[k].clone(),
            fingerprint,
            LEASES[self.rng.usize(0..LEASES.len())],
            RETENTIONS[self.rng.usize(0..RETENTIONS.len())],
        )
        .with_attempt(AttemptId::random())
    }

    fn step(&mut self) -> StepName {
        StepName::new(STEPS[self.rng.usize(0..STEPS.len())]).expect("a valid step name")
    }

    fn next_call(&mut self, k: usize) -> Call {
        let roll = self.rng.u8(0..100);
        if let Some((lease, request)) = self.known[k].held.clone() {
            return match roll {
                0..15 => Call::Renew(lease, LEASES[self.rng.usize(0..LEASES.len())]),
                15..40 => {
                    let step = self.step();
                    Call::Checkpoint(lease, step, self.value("step"))
                }
                40..60 => Call::Complete(lease, self.value("ok")),
                60..66 => Call::Fail(lease, self.value("no")),
                66..76 => Call::Release(lease),
                // The same claim again, as a retry whose first answer was slow.
                76..82 => Call::Claim(request),
                82..90 => Call::Get(self.keys[k].clone()),
                _ => self
                    .with_old_lease(k)
                    .unwrap_or(Call::Complete(lease, self.value("ok"))),
            };
        }
        match roll {
            0..65 => Call::Claim(self.claim_request(k)),
            65..80 => Call::Get(self.keys[k].clone()),
            _ => self
                .with_old_lease(k)
                .unwrap_or_else(|| Call::Claim(self.claim_request(k))),
        }
    }

    /// A call with a lease this client held before: fenced, or a retry of a result.
    fn with_old_lease(&mut self, k: usize) -> Option<Call> {
        let old = &self.known[k].old;
        if old.is_empty() {
            return None;
        }
        let lease = old[self.rng.usize(0..old.len())].clone();
        Some(match self.rng.u8(0..6) {
            0 | 1 => Call::Complete(lease, self.value("ok")),
            2 => Call::Fail(lease, self.value("no")),
            3 => Call::Renew(lease, LEASES[self.rng.usize(0..LEASES.len())]),
            4 => {
                let step = self.step();
                Call::Checkpoint(lease, step, self.value("step"))
            }
            _ => Call::Release(lease),
        })
    }

    async fn make(&self, store: &dyn Store, call: Call) -> Operation {
        let invoked = self.clock.now_ns();
        let answer = tokio::time::timeout(self.timeout, answer(store, &call)).await;
        let answer = match answer {
            Ok(Ok(answer)) => answer,
            Ok(Err(err)) => Answer::Lost(err.to_string()),
            Err(_) => Answer::Lost(format!("no answer within {:?}", self.timeout)),
        };
        let returned = self.clock.now_ns();
        Operation::new(self.id, call, answer, invoked, returned)
    }

    /// What the answer taught the client about the key.
    fn learn(&mut self, k: usize, operation: &Operation) {
        let known = &mut self.known[k];
        let lose_held = |known: &mut Known| {
            if let Some((lease, _)) = known.held.take() {
                known.old.push(lease);
                if known.old.len() > 4 {
                    known.old.remove(0);
                }
            }
        };
        match (&operation.call, &operation.answer) {
            (Call::Claim(request), Answer::Claim(ClaimOutcome::Claimed { lease, .. })) => {
                lose_held(known);
                known.held = Some((lease.clone(), request.clone()));
            }
            (Call::Renew(_, _), Answer::Renew(RenewOutcome::Renewed(lease))) => {
                if let Some((held, _)) = &mut known.held
                    && held.token == lease.token
                    && held.attempt == lease.attempt
                {
                    *held = lease.clone();
                }
            }
            (
                Call::Complete(lease, _)
                | Call::Fail(lease, _)
                | Call::Release(lease)
                | Call::Renew(lease, _)
                | Call::Checkpoint(lease, _, _),
                Answer::Write(WriteOutcome::Fenced)
                | Answer::Renew(RenewOutcome::Fenced)
                | Answer::Lost(_),
            )
            | (
                Call::Complete(lease, _) | Call::Fail(lease, _) | Call::Release(lease),
                Answer::Write(WriteOutcome::Applied),
            ) if known
                .held
                .as_ref()
                .is_some_and(|(held, _)| held.token == lease.token) =>
            {
                lose_held(known);
            }
            _ => {}
        }
    }
}

async fn answer(store: &dyn Store, call: &Call) -> Result<Answer, StoreError> {
    Ok(match call {
        Call::Claim(request) => Answer::Claim(store.claim(request).await?),
        Call::Complete(lease, bytes) => Answer::Write(store.complete(lease, bytes).await?),
        Call::Fail(lease, bytes) => Answer::Write(store.fail(lease, bytes).await?),
        Call::Release(lease) => Answer::Write(store.release(lease).await?),
        Call::Renew(lease, extend) => Answer::Renew(store.renew(lease, *extend).await?),
        Call::Checkpoint(lease, step, bytes) => {
            Answer::Write(store.checkpoint(lease, step, bytes).await?)
        }
        Call::Get(key) => Answer::Get(store.get(key).await?),
    })
}
