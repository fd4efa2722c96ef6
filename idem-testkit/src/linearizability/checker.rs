//! The checker: a Wing–Gong search, with memoisation as in Lowe's and Porcupine's, for an
//! order of each key's operations that respects real time and in which the state machine
//! ([`idem_core::machine`]) gives every answer the store gave.
//!
//! Keys are checked one by one: the contract never lets an operation on one key depend on
//! another, so a history is explained when each key's is.
//!
//! # Time
//!
//! The machine's answers depend on the store's clock at the moment an operation takes
//! effect, which nobody outside the store sees. The checker lets that moment be any
//! millisecond from the operation's invocation to its return, widened by [`TOLERANCE`]
//! (the store reads its clock in whole milliseconds, or finer on PostgreSQL). It tries
//! the moments where an answer can change (a lease's end, a record's expiry, either side
//! of them), the ends of the window, and the moment an answer reveals (a claim's lease
//! ends `lease` after the claim; `retry_after` counts down to a lease's end). An
//! operation whose answer was lost may take effect at any moment after its invocation,
//! with any answer, or never.
//!
//! A record that is absent at a moment may also be gone: a store may delete absent
//! records at any time (a purge, a TTL), and a claim then starts its tokens at 1.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use idem_core::{
    Record, Timestamp, machine, raw::clamp_duration, store::ClaimOutcome, store::RenewOutcome,
};

use super::history::{Answer, Call, Operation};

/// How far past its invocation and return an operation may take effect, in milliseconds:
/// clocks read in whole milliseconds on either side, and PostgreSQL compares
/// microseconds.
pub const TOLERANCE: u64 = 2;

/// The state the search is in: which operations are placed, and the record after them.
type State = Option<Record>;

/// What searching one key found.
pub(crate) enum Search {
    /// An order explains every answer; `states` were visited.
    Explained { states: u64 },
    /// No order does.
    Unexplained,
    /// The search visited `states` without an answer either way.
    TooLong { states: u64 },
}

/// One operation as the search sees it.
struct Step<'a> {
    operation: &'a Operation,
    /// The earliest millisecond it may take effect at.
    from: u64,
    /// The latest (the end of the history when the answer was lost).
    to: u64,
}

/// Searches for an order of `operations` (one key's, in invocation order) that the state
/// machine explains from one of the states `starts`, visiting at most `budget` states.
pub(crate) fn search(operations: &[Operation], starts: &[State], budget: u64) -> Search {
    let found = explore(operations, starts, budget, false);
    if found.too_long {
        Search::TooLong {
            states: found.states,
        }
    } else if found.ends.is_empty() {
        Search::Unexplained
    } else {
        Search::Explained {
            states: found.states,
        }
    }
}

/// Every state an explained order of `operations` (from no record) can end in; `None`
/// when that takes more than `budget` states to find.
pub(crate) fn end_states(operations: &[Operation], budget: u64) -> Option<Vec<State>> {
    let found = explore(operations, &[None], budget, true);
    (!found.too_long).then_some(found.ends)
}

/// A node of the search: the placed set, the state, and the moves left to try from it.
type Node = (Vec<u64>, State, Vec<(usize, State)>);

struct Exploration {
    ends: Vec<State>,
    states: u64,
    too_long: bool,
}

