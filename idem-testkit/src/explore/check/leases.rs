//! Who held the key when, read from the ledger: the last grant of a process, when a lease
//! began and ended, whether a grant broke a live lease (on the run's clock, skew undone),
//! where a process was cut off, and the token it held.

use idem_core::Timestamp;

use crate::explore::Timing;
use crate::explore::faults::Process;
use crate::explore::ledger::{Event, held_until};

/// Where the store last granted `process` a lease before `before`.
pub(super) fn last_claim(events: &[Event], process: Process, before: usize) -> Option<usize> {
    events[..before]
        .iter()
        .rposition(|event| matches!(event, Event::Claimed { process: p, .. } if *p == process))
}

/// When the lease granted at `claim_at` started: its end less one lease.
fn claimed_at(timing: &Timing, events: &[Event], claim_at: usize) -> Timestamp {
    let Event::Claimed { lease_until, .. } = &events[claim_at] else {
        return Timestamp::from_unix_millis(0);
    };
    Timestamp::from_unix_millis(
        lease_until
            .as_unix_millis()
            .saturating_sub(u64::try_from(timing.lease.as_millis()).unwrap_or(u64::MAX)),
    )
}

/// Why the store's grant to `owner` at `claim_at` broke `holder`'s live lease, if it did:
/// `holder`'s lease, as the store last granted or renewed it, still ran then, and
/// `holder` had not released it.
pub(super) fn granted_while_live(
    timing: &Timing,
    events: &[Event],
    holder: Process,
    (claim_at, owner): (usize, Process),
) -> Option<String> {
    let granted = claimed_at(timing, events, claim_at);
    let held_until = held_until(&events[..claim_at], holder);
    let released = events[..claim_at]
        .iter()
        .any(|event| matches!(event, Event::Released { process } if *process == holder));
    if released {
        return None;
    }
    let until = held_until?;
    if until > granted {
        return Some(format!(
            "the store granted {owner} the key while {holder}'s lease was live"
        ));
    }
    // Each time is on its process's clock, as the store saw it. On the run's clock, a grant
    // earlier than the holder's end by more than the driver's margin is one the clocks'
    // skew made: the holder still counted its lease live.
    let margin = timing.lease / 50;
    let (until, granted) = (
        on_run_clock(timing, holder, until),
        on_run_clock(timing, owner, granted),
    );
    (until.as_unix_millis() > granted.as_unix_millis() + millis(margin)).then(|| {
        format!(
            "the store granted {owner} the key {} ms before {holder}'s lease ended on the \
             run's clock: their clocks are {} ms apart, past the driver's margin of {} ms",
            until.as_unix_millis() - granted.as_unix_millis(),
            millis(timing.skew) * 2,
            millis(margin)
        )
    })
}

pub(super) fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `at`, read on `process`'s clock, on the run's clock: undoes [`Timing::skew`] (the
/// first caller's clock runs behind, every other process's ahead, the check's exact).
fn on_run_clock(timing: &Timing, process: Process, at: Timestamp) -> Timestamp {
    match process {
        Process::First => at.saturating_add(timing.skew),
        Process::Check => at,
        _ => Timestamp::from_unix_millis(at.as_unix_millis().saturating_sub(millis(timing.skew))),
    }
}

/// True when `process` was cut off (paused or partitioned) after its last grant before
/// `at`, and before `at`.
pub(super) fn cut_before(events: &[Event], process: Process, at: usize) -> bool {
    cut_at(events, process, at).is_some()
}

/// Where `process` was first cut off (paused or partitioned) after its last grant before
/// `at`, and before `at`.
pub(super) fn cut_at(events: &[Event], process: Process, at: usize) -> Option<usize> {
    let held_from = last_claim(events, process, at).unwrap_or(0);
    events[held_from..at]
        .iter()
        .position(|event| matches!(event, Event::CutOff { process: p, .. } if *p == process))
        .map(|offset| held_from + offset)
}

/// The token `process` held at `at`: its last grant's before (zero if none).
pub(super) fn token_at(events: &[Event], process: Process, at: usize) -> u64 {
    events[..at]
        .iter()
        .rev()
        .find_map(|event| match event {
            Event::Claimed {
                process: p, token, ..
            } if *p == process => Some(*token),
            _ => None,
        })
        .unwrap_or(0)
}
