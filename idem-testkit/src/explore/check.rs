//! The checks after a run, on the ledger alone: effects at most once unless the contract
//! allows more (and then classified so), undos at most once, every registered undo
//! accounted for, one result for everyone and replayed after, `resumed` right, `execute`
//! within its bound, no panic.
//!
//! This file runs the checks and holds those of how each `execute` ended; the others live
//! beside it: `lifetimes` (the record's lifetimes in the ledger), `leases` (who held the
//! key when), `grants` (tokens, `resumed`, renewals, late grants), `effects` (at most once,
//! or excused), `results` (one result, replayed), `compensation` (every undo accounted
//! for and where it belongs).

mod compensation;
mod effects;
mod grants;
mod leases;
mod lifetimes;
mod results;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;

use idem_core::store::Operation;

use super::faults::{PlacedFault, Process};
use super::ledger::{Answer, End, Event};
use super::report::Broken;
use super::scenarios::Scenario;
use super::{Timing, execute_bound};

use compensation::compensation;
use effects::effects;
use grants::{late_grants, renewals, resumed};
use leases::cut_before;
use lifetimes::lifetimes;
use results::results;

/// What the checks found in one run.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) broken: Vec<Broken>,
    /// Each effect that happened again as the contract allows, said why.
    pub(crate) at_least_once: Vec<String>,
}

/// Checks one run's ledger, made under `plan`; a run with no fault planned must end with
/// exactly the scenario's documented compensation.
pub(crate) fn check(
    scenario: Scenario,
    timing: &Timing,
    events: &[Event],
    retries: u32,
    plan: &[PlacedFault],
) -> Verdict {
    let fault_free = plan.is_empty();
    let mut verdict = Verdict::default();
    // Effects, compensations and results are once per lifetime of the record: a caller
    // after the record expired runs the work again, as the contract says.
    let starts = lifetimes(timing, events);
    ends(scenario, timing, events, &starts, &mut verdict);
    resumed(events, plan, &mut verdict);
    renewals(events, &mut verdict);
    late_grants(events, &starts, &mut verdict);
    effects(timing, events, &starts, &mut verdict);
    let lifetime =
        |n: usize| &events[starts[n]..starts.get(n + 1).copied().unwrap_or(events.len())];
    for n in 0..starts.len() {
        let last = n + 1 == starts.len();
        compensation(
            scenario,
            lifetime(n),
            fault_free && n == 0,
            last,
            &mut verdict,
        );
    }
    results(scenario, events, retries, &starts, &mut verdict);
    for event in events {
        if let Event::Lingered { tasks, after } = event {
            verdict.broken.push(Broken::Lingered {
                tasks: *tasks,
                after: *after,
            });
        }
    }
    verdict
}

/// Panics, executions that never returned, answers no correct driver gives, and
/// executions over their bound.
fn ends(
    scenario: Scenario,
    timing: &Timing,
    events: &[Event],
    starts: &[usize],
    verdict: &mut Verdict,
) {
    for (ended_at, event) in events.iter().enumerate() {
        let Event::Ended { process, end } = event else {
            continue;
        };
        let process = *process;
        let broken = match end {
            End::Panicked(message) => Some(Broken::Panicked {
                process,
                message: message.clone(),
            }),
            End::DidNotReturn(waited) => Some(Broken::DidNotReturn {
                process,
                waited: *waited,
            }),
            End::Setup(error) => Some(Broken::Setup {
                process,
                error: error.clone(),
            }),
            End::Returned { answer, took } => {
                // Its own result landed (a retried write whose first try was stored, a
                // commit in the work's transaction): the lease was not lost, and the
                // caller must get that result.
                // (Unless the record expired since, and a new lifetime began: that result is
                // gone, and a retry gets the new one's.)
                let own_result_stored = events[..ended_at]
                    .iter()
                    .rposition(|event| matches!(event, Event::Finished { process: p, .. } if *p == process))
                    .is_some_and(|stored| !starts.iter().any(|start| (stored..ended_at).contains(start)));
                let unexpected = match answer {
                    Answer::Error {
                        name: "lease lost" | "interrupted: lease lost",
                        ..
                    } if own_result_stored => true,
                    Answer::Error { fine, .. } => !fine,
                    // The completion scenario's work answers `Retryable` when its own
                    // commit is fenced: only after a pause or a partition lost its lease.
                    Answer::Retryable(_) => {
                        !(scenario.may_answer_retryable()
                            || scenario == Scenario::PrepareCompletion
                                && cut_before(events, process, ended_at))
                    }
                    Answer::Unknown(_) => !scenario.may_answer_unknown(),
                    _ => false,
                };
                let bound = bound(scenario, timing, events, process);
                if unexpected {
                    Some(Broken::UnexpectedAnswer {
                        process,
                        answer: answer.to_string(),
                    })
                } else if *took > bound + timing.slack {
                    Some(Broken::TooSlow {
                        process,
                        took: *took,
                        bound,
                    })
                } else {
                    None
                }
            }
            End::Dropped { .. } | End::Crashed => None,
        };
        verdict.broken.extend(broken);
    }
}

/// [`execute_bound`] for what `process` did: its work's own time, and its distinct writes.
fn bound(
    scenario: Scenario,
    timing: &Timing,
    events: &[Event],
    process: Process,
) -> std::time::Duration {
    let mut work = std::time::Duration::ZERO;
    let mut writes = BTreeSet::new();
    for event in events {
        match event {
            Event::WorkTime {
                process: p,
                duration,
            } if *p == process => work += *duration,
            Event::Call {
                process: p,
                operation,
                step,
                by_work: false,
            } if *p == process
                && matches!(
                    operation,
                    Operation::Checkpoint
                        | Operation::Complete
                        | Operation::Fail
                        | Operation::Release
                ) =>
            {
                writes.insert((operation.to_string(), step.clone()));
            }
            _ => {}
        }
    }
    let writes = u32::try_from(writes.len()).unwrap_or(u32::MAX);
    execute_bound(
        timing.lease,
        timing.store_timeout,
        scenario.wait(timing),
        work,
        writes,
    )
}