/// The search: depth first, with an explicit stack of (placed set, state, the moves left
/// to try) and the (placed set, state) pairs already explored. `every_end`: go on past the
/// first explanation and gather the states every explanation ends in.
fn explore(
    operations: &[Operation],
    starts: &[State],
    budget: u64,
    every_end: bool,
) -> Exploration {
    let end = operations
        .iter()
        .filter_map(|o| o.returned)
        .chain(operations.iter().map(|o| o.invoked))
        .max()
        .map_or(0, |t| t.as_unix_millis());
    let steps: Vec<Step<'_>> = operations
        .iter()
        .map(|operation| Step {
            operation,
            from: operation.invoked.as_unix_millis().saturating_sub(TOLERANCE),
            to: operation.returned.map_or(end + TOLERANCE, |returned| {
                returned.as_unix_millis() + TOLERANCE
            }),
        })
        .collect();
    let words = steps.len().div_ceil(64);
    let mut visited: HashSet<(Vec<u64>, u64)> = HashSet::new();
    let mut found = Exploration {
        ends: Vec::new(),
        states: 0,
        too_long: false,
    };
    let mut stack: Vec<Node> = Vec::new();
    // A node is looked at once, when it is first reached.
    let reach = |placed: Vec<u64>, state: State, found: &mut Exploration| {
        if all_answered_placed(&steps, &placed) && !found.ends.contains(&state) {
            found.ends.push(state.clone());
        }
        let moves = next_moves(&steps, &placed, &state);
        (placed, state, moves)
    };
    for start in starts {
        let placed = vec![0; words];
        if visited.insert((placed.clone(), state_hash(start))) {
            stack.push(reach(placed, start.clone(), &mut found));
        }
    }
    while let Some((placed, _, moves)) = stack.last_mut() {
        if !every_end && !found.ends.is_empty() {
            return found;
        }
        let Some((index, next)) = moves.pop() else {
            stack.pop();
            continue;
        };
        let mut now_placed = placed.clone();
        now_placed[index / 64] |= 1 << (index % 64);
        if !visited.insert((now_placed.clone(), state_hash(&next))) {
            continue;
        }
        found.states += 1;
        if found.states > budget {
            found.too_long = true;
            return found;
        }
        stack.push(reach(now_placed, next, &mut found));
    }
    found
}

fn is_placed(placed: &[u64], index: usize) -> bool {
    placed[index / 64] & (1 << (index % 64)) != 0
}

