//! The check of the results: one for every caller of a lifetime of the record, of the
//! scenario's kind, and replayed to the final check.

use std::collections::BTreeMap;

use super::Verdict;
use super::lifetimes::grant_lifetime;
use crate::explore::faults::Process;
use crate::explore::ledger::{Answer, End, Event};
use crate::explore::report::Broken;
use crate::explore::scenarios::{Expect, Scenario};

/// Every caller with a result got the same one, of the scenario's kind, and the retry
/// after replayed it.
/// One result for every caller of a lifetime of the record (`starts`), replayed to the
/// final check. A caller granted the key in a later lifetime ran the work again and agrees
/// with that lifetime's first result; a check granted the key runs it again itself.
pub(super) fn results(
    scenario: Scenario,
    events: &[Event],
    retries: u32,
    starts: &[usize],
    verdict: &mut Verdict,
) {
    // A process answers for the lifetime of its last grant, or, never granted the key (a
    // replay), for the one its answer came in.
    let lifetime_of =
        |process: Process, ended_at: usize| grant_lifetime(events, starts, process, ended_at);
    let answers: Vec<(Process, &Answer, usize)> = events
        .iter()
        .enumerate()
        .filter_map(|(at, event)| match event {
            Event::Ended {
                process,
                end: End::Returned { answer, .. },
            } => Some((*process, answer, lifetime_of(*process, at))),
            _ => None,
        })
        .collect();
    let with_results: Vec<(Process, &Answer, String, usize)> = answers
        .iter()
        .filter_map(|(process, answer, n)| answer.result().map(|r| (*process, *answer, r, *n)))
        .collect();
    let Some((_, first_answer, first_result, _)) = with_results.first() else {
        verdict.broken.push(Broken::NoResult { retries });
        return;
    };
    let mut firsts: BTreeMap<usize, (Process, &String)> = BTreeMap::new();
    for (process, _, result, n) in &with_results {
        let (first, seen) = *firsts.entry(*n).or_insert((*process, result));
        if result != seen {
            verdict.broken.push(Broken::ResultsDiffer {
                first: (first, seen.clone()),
                other: (*process, result.clone()),
            });
        }
    }
    let kind_fits = matches!(
        (scenario.expect(), first_answer),
        (Expect::Completed, Answer::Completed { .. })
            | (Expect::Failed, Answer::Failed { .. })
            | (Expect::Compensated, Answer::Compensated { .. })
            | (Expect::Marked, Answer::Marked { .. })
    );
    if !kind_fits {
        verdict.broken.push(Broken::UnexpectedResult {
            expected: match scenario.expect() {
                Expect::Completed => "completed",
                Expect::Failed => "failed",
                Expect::Compensated => "compensated",
                Expect::Marked => "with a stored failure marker",
            },
            got: first_result.clone(),
        });
    }
    let check = events
        .iter()
        .enumerate()
        .find_map(|(at, event)| match event {
            Event::Ended {
                process: Process::Check,
                end,
            } => Some((at, end)),
            _ => None,
        });
    // The check's claim began a lifetime: the record had expired.
    let renewed_check = events.iter().enumerate().any(|(at, event)| {
        matches!(
            event,
            Event::Claimed {
                process: Process::Check,
                ..
            }
        ) && starts[1..].contains(&at)
    });
    // The result the check must replay: the last lifetime's that has one.
    let (_, (_, last_result)) = firsts.iter().next_back().expect("a result was found above");
    let lost = match check {
        // The check ran the work again, in a lifetime of its own (its result was compared
        // with that lifetime's above).
        Some(_) if renewed_check => None,
        Some((_, End::Returned { answer, .. })) => {
            if answer.result().as_ref() != Some(*last_result) {
                Some(answer.to_string())
            } else if !answer.replayed() {
                Some(format!("{answer}, run again instead of replayed"))
            } else {
                None
            }
        }
        Some((_, other)) => Some(other.to_string()),
        None => Some("no answer: the check never ran".into()),
    };
    if let Some(then) = lost {
        verdict.broken.push(Broken::ResultLost {
            seen: (*last_result).clone(),
            then,
        });
    }
}
