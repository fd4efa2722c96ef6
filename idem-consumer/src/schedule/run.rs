//! Running slots: one slot, the slots due at a time, and the loop that runs the job for
//! ever, with what each answer means for the next look at its slot.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_core::codec::CodecError;
use idem_core::{Context, Error, Outcome, Store, WorkError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Backlog, MAX_CATCH_UP_SLOTS, ScheduledJob, SlotRun};

impl<S: Store + ?Sized + 'static> ScheduledJob<S> {
    /// Runs `work` for `slot` (rounded down to a slot), once across every scheduler.
    ///
    /// - Not run before: claims the slot, runs `work`, stores its answer.
    /// - Finished before: the stored answer, `replayed`; `work` does not run.
    /// - Another scheduler runs it: [`Error::InFlight`] (or a wait, with
    ///   [`InFlightPolicy::Wait`](idem_core::InFlightPolicy::Wait) on the driver).
    /// - Its scheduler crashed and the lease ended: taken over, resuming through its
    ///   steps.
    ///
    /// # Errors
    /// As [`Idempotency::execute`].
    ///
    /// [`Idempotency::execute`]: idem_core::Idempotency::execute
    pub async fn run_slot<T, E, F, Fut>(
        &self,
        slot: SystemTime,
        work: F,
    ) -> Result<Outcome<T, E>, Error>
    where
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: FnOnce(Context, SystemTime) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let slot = self.slot_at(slot);
        let deadline = crate::deadline::WorkDeadline::default();
        let key = self.key_of(slot);
        let run = self.idem.execute(&key, self.fingerprint(), |ctx| {
            deadline.wrap(work(ctx, slot))
        });
        tokio::select! {
            biased;
            answer = run => answer,
            limit = deadline.expired(self.slot_timeout) => {
                // `execute` dropped mid-work: the slot's lease is kept, so it is in
                // flight until the lease ends, then taken over.
                tracing::warn!(job = %self.name, key = %self.key_of(slot).short_hash(), ?limit, "idem-consumer: stopped a slot's work past its timeout; it is taken over once its lease ends");
                Err(Error::InFlight {
                    retry_after: self.idem.lease(),
                })
            }
        }
    }

    /// Runs every slot due at `now` ([`ScheduledJob::due_slots`]), oldest first.
    pub async fn run_due<T, E, F, Fut>(&self, now: SystemTime, work: &F) -> Vec<SlotRun<T, E>>
    where
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: Fn(Context, SystemTime) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let mut runs = Vec::new();
        for slot in self.due_slots(now) {
            let answer = self.run_slot(slot, work).await;
            runs.push(SlotRun { slot, answer });
        }
        runs
    }

    /// Runs the job for ever: a tick at each slot, and sooner when a slot another
    /// scheduler held may be taken over, or a retryable failure may run again. Abort the
    /// task to stop it: a slot cut off mid-work is taken over when its lease ends.
    ///
    /// - Every slot due since the previous tick is asked, however long that tick's work
    ///   took, besides the catch-up window: those within half the retention, at most
    ///   2 × [`MAX_CATCH_UP_SLOTS`] of them.
    /// - Slots with a final answer are remembered and not asked again while in the window.
    /// - Slots seen unfinished (in flight elsewhere, retryable, unknown, a store that
    ///   failed) are asked again until they finish, even after leaving the window, for at
    ///   most half the retention since they were last seen unfinished: a record finished
    ///   after that sighting is kept a whole retention, so asking again never runs a slot
    ///   twice (at most [`MAX_CATCH_UP_SLOTS`] of them).
    /// - Final answers: a result or failure, now or before; a mismatch (schedulers
    ///   disagreeing on the schedule), a refused key, an unstorable result, a stored
    ///   answer altered or malformed. Anything else is asked again.
    /// - Each slot's run and each final failure is logged once, by the key's short hash.
    pub async fn run<T, E, F, Fut>(&self, work: F) -> std::convert::Infallible
    where
        T: Serialize + DeserializeOwned + 'static,
        E: Serialize + DeserializeOwned + 'static,
        F: Fn(Context, SystemTime) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let mut finished = BTreeSet::new();
        // Each unfinished slot, with when it was last seen unfinished.
        let mut unfinished: BTreeMap<SystemTime, SystemTime> = BTreeMap::new();
        let mut next_due: Option<SystemTime> = None;
        let forget_after = self.idem.retention() / 2;
        let mut retries: BTreeMap<SystemTime, u32> = BTreeMap::new();
        loop {
            // A clock up to `skew` fast takes a slot as due no earlier than its time.
            let now = self.now();
            let current = self.slot_at(now);
            let mut slots: BTreeSet<SystemTime> = self.due_slots(now).into_iter().collect();
            // Slots that came and went while the last tick's work ran.
            let oldest_safe = now.checked_sub(forget_after).unwrap_or(UNIX_EPOCH);
            let mut slot = self.slot_at(next_due.unwrap_or(current).max(oldest_safe));
            if slot < next_due.unwrap_or(current).max(oldest_safe) {
                slot = self.next_slot_after(slot);
            }
            while slot <= current && (slots.len() as u64) < 2 * MAX_CATCH_UP_SLOTS {
                slots.insert(slot);
                let next = self.next_slot_after(slot);
                if next <= slot {
                    break;
                }
                slot = next;
            }
            next_due = Some(self.next_slot_after(current));
            if let Some(start) = self.not_before {
                slots.retain(|slot| *slot >= start);
            }
            self.trim_backlog(now, &mut slots, &finished, &unfinished);
            slots.extend(unfinished.keys().copied());
            let mut wake = self.next_slot_after(now);
            for slot in slots {
                if finished.contains(&slot) {
                    continue;
                }
                // Checked now, not at the tick's start: this tick's earlier work may have
                // run long. A slot finished at or after its time is kept a retention from
                // then, so it is asked only while that retention (less a period, for
                // rounding) cannot have run out, and a remembered one only within half the
                // retention of the last answer that showed it unfinished.
                // The real clock: the skew only decides when a slot is due.
                let asked_at = SystemTime::now() + self.skew;
                let record_may_be_gone = asked_at + self.period >= slot + self.idem.retention();
                let stale = unfinished.get(&slot).is_some_and(|seen| {
                    asked_at.duration_since(*seen).unwrap_or_default() >= forget_after
                });
                if record_may_be_gone || stale {
                    if unfinished.remove(&slot).is_some() {
                        tracing::warn!(job = %self.name, key = %self.key_of(slot).short_hash(), "idem-consumer: a slot stayed unfinished too long; no longer looking at it");
                    }
                    continue;
                }
                let answer = self.run_slot(slot, &work).await;
                let retried = matches!(answer, Ok(Outcome::Retryable(_)));
                let tries = if retried {
                    let tries = retries.entry(slot).or_default();
                    *tries = tries.saturating_add(1);
                    *tries
                } else {
                    retries.remove(&slot);
                    0
                };
                match self.again_after(slot, &answer, tries) {
                    Some(after) => {
                        // Only an answer that shows the record unfinished restarts the
                        // clock; a store failure or an unreadable record shows nothing.
                        if shows_unfinished(&answer) {
                            unfinished.insert(slot, SystemTime::now());
                        } else {
                            unfinished.entry(slot).or_insert_with(SystemTime::now);
                        }
                        wake = wake.min(now + after.max(Duration::from_millis(1)));
                    }
                    None => {
                        unfinished.remove(&slot);
                        finished.insert(slot);
                    }
                }
            }
            // What left the window is never asked again: forget it.
            let earliest = self.due_slots(now).first().copied().unwrap_or(now);
            finished.retain(|slot| *slot >= earliest);
            retries.retain(|slot, _| unfinished.contains_key(slot));
            let checked = SystemTime::now();
            unfinished.retain(|slot, seen| {
                let keep = checked.duration_since(*seen).unwrap_or_default() < forget_after;
                if !keep {
                    tracing::warn!(job = %self.name, key = %self.key_of(*slot).short_hash(), "idem-consumer: a slot stayed unfinished for half the retention; no longer looking at it");
                }
                keep
            });
            while unfinished.len() as u64 > MAX_CATCH_UP_SLOTS {
                let (oldest, _) = unfinished.pop_first().expect("the map is not empty");
                tracing::warn!(job = %self.name, key = %self.key_of(oldest).short_hash(), "idem-consumer: too many unfinished slots; no longer looking at the oldest");
            }
            let pause = wake.duration_since(self.now()).unwrap_or_default();
            tokio::time::sleep(pause.max(Duration::from_millis(1))).await;
        }
    }

    /// The scheduler's clock, less the tolerated skew.
    fn now(&self) -> SystemTime {
        let now = SystemTime::now();
        now.checked_sub(self.skew).unwrap_or(now)
    }

    /// The wait before a slot's `tries`th retryable failure runs again: from the shorter
    /// of the period and a second, doubling, at most the longer of the period and a
    /// minute, jittered to between half and all of it so that replicas do not retry in
    /// step.
    fn retry_delay(&self, slot: SystemTime, tries: u32) -> Duration {
        let first = self.shortest_gap().min(Duration::from_secs(1));
        let most = self.period.max(Duration::from_secs(60));
        let delay = first
            .checked_mul(1 << tries.saturating_sub(1).min(20))
            .unwrap_or(most)
            .min(most);
        // Jitter from the clock's low bits and the slot: no generator to seed or share.
        let noise = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos()
            ^ (slot
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis() as u32)
                .rotate_left(tries);
        let fraction = 0.5 + f64::from(noise % 1000) / 2000.0;
        delay.mul_f64(fraction).max(Duration::from_millis(1))
    }

    /// Drops the oldest slots that came and went beyond what [`Backlog`] runs.
    fn trim_backlog(
        &self,
        now: SystemTime,
        slots: &mut BTreeSet<SystemTime>,
        finished: &BTreeSet<SystemTime>,
        unfinished: &BTreeMap<SystemTime, SystemTime>,
    ) {
        let Backlog::Latest(keep) = self.backlog else {
            return;
        };
        // The catch-up window's slots stay: one of them may be a crashed scheduler's,
        // waiting to be taken over.
        let window = self.due_slots(now).first().copied().unwrap_or(now);
        let fresh = |slot: &&SystemTime| !finished.contains(slot) && !unfinished.contains_key(slot);
        // The window's slots count toward `keep`, and are never dropped.
        let in_window = slots
            .iter()
            .filter(fresh)
            .filter(|slot| **slot >= window)
            .count();
        let older: Vec<SystemTime> = slots
            .iter()
            .filter(fresh)
            .filter(|slot| **slot < window)
            .copied()
            .collect();
        let keep = keep.get().saturating_sub(in_window);
        let skipped = older.len().saturating_sub(keep);
        if skipped == 0 {
            return;
        }
        for slot in &older[..skipped] {
            slots.remove(slot);
        }
        tracing::warn!(job = %self.name, skipped, "idem-consumer: skipping slots that came and went, as the backlog setting says");
    }

    /// `None` when `answer` is final for `slot` (logged once here), else how soon to ask
    /// again.
    fn again_after<T, E>(
        &self,
        slot: SystemTime,
        answer: &Result<Outcome<T, E>, Error>,
        tries: u32,
    ) -> Option<Duration> {
        let key = self.key_of(slot).short_hash();
        match answer {
            Ok(Outcome::Completed { replayed, .. }) => {
                if !replayed {
                    tracing::info!(job = %self.name, %key, "idem-consumer: slot ran");
                }
                None
            }
            Ok(Outcome::Failed { replayed, .. }) | Ok(Outcome::Compensated { replayed, .. }) => {
                if !replayed {
                    tracing::warn!(job = %self.name, %key, "idem-consumer: slot failed for good");
                }
                None
            }
            Ok(Outcome::Retryable(_)) => Some(self.retry_delay(slot, tries)),
            Ok(Outcome::Unknown(_)) => Some(self.idem.lease()),
            Ok(_) => Some(self.idem.lease()),
            Err(Error::InFlight { retry_after }) => Some(*retry_after),
            // Answers no retry can change.
            Err(
                err @ (Error::Mismatch
                | Error::KeyRefused(_)
                | Error::Unstorable { .. }
                | Error::Codec {
                    source: CodecError::Unauthentic { .. } | CodecError::Malformed { .. },
                    ..
                }),
            ) => {
                tracing::warn!(job = %self.name, %key, error = %err, "idem-consumer: slot cannot run");
                None
            }
            Err(err) if err.is_retryable() || matches!(err, Error::Store(_)) => {
                Some(Duration::from_secs(1))
            }
            // Our own side (a codec key this process lacks, a newer stored type, an
            // interruption): another look once the lease ends.
            Err(err) => {
                tracing::warn!(job = %self.name, %key, error = %err, "idem-consumer: slot not run yet; asking again after the lease");
                Some(self.idem.lease())
            }
        }
    }
}

/// Whether `answer` shows the slot's record unfinished (held, released, in flight), as
/// opposed to showing nothing about it (a store failure, a record this process cannot read).
fn shows_unfinished<T, E>(answer: &Result<Outcome<T, E>, Error>) -> bool {
    matches!(
        answer,
        Ok(Outcome::Retryable(_) | Outcome::Unknown(_))
            | Err(Error::InFlight { .. }
                | Error::LeaseLost
                | Error::CompensationPending { .. }
                | Error::KeyBudgetExhausted { .. })
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::Idempotency;

    #[test]
    fn retries_back_off_with_jitter_within_their_bounds() {
        let idem = Idempotency::new(idem_core::MemoryStore::new());
        let job = ScheduledJob::new(idem, "job", Duration::from_secs(10)).unwrap();
        let slot = UNIX_EPOCH + Duration::from_secs(1_796_162_400);
        for tries in 1..=40u32 {
            let full = Duration::from_secs(1)
                .checked_mul(1 << (tries - 1).min(20))
                .unwrap()
                .min(Duration::from_secs(60));
            let delay = job.retry_delay(slot, tries);
            assert!(
                delay >= full / 2 && delay <= full,
                "try {tries}: {delay:?} of {full:?}"
            );
        }
    }
}