fn all_answered_placed(steps: &[Step<'_>], placed: &[u64]) -> bool {
    steps
        .iter()
        .enumerate()
        .all(|(i, step)| step.operation.is_lost() || is_placed(placed, i))
}

/// Every (operation, state after it) the search may place next: an operation may go next
/// when no unplaced operation returned before it was invoked.
fn next_moves(steps: &[Step<'_>], placed: &[u64], state: &State) -> Vec<(usize, State)> {
    let first_return = steps
        .iter()
        .enumerate()
        .filter(|(i, _)| !is_placed(placed, *i))
        .filter_map(|(_, step)| step.operation.returned)
        .min();
    let mut moves = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        if is_placed(placed, i) {
            continue;
        }
        if first_return.is_some_and(|first| first < step.operation.invoked) {
            // Invocation order: every later operation is blocked too.
            break;
        }
        for next in outcomes(step, state) {
            moves.push((i, next));
        }
    }
    // Popped from the end: the earliest-invoked operation is tried first.
    moves.reverse();
    moves
}

/// The states `step` may leave after `state`, one per way the machine explains its answer.
fn outcomes(step: &Step<'_>, state: &State) -> Vec<State> {
    let mut results: Vec<State> = Vec::new();
    for now in moments(step, state.as_ref()) {
        let at = Timestamp::from_unix_millis(now);
        // An absent record may still be there, or deleted already.
        let gone = state.as_ref().is_some_and(|r| r.is_absent(at));
        let bases = if gone {
            vec![state.clone(), None]
        } else {
            vec![state.clone()]
        };
        for base in bases {
            if let Some(after) = apply(step.operation, &base, at)
                && !results.contains(&after)
            {
                results.push(after);
            }
        }
    }
    results
}

/// The moments worth trying for `step` on `record`: where the machine's answer can change,
/// the window's ends, and the moment the answer reveals.
fn moments(step: &Step<'_>, record: Option<&Record>) -> Vec<u64> {
    let mut moments = vec![step.from, step.to];
    if let Some(record) = record {
        for edge in [record.lease_until, record.expires_at] {
            let edge = edge.as_unix_millis();
            moments.extend([edge.saturating_sub(1), edge]);
        }
    }
    let operation = step.operation;
    match (&operation.call, &operation.answer) {
        (Call::Claim(request), Answer::Claim(ClaimOutcome::Claimed { lease, .. })) => {
            moments.push(lease.created_at.as_unix_millis());
            if let Some(at) = before(lease.lease_until, request.lease) {
                moments.push(at);
            }
        }
        (Call::Renew(_, extend), Answer::Renew(RenewOutcome::Renewed(lease))) => {
            if let Some(at) = before(lease.lease_until, *extend) {
                moments.push(at);
            }
        }
        (Call::Claim(_), Answer::Claim(ClaimOutcome::InFlight { retry_after, .. })) => {
            if let Some(record) = record
                && let Some(at) = before(record.lease_until, *retry_after)
            {
                moments.extend([at.saturating_sub(1), at, at + 1]);
            }
        }
        _ => {}
    }
    moments.retain(|at| (step.from..=step.to).contains(at));
    moments.sort_unstable();
    moments.dedup();
    moments
}

/// `until - duration` in milliseconds, as the store computed `until = now + duration`.
fn before(until: Timestamp, duration: Duration) -> Option<u64> {
    let millis = u64::try_from(clamp_duration(duration).as_millis()).ok()?;
    until.as_unix_millis().checked_sub(millis)
}

/// The state after `operation` at `now` on `record`, when the machine gives the answer
/// the store gave (any answer, for a lost one); `None` when it does not.
fn apply(operation: &Operation, record: &State, now: Timestamp) -> Option<State> {
    let existing = record.as_ref();
    let lost = operation.is_lost();
    let unchanged = || record.clone();
    macro_rules! write {
        ($transition:expr, $matches:expr) => {{
            let transition = $transition;
            if lost || $matches(&transition.outcome) {
                Some(transition.write.or_else(unchanged))
            } else {
                None
            }
        }};
    }
    match (&operation.call, &operation.answer) {
        (Call::Claim(request), answer) => write!(
            machine::claim(existing, request, now),
            |model: &ClaimOutcome| matches!(answer, Answer::Claim(actual) if same_claim(actual, model))
        ),
        (Call::Complete(lease, bytes), answer) => write!(
            machine::complete(existing, lease, bytes, now),
            |model: &_| matches!(answer, Answer::Write(actual) if actual == model)
        ),
        (Call::Fail(lease, bytes), answer) => write!(
            machine::fail(existing, lease, bytes, now),
            |model: &_| matches!(answer, Answer::Write(actual) if actual == model)
        ),
        (Call::Release(lease), answer) => write!(
            machine::release(existing, lease, now),
            |model: &_| matches!(answer, Answer::Write(actual) if actual == model)
        ),
        (Call::Checkpoint(lease, step, bytes), answer) => write!(
            machine::checkpoint(existing, lease, step, bytes, now),
            |model: &_| matches!(answer, Answer::Write(actual) if actual == model)
        ),
        (Call::Renew(lease, extend), answer) => write!(
            machine::renew(existing, lease, *extend, now),
            |model: &_| matches!(answer, Answer::Renew(actual) if actual == model)
        ),
        (Call::Get(_), Answer::Get(actual)) => {
            same_get(actual.as_ref(), machine::visible(existing, now)).then(unchanged)
        }
        (Call::Get(_), _) => lost.then(unchanged),
    }
}

fn same_claim(actual: &ClaimOutcome, model: &ClaimOutcome) -> bool {
    match (actual, model) {
        (
            ClaimOutcome::InFlight {
                retry_after: actual,
                ..
            },
            ClaimOutcome::InFlight {
                retry_after: model, ..
            },
        ) => actual.abs_diff(*model) <= Duration::from_millis(TOLERANCE),
        _ => actual == model,
    }
}

/// A record `get` returned against the machine's: everything but the times a write set
/// from a moment the checker only bounds (the lease's end after a release, the expiry
/// after a result) must agree.
fn same_get(actual: Option<&Record>, model: Option<&Record>) -> bool {
    match (actual, model) {
        (None, None) => true,
        (Some(a), Some(m)) => {
            a.key == m.key
                && a.fingerprint == m.fingerprint
                && a.state == m.state
                && a.token == m.token
                && a.attempt == m.attempt
                && a.created_at == m.created_at
                && a.response == m.response
                && a.steps == m.steps
        }
        _ => false,
    }
}

fn state_hash(state: &State) -> u64 {
    let mut hasher = DefaultHasher::new();
    if let Some(r) = state {
        r.key.hash(&mut hasher);
        r.fingerprint.hash(&mut hasher);
        r.state.hash(&mut hasher);
        r.token.hash(&mut hasher);
        r.attempt.hash(&mut hasher);
        r.lease_until.hash(&mut hasher);
        r.created_at.hash(&mut hasher);
        r.expires_at.hash(&mut hasher);
        r.response.hash(&mut hasher);
        r.steps.hash(&mut hasher);
    } else {
        0xdead_u64.hash(&mut hasher);
    }
    hasher.finish()
}
