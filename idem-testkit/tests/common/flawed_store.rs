//! The state machine over a shared backend, under a namespace, with one flaw (or none):
//! the store, and the rules its calls share.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::machine::{self, Transition};
use idem_core::record::ValuePart;
use idem_core::{
    Clock, Key, Record, State, StoreError, Timestamp, raw::MAX_DURATION, raw::storage_name,
    record::Lease, store::Operation, store::WriteOutcome,
};

use super::flaw::Flaw;

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
    pub(super) fn has(&self, flaw: Flaw) -> bool {
        self.flaw == Some(flaw)
    }

    pub(super) fn name(&self, key: &Key) -> String {
        if self.has(Flaw::UnterminatedNamespace) {
            format!("{}{}", self.namespace, storage_name::key_name(key))
        } else {
            storage_name::namespaced_key_name(&self.namespace, key)
        }
    }

    pub(super) fn in_namespace(&self, name: &str) -> bool {
        match self.flaw {
            Some(Flaw::UnterminatedNamespace) => name.starts_with(&self.namespace),
            Some(Flaw::PurgeReachesOtherNamespaces) => true,
            _ => name.starts_with(&storage_name::namespace_prefix(&self.namespace)),
        }
    }

    /// The record as this store's rules see it. With the old contract's flaw, an expired
    /// record's live lease is ignored: the record looks as if its lease had just ended.
    pub(super) fn seen(&self, record: Option<&Record>, now: Timestamp) -> Option<Record> {
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
    pub(super) fn refuse_response(
        &self,
        response: &[u8],
        terminal: State,
    ) -> Result<(), StoreError> {
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
    pub(super) fn check_response(
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

    pub(super) fn apply<O>(
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
    pub(super) fn finish(
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
    pub(super) async fn read_then_write<O>(
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

    pub(super) fn refuse(
        &self,
        operation: Operation,
        durations: &[Duration],
    ) -> Result<(), StoreError> {
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
    pub(super) fn records(&self) -> Vec<Record> {
        let records = self.backend.lock().expect("not poisoned");
        records
            .iter()
            .filter(|(name, _)| self.in_namespace(name))
            .map(|(_, record)| record.clone())
            .collect()
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

/// The machine's claim. These stores hold no token near its limit, where it would refuse.
pub(super) fn machine_claim(
    existing: Option<&idem_core::Record>,
    request: &idem_core::store::ClaimRequest,
    now: idem_core::Timestamp,
) -> Transition<idem_core::store::ClaimOutcome> {
    machine::claim(existing, request, now).expect("no token at its limit")
}
