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
//! of them), the ends of the window (its end cut at the answered calls still to come,
//! see [`next_moves`]), and the moment an answer reveals (a claim's lease
//! ends `lease` after the claim; `retry_after` counts down to a lease's end). An
//! operation whose answer was lost may take effect once, with any answer, from its
//! invocation until the lost grace ([`LOST_GRACE`] by default) after its client gave up
//! (tried at the moments above), or never; and no later than the return (plus
//! [`TOLERANCE`]) of each answered call placed after it, since a store reads the time it
//! writes before the write takes effect (see [`next_moves`]).
//!
//! The moments follow the order: an operation placed after another takes effect at the
//! same millisecond or later (less [`TOLERANCE`], for clocks read on either side of a
//! millisecond's edge), as on a store whose clock only moves forward; or, for a store
//! checked with moments in any order, at any millisecond of its window. Real-time order
//! between calls is kept to the nanosecond ([`Operation::invoked_ns`]).
//!
//! A record that is absent at a moment may also be gone: a store may delete absent
//! records at any time (a purge, a TTL), and a claim then starts its tokens at 1.
//!
//! This file holds the search itself; beside it, `nodes` keeps the placed sets and the
//! nodes already reached, `moves` finds the moves from a node and the moments each may
//! take, and `answers` says whether the machine gives the store's answer.

mod answers;
mod moves;
mod nodes;
#[cfg(test)]
mod tests;

use std::time::Duration;

use idem_core::{Record, raw::clamp_duration, store::ClaimOutcome, store::RenewOutcome};

use super::history::{Answer, Call, Operation};
use moves::{OutcomeCache, next_moves};
use nodes::{Visited, all_answered_placed, floor_of, place, retire_lost, state_hash};

/// How far past its invocation and return an operation may take effect, in milliseconds:
/// clocks read in whole milliseconds on either side, and PostgreSQL compares
/// microseconds.
pub const TOLERANCE: u64 = 2;

/// How long after its client gave up a call whose answer was lost may still take effect,
/// by default: a request held in a buffer or a slow network still reaches the server.
pub const LOST_GRACE: Duration = Duration::from_secs(1);

/// What bounds a search.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// The most states one search visits.
    pub(crate) budget: u64,
    /// How long after its client gave up a lost call may take effect.
    pub(crate) lost_grace: Duration,
    /// Whether the moments follow the order (the store reads its clock where its writes
    /// take effect); see [`Checker::moments_in_any_order`](super::Checker::moments_in_any_order).
    pub(crate) ordered_moments: bool,
    /// The first round's budget per order of moves, where answers were lost (see
    /// [`search`]).
    pub(crate) first_round: u64,
}

/// The record after the placed operations (the search's state is that, the placed set,
/// and the latest moment they took effect at).
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
    /// The latest (for a lost answer, the grace after the client gave up).
    to: u64,
    /// The last nanosecond it may take effect at: its return, or for a lost answer the
    /// end of the last millisecond of its window. A call invoked later comes after it in
    /// every order (a lost one, if it is placed at all).
    last_ns: u64,
    /// Moments in the window that later answers point at (see [`derived_moments`]).
    derived: Vec<u64>,
}

/// Every time an answer of the key's history shows (a lease's end, a record's creation or
/// expiry, a lease's end about `retry_after` after an in-flight answer), with the return
/// of the operation that showed it, sorted by time. Any field may show another's time: a
/// record created the moment the one before it expired shows that expiry.
fn revealed_times(operations: &[Operation]) -> Vec<(u64, u64)> {
    let mut times = Vec::new();
    for operation in operations {
        let by = operation.returned.as_unix_millis();
        match &operation.answer {
            Answer::Claim(ClaimOutcome::Claimed { lease, .. })
            | Answer::Renew(RenewOutcome::Renewed(lease)) => {
                times.extend(
                    [lease.lease_until, lease.created_at].map(|t| (t.as_unix_millis(), by)),
                );
            }
            Answer::Get(Some(record)) => times.extend(
                [record.lease_until, record.created_at, record.expires_at]
                    .map(|t| (t.as_unix_millis(), by)),
            ),
            // `retry_after` counts down to the lease's end from the claim's moment,
            // somewhere in its window: the lease ends about `retry_after` after the
            // claim's invocation or its return.
            Answer::Claim(ClaimOutcome::InFlight { retry_after, .. }) => {
                let left = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
                times.extend(
                    [operation.invoked.as_unix_millis(), by]
                        .map(|at| (at.saturating_add(left), by)),
                );
            }
            _ => {}
        }
    }
    times.sort_unstable();
    times.dedup();
    times
}

