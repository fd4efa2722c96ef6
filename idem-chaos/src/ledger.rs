//! What every execution did, kept in the process, outside the store under test.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use serde::Serialize;

/// One run of the protected work.
#[derive(Clone, Debug, Serialize)]
pub struct Execution {
    /// Which key (an index into the run's keys).
    pub key: usize,
    /// Unique per execution; the work's result names it.
    pub id: u64,
    /// The fencing token the execution held.
    pub token: u64,
    /// When the work started (Unix milliseconds): the claim had just been won.
    pub started_ms: u64,
    /// The end of the execution's lease as last renewed (Unix milliseconds).
    pub lease_until_ms: u64,
    /// When the work finished, if it did (Unix milliseconds).
    pub ended_ms: Option<u64>,
}

/// The executions and the results clients saw, per key.
#[derive(Default)]
pub struct Ledger {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    executions: Vec<Execution>,
    /// Every result a client was given, per key, in the order given.
    observed: HashMap<usize, Vec<String>>,
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that an execution started; answers its id.
    pub fn begin(&self, key: usize, token: u64, started_ms: u64, lease_until_ms: u64) -> u64 {
        let mut inner = self.lock();
        let id = inner.executions.len() as u64;
        inner.executions.push(Execution {
            key,
            id,
            token,
            started_ms,
            lease_until_ms,
            ended_ms: None,
        });
        id
    }

    /// Records that execution `id` finished, with its lease as last renewed.
    pub fn end(&self, id: u64, ended_ms: u64, lease_until_ms: u64) {
        let mut inner = self.lock();
        if let Some(execution) = inner.executions.get_mut(id as usize) {
            execution.ended_ms = Some(ended_ms);
            execution.lease_until_ms = execution.lease_until_ms.max(lease_until_ms);
        }
    }

    /// Records a result a client was given for `key`.
    pub fn observe(&self, key: usize, value: String) {
        self.lock().observed.entry(key).or_default().push(value);
    }

    /// Every execution so far.
    pub fn executions(&self) -> Vec<Execution> {
        self.lock().executions.clone()
    }

    /// Every result clients were given, per key.
    pub fn observed(&self) -> HashMap<usize, Vec<String>> {
        self.lock().observed.clone()
    }
}
