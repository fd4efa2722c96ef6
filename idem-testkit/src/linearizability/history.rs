//! What the clients did: each call, when it was invoked and when it returned, and what it
//! answered (or that its answer was lost).

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use idem_core::{
    Fingerprint, Key, Record, Timestamp, key::StepName, record::AttemptId, record::Lease,
    store::ClaimOutcome, store::ClaimRequest, store::RenewOutcome, store::WriteOutcome,
};

/// One call a client made to the store.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Call {
    /// [`Store::claim`](idem_core::Store::claim).
    Claim(ClaimRequest),
    /// [`Store::complete`](idem_core::Store::complete).
    Complete(Lease, Vec<u8>),
    /// [`Store::fail`](idem_core::Store::fail).
    Fail(Lease, Vec<u8>),
    /// [`Store::release`](idem_core::Store::release).
    Release(Lease),
    /// [`Store::renew`](idem_core::Store::renew), with the extension asked for.
    Renew(Lease, Duration),
    /// [`Store::checkpoint`](idem_core::Store::checkpoint).
    Checkpoint(Lease, StepName, Vec<u8>),
    /// [`Store::get`](idem_core::Store::get).
    Get(Key),
}

impl Call {
    /// The key the call is about.
    pub fn key(&self) -> &Key {
        match self {
            Call::Claim(request) => &request.key,
            Call::Complete(lease, _)
            | Call::Fail(lease, _)
            | Call::Release(lease)
            | Call::Renew(lease, _)
            | Call::Checkpoint(lease, _, _) => &lease.key,
            Call::Get(key) => key,
        }
    }
}

/// What a call answered.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Answer {
    /// A claim's outcome.
    Claim(ClaimOutcome),
    /// A fenced write's outcome (`complete`, `fail`, `release`, `checkpoint`).
    Write(WriteOutcome),
    /// A renewal's outcome.
    Renew(RenewOutcome),
    /// What `get` found.
    Get(Option<Record>),
    /// No answer came back: an error, a timeout, a cut connection. The call may have
    /// taken effect, once, between its invocation and [`LOST_GRACE`](super::LOST_GRACE)
    /// after the client gave up on it, or not at all.
    Lost(String),
}

/// One call and its answer, as a client saw them.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Operation {
    /// Which client made it (each client waits for one call before the next).
    pub client: usize,
    /// The call.
    pub call: Call,
    /// The wall-clock time just before the call was made.
    pub invoked: Timestamp,
    /// The wall-clock time just after its answer came back, or the client gave up on it
    /// (its answer lost).
    pub returned: Timestamp,
    /// [`invoked`](Self::invoked) in nanoseconds since the Unix epoch: calls that fall in
    /// one millisecond keep their real-time order.
    pub invoked_ns: u64,
    /// [`returned`](Self::returned) in nanoseconds since the Unix epoch.
    pub returned_ns: u64,
    /// The answer.
    pub answer: Answer,
}

impl Operation {
    /// An operation invoked and returned at these times, in nanoseconds since the Unix
    /// epoch (for a history recorded by other means than [`record`](super::record)).
    ///
    /// ```
    /// use idem_core::Key;
    /// use idem_testkit::linearizability::{Answer, Call, History, Operation, check};
    ///
    /// let key = Key::new("orders", "k1").unwrap();
    /// let at = 1_700_000_000_000_000_000;
    /// let get = Operation::new(0, Call::Get(key), Answer::Get(None), at, at + 1_000);
    /// let history = History { operations: vec![get] };
    /// assert_eq!(check(&history).unwrap().operations, 1);
    /// ```
    pub fn new(
        client: usize,
        call: Call,
        answer: Answer,
        invoked_ns: u64,
        returned_ns: u64,
    ) -> Self {
        let millis = |ns: u64| Timestamp::from_unix_millis(ns / 1_000_000);
        Self {
            client,
            call,
            invoked: millis(invoked_ns),
            returned: millis(returned_ns),
            invoked_ns,
            returned_ns,
            answer,
        }
    }

    /// Whether the answer was lost (the call may or may not have taken effect).
    pub fn is_lost(&self) -> bool {
        matches!(self.answer, Answer::Lost(_))
    }
}

/// Every operation of a run, in the order they were invoked.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// The operations.
    pub operations: Vec<Operation>,
}

impl History {
    /// The operations on each key, in invocation order.
    pub fn by_key(&self) -> Vec<(Key, Vec<Operation>)> {
        let mut order: Vec<Key> = Vec::new();
        let mut keys: HashMap<Key, Vec<Operation>> = HashMap::new();
        for operation in &self.operations {
            let key = operation.call.key();
            if !keys.contains_key(key) {
                order.push(key.clone());
            }
            keys.entry(key.clone()).or_default().push(operation.clone());
        }
        order
            .into_iter()
            .map(|key| {
                let mut operations = keys.remove(&key).unwrap_or_default();
                operations.sort_by_key(|operation| operation.invoked_ns);
                (key, operations)
            })
            .collect()
    }

    /// How many answers were lost.
    pub fn lost(&self) -> usize {
        self.operations.iter().filter(|o| o.is_lost()).count()
    }
}

/// Short names for the attempt ids and fingerprints of a history, by first appearance,
/// so that a printed history reads `attempt 3` and `fingerprint B` instead of bytes.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    start: Timestamp,
    attempts: HashMap<AttemptId, usize>,
    fingerprints: HashMap<Fingerprint, usize>,
}