/// The moments in `from..=to` at which `operation` would write a time that some answer
/// shows: a write's `now` is seen later only through the times it set (`now + lease`,
/// `now + retention`, `now + lease + retention` after a takeover, `now` itself), so each
/// shown time, less each duration the
/// operation adds, is a moment it may have taken effect at; and the millisecond before,
/// for stores that keep finer times.
fn derived_moments(operation: &Operation, from: u64, to: u64, revealed: &[(u64, u64)]) -> Vec<u64> {
    let millis = |d: Duration| u64::try_from(clamp_duration(d).as_millis()).unwrap_or(u64::MAX);
    // The durations the operation adds to its `now` in what it writes.
    let offsets: Vec<u64> = match &operation.call {
        // A takeover keeps the record one retention past its lease.
        Call::Claim(request) => vec![
            0,
            millis(request.lease),
            millis(request.retention),
            millis(request.lease).saturating_add(millis(request.retention)),
        ],
        Call::Complete(lease, _) | Call::Fail(lease, _) => vec![millis(lease.retention)],
        Call::Release(_) => vec![0],
        Call::Renew(lease, extend) => vec![
            millis(*extend),
            millis(*extend).saturating_add(millis(lease.retention)),
        ],
        Call::Checkpoint(..) | Call::Get(_) => Vec::new(),
    };
    let invoked = operation.invoked.as_unix_millis();
    let mut moments = Vec::new();
    for offset in offsets {
        let low = from.saturating_add(offset);
        let high = to.saturating_add(offset).saturating_add(1);
        let start = revealed.partition_point(|&(t, _)| t < low);
        for &(t, by) in revealed[start..].iter().take_while(|&&(t, _)| t <= high) {
            // Only an answer to a call that may be placed after this one (it returned
            // after this one was invoked) can show what this one wrote.
            if by >= invoked {
                let at = t - offset;
                moments.extend([at.saturating_sub(1), at]);
            }
        }
    }
    moments.retain(|at| (from..=to).contains(at));
    moments.sort_unstable();
    moments.dedup();
    moments
}

/// Searches for an order of `operations` (one key's, in invocation order) that the state
/// machine explains from one of the states `starts`, within `limits`.
///
/// Where answers were lost, the search restarts, alternating the order it tries moves in
/// and growing its budget fourfold each round, and the last search takes what is left of
/// the budget (at the default, 1 700 000 of 2 000 000 states). A backtracking search's
/// length is heavy-tailed: most histories are explained at about one state per call, and
/// the rare long one has gone wrong near its start (a lost call whose effect shows only
/// much later), which another order of moves meets at once. Each search is complete, so
/// an unexplained history is still one that no order explains.
pub(crate) fn search(operations: &[Operation], starts: &[State], limits: Limits) -> Search {
    // Without a lost call every order tries the same moves: one search with it all.
    let orders: &[MoveOrder] = if operations.iter().any(Operation::is_lost) {
        &[MoveOrder::Answered, MoveOrder::LatestLost, MoveOrder::Lost]
    } else {
        &[MoveOrder::Answered]
    };
    let mut spent: u64 = 0;
    let mut round = limits.first_round.max(1);
    loop {
        let left = limits.budget.saturating_sub(spent);
        // The last round: what is left goes to one search, whole, so that a history
        // that needs most of the budget is still decided.
        let last = orders.len() == 1 || round.saturating_mul(orders.len() as u64 * 4) > left;
        let runs: &[MoveOrder] = if last { &orders[..1] } else { orders };
        for &order in runs {
            let budget = if last { left } else { round };
            let found = explore(
                operations,
                starts,
                Limits { budget, ..limits },
                false,
                order,
            );
            spent = spent.saturating_add(found.states);
            if !found.too_long {
                return if found.ends.is_empty() {
                    Search::Unexplained
                } else {
                    Search::Explained { states: spent }
                };
            }
        }
        if last {
            return Search::TooLong { states: spent };
        }
        round = round.saturating_mul(4);
    }
}

/// The first round's budget per order (then four times as many each round), by default:
/// the usual search takes about one state per call, so a few thousand calls fit in it.
pub(crate) const FIRST_ROUND: u64 = 20_000;

/// Which moves a search tries first at each node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MoveOrder {
    /// The calls with an answer, the earliest invoked first, then the lost calls,
    /// earliest first: right for most histories, where a lost call changed nothing
    /// anyone saw.
    Answered,
    /// The calls with an answer first, then the lost calls, the latest invoked first:
    /// right where an answer shows the effect of the last of several lost calls (a
    /// result stored just before the server went down, after claims lost in the outage
    /// that each could have taken the record over).
    LatestLost,
    /// The lost calls first, earliest first: right where a lost call's effect shows only
    /// later, after calls that could have come either side of it.
    Lost,
}

/// Every state an explained order of `operations` (from no record) can end in; `None`
/// when that takes more than the budget to find.
pub(crate) fn end_states(operations: &[Operation], limits: Limits) -> Option<Vec<State>> {
    let found = explore(operations, &[None], limits, true, MoveOrder::Answered);
    (!found.too_long).then_some(found.ends)
}

/// A node of the search: the placed set (with the lost calls that can no longer be
/// placed, see [`retire_lost`]), the latest invocation among them, and the moves left to
/// try from it.
struct Node {
    placed: Vec<u64>,
    latest_invoked_ns: u64,
    moves: Vec<Move>,
}

/// An operation to place next: its index, the state after it, and the moment the search
/// is at after it.
type Move = (usize, State, u64);

struct Exploration {
    ends: Vec<State>,
    states: u64,
    too_long: bool,
}

/// The search: depth first, with an explicit stack of nodes and the (placed set, state,
/// moment) triples already explored. (A node at a later moment is not subsumed by one
/// at an earlier moment: the moment itself is one of the moments the next operation
/// tries.) `every_end`: go on past the first explanation and gather the states every
/// explanation ends in.
fn explore(
    operations: &[Operation],
    starts: &[State],
    limits: Limits,
    every_end: bool,
    order: MoveOrder,
) -> Exploration {
    let revealed = revealed_times(operations);
    let grace = u64::try_from(limits.lost_grace.as_millis()).unwrap_or(u64::MAX);
    let steps: Vec<Step<'_>> = operations
        .iter()
        .map(|operation| {
            let from = operation.invoked.as_unix_millis().saturating_sub(TOLERANCE);
            let returned = operation
                .returned
                .as_unix_millis()
                .saturating_add(TOLERANCE);
            let to = if operation.is_lost() {
                returned.saturating_add(grace)
            } else {
                returned
            };
            Step {
                operation,
                from,
                to,
                last_ns: if operation.is_lost() {
                    to.saturating_add(1).saturating_mul(1_000_000) - 1
                } else {
                    operation.returned_ns
                },
                derived: derived_moments(operation, from, to, &revealed),
            }
        })
        .collect();
    let words = steps.len().div_ceil(64);
    let lost: Vec<usize> = (0..steps.len())
        .filter(|&i| steps[i].operation.is_lost())
        .collect();
    let mut visited = Visited::new(&lost, words, !limits.ordered_moments);
    let mut found = Exploration {
        ends: Vec::new(),
        states: 0,
        too_long: false,
    };
    let mut stack: Vec<Node> = Vec::new();
    // A node is looked at once, when it is first reached.
    let mut cache = OutcomeCache::default();
    let mut reach = |placed: Vec<u64>,
                     latest_invoked_ns: u64,
                     state: State,
                     floor: u64,
                     found: &mut Exploration| {
        if all_answered_placed(&steps, &placed) && !found.ends.contains(&state) {
            found.ends.push(state.clone());
        }
        let moves = next_moves(
            &steps,
            &placed,
            &state,
            floor,
            &mut cache,
            order,
            limits.ordered_moments,
        )
        .into_iter()
        .map(|(i, next, at)| (i, next, if limits.ordered_moments { at } else { 0 }))
        .collect();
        Node {
            placed,
            latest_invoked_ns,
            moves,
        }
    };
    for start in starts {
        let placed = vec![0; words];
        if visited.insert(&placed, state_hash(start), 0) {
            stack.push(reach(placed, 0, start.clone(), 0, &mut found));
        }
    }
    while let Some(node) = stack.last_mut() {
        if !every_end && !found.ends.is_empty() {
            return found;
        }
        let Some((index, next, floor)) = node.moves.pop() else {
            stack.pop();
            continue;
        };
        let mut placed = node.placed.clone();
        place(&mut placed, index);
        let latest = node
            .latest_invoked_ns
            .max(steps[index].operation.invoked_ns);
        retire_lost(&steps, &lost, &mut placed, latest);
        let floor = floor_of(&steps, &placed, floor);
        if !visited.insert(&placed, state_hash(&next), floor) {
            continue;
        }
        found.states += 1;
        if found.states > limits.budget {
            found.too_long = true;
            return found;
        }
        stack.push(reach(placed, latest, next, floor, &mut found));
    }
    found
}