impl Names {
    pub(crate) fn of(operations: &[Operation]) -> Self {
        let mut names = Names {
            start: operations
                .iter()
                .map(|o| o.invoked)
                .min()
                .unwrap_or_default(),
            attempts: HashMap::new(),
            fingerprints: HashMap::new(),
        };
        for operation in operations {
            if let Call::Claim(request) = &operation.call {
                names.attempt(request.attempt);
                let next = names.fingerprints.len();
                names
                    .fingerprints
                    .entry(request.fingerprint)
                    .or_insert(next);
            }
        }
        names
    }

    fn attempt(&mut self, attempt: AttemptId) -> usize {
        let next = self.attempts.len();
        *self.attempts.entry(attempt).or_insert(next)
    }

    fn attempt_name(&self, attempt: &AttemptId) -> String {
        self.attempts
            .get(attempt)
            .map_or_else(|| "attempt ?".to_owned(), |n| format!("attempt {n}"))
    }

    /// Names the same attempts and fingerprints, with times counted from `start`.
    pub(crate) fn from(mut self, start: Timestamp) -> Self {
        self.start = start;
        self
    }

    fn fingerprint_name(&self, fingerprint: &Fingerprint) -> String {
        // The workload's own fingerprints are the hashes of their names.
        for name in ["A", "B"] {
            if *fingerprint == Fingerprint::of_bytes(name) {
                return name.to_owned();
            }
        }
        match self.fingerprints.get(fingerprint) {
            Some(&n) if n < 26 => char::from(b'A' + n as u8).to_string(),
            Some(n) => format!("#{n}"),
            None => "?".to_owned(),
        }
    }

    fn at(&self, time: Timestamp) -> String {
        let millis = time.as_unix_millis() as i128 - self.start.as_unix_millis() as i128;
        format!("{millis:+}ms")
    }

    fn lease(&self, lease: &Lease) -> String {
        format!(
            "lease(token {}, {}, until {}, created {}, retention {:?})",
            lease.token,
            self.attempt_name(&lease.attempt),
            self.at(lease.lease_until),
            self.at(lease.created_at),
            lease.retention
        )
    }

    fn call(&self, call: &Call) -> String {
        match call {
            Call::Claim(request) => format!(
                "claim(fingerprint {}, {}, lease {:?}, retention {:?})",
                self.fingerprint_name(&request.fingerprint),
                self.attempt_name(&request.attempt),
                request.lease,
                request.retention
            ),
            Call::Complete(lease, bytes) => {
                format!("complete({}, {})", self.lease(lease), text(bytes))
            }
            Call::Fail(lease, bytes) => format!("fail({}, {})", self.lease(lease), text(bytes)),
            Call::Release(lease) => format!("release({})", self.lease(lease)),
            Call::Renew(lease, extend) => format!("renew({}, {extend:?})", self.lease(lease)),
            Call::Checkpoint(lease, step, bytes) => format!(
                "checkpoint({}, {}, {})",
                self.lease(lease),
                step.as_str(),
                text(bytes)
            ),
            Call::Get(_) => "get".to_owned(),
        }
    }

    fn steps(steps: &idem_core::record::Steps) -> String {
        let parts: Vec<String> = steps
            .iter()
            .map(|(name, value)| format!("{name}={}", text(value)))
            .collect();
        format!("[{}]", parts.join(", "))
    }

    pub(crate) fn record(&self, record: &Record) -> String {
        format!(
            "{:?}(token {}, {}, fingerprint {}, until {}, created {}, expires {}, response {}, steps {})",
            record.state,
            record.token,
            self.attempt_name(&record.attempt),
            self.fingerprint_name(&record.fingerprint),
            self.at(record.lease_until),
            self.at(record.created_at),
            self.at(record.expires_at),
            record
                .response
                .as_deref()
                .map_or_else(|| "none".to_owned(), text),
            Self::steps(&record.steps)
        )
    }

    fn answer(&self, answer: &Answer) -> String {
        match answer {
            Answer::Claim(ClaimOutcome::Claimed {
                lease,
                resumed,
                steps,
                ..
            }) => format!(
                "Claimed({}, resumed {resumed}, steps {})",
                self.lease(lease),
                Self::steps(steps)
            ),
            Answer::Claim(ClaimOutcome::Replay { response, .. }) => {
                format!("Replay({})", text(response))
            }
            Answer::Claim(ClaimOutcome::ReplayFailure { response, .. }) => {
                format!("ReplayFailure({})", text(response))
            }
            Answer::Claim(other) => format!("{other:?}"),
            Answer::Write(outcome) => format!("{outcome:?}"),
            Answer::Renew(RenewOutcome::Renewed(lease)) => {
                format!("Renewed({})", self.lease(lease))
            }
            Answer::Renew(other) => format!("{other:?}"),
            Answer::Get(None) => "None".to_owned(),
            Answer::Get(Some(record)) => format!("Some({})", self.record(record)),
            Answer::Lost(why) => format!("lost ({why})"),
        }
    }

    pub(crate) fn operation(&self, operation: &Operation) -> String {
        let returned = self.at(operation.returned);
        format!(
            "client {} [{} .. {}] {} -> {}",
            operation.client,
            self.at(operation.invoked),
            returned,
            self.call(&operation.call),
            self.answer(&operation.answer)
        )
    }
}

/// Bytes as text when they are short printable ASCII (the workload's values are), else
/// their length.
fn text(bytes: &[u8]) -> String {
    if bytes.len() <= 32 && bytes.iter().all(|b| b.is_ascii_graphic()) {
        format!("{:?}", String::from_utf8_lossy(bytes))
    } else {
        format!("<{} bytes>", bytes.len())
    }
}

impl fmt::Display for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = Names::of(&self.operations);
        for operation in &self.operations {
            writeln!(f, "{}", names.operation(operation))?;
        }
        Ok(())
    }
}
