//! The moves from a node: which operations may go next, the states each may leave, and
//! the moments worth trying for it.

use std::collections::HashMap;
use std::time::Duration;

use idem_core::{Record, Timestamp, raw::clamp_duration, store::ClaimOutcome, store::RenewOutcome};

use super::answers::apply;
use super::nodes::{is_placed, state_hash};
use super::{Move, MoveOrder, State, Step, TOLERANCE};
use crate::linearizability::history::{Answer, Call};

/// Every move the search may make next from a node at moment `floor`: an operation may go
/// next when no unplaced operation with an answer returned before it was invoked (a lost
/// call blocks no one: it may never have taken effect, and it is retired once a call
/// invoked after its window is placed).
///
/// A call placed next takes effect no later than the end of every other unplaced answered
/// call's window (plus [`TOLERANCE`]): its window is cut there, and that end is one of
/// the moments it tries (where moments come in any order, only when the cut took away a
/// moment it would have tried: the end depends on the node, and a moment tried at every
/// node defeats the memoisation).
/// - Where the moments follow the order (`ordered`), for every call: a later moment
///   would leave the answered call no moment to take effect at.
/// - Where they come in any order, for a lost call: it is placed only where it writes,
///   a store reads the time it writes before the write takes effect, and a call placed
///   before an answered one took effect before that one returned. An answered call is
///   not held to this: its answer may be worked out from a read and a clock read after
///   it (DynamoDB's `get`, and its claim's answer from a read).
///
/// Without the cut, a lost call that may take effect long after (its window runs a grace
/// past its client's giving up) is tried at each of its moments, in each order with the
/// other lost calls, before the search backs up past a mistake made a few answered calls
/// earlier. The cut's end stands in for the latest moment, as the window's end did: a
/// lost result that lands just before a replay of it (which shows no time) is placed
/// there.
pub(super) fn next_moves(
    steps: &[Step<'_>],
    placed: &[u64],
    state: &State,
    floor: u64,
    cache: &mut OutcomeCache,
    order: MoveOrder,
    ordered: bool,
) -> Vec<Move> {
    let answered = || {
        steps
            .iter()
            .enumerate()
            .filter(|(i, step)| !is_placed(placed, *i) && !step.operation.is_lost())
    };
    let first_return = answered().map(|(_, step)| step.last_ns).min();
    // The earliest window end among the unplaced answered calls. (An answered call's own
    // end is below it plus the tolerance, so it needs no leaving out.)
    let end = answered().map(|(_, step)| step.to).min();
    // The latest moment a call may take effect at from this node, and whether that is a
    // moment to try.
    let latest = |step: &Step<'_>| {
        let cut = match end {
            Some(end) if ordered || step.operation.is_lost() => {
                step.to.min(end.saturating_add(TOLERANCE))
            }
            _ => step.to,
        };
        (cut, ordered || cut == step.to)
    };
    let mut moves = Vec::new();
    let mut lost = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        if is_placed(placed, i) {
            continue;
        }
        if first_return.is_some_and(|first| first < step.operation.invoked_ns) {
            // Invocation order: every later operation is blocked too.
            break;
        }
        let placements = cache
            .outcomes(i, step, state, floor, latest(step))
            .into_iter()
            .map(|(next, at)| (i, next, at.max(floor)));
        if step.operation.is_lost() {
            lost.extend(placements);
        } else {
            moves.extend(placements);
        }
    }
    // Popped from the end: the earliest-invoked operation of the kind `order` puts first
    // is tried first.
    let mut moves = match order {
        MoveOrder::Answered => [moves, lost].concat(),
        MoveOrder::LatestLost => {
            // Reversed by operation, each operation's outcomes kept in their order.
            let mut latest_first: Vec<Move> = Vec::with_capacity(lost.len());
            for group in lost.chunk_by(|a, b| a.0 == b.0).rev() {
                latest_first.extend_from_slice(group);
            }
            [moves, latest_first].concat()
        }
        MoveOrder::Lost => [lost, moves].concat(),
    };
    moves.reverse();
    moves
}

/// The outcomes of each operation on each (state, moment) met: a state recurs at many
/// nodes of the search (every order of calls that change nothing).
#[derive(Default)]
pub(super) struct OutcomeCache(HashMap<OutcomeKey, Vec<(State, u64)>>);

/// An operation's index, the state's hash, the floor, and the latest moment it may take.
type OutcomeKey = (usize, u64, u64, u64);

impl OutcomeCache {
    fn outcomes(
        &mut self,
        index: usize,
        step: &Step<'_>,
        state: &State,
        floor: u64,
        (latest, tried): (u64, bool),
    ) -> Vec<(State, u64)> {
        // Bounded: a long search meets more states than are worth keeping.
        if self.0.len() > 200_000 {
            self.0.clear();
        }
        self.0
            .entry((index, state_hash(state), floor, latest))
            .or_insert_with(|| outcomes(step, state, floor, (latest, tried)))
            .clone()
    }
}

/// The states `step` may leave after `state` when it takes effect from `floor` (less
/// [`TOLERANCE`]) to `latest` (tried itself when `tried`), one per way the machine
/// explains its answer, each with the earliest moment that explains it (a later one only
/// narrows what may follow).
fn outcomes(step: &Step<'_>, state: &State, floor: u64, latest: (u64, bool)) -> Vec<(State, u64)> {
    let mut results: Vec<(State, u64)> = Vec::new();
    for now in moments(step, state.as_ref(), floor, latest) {
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
                && !results.iter().any(|(known, _)| *known == after)
                // A lost call that changed nothing need never be placed: it blocks no
                // one, and leaving it out explains as much.
                && !(step.operation.is_lost() && after == *state)
            {
                results.push((after, now));
            }
        }
    }
    results
}

/// The moments worth trying for `step` on `record`, from `floor` (less [`TOLERANCE`]) to
/// `latest` (the window's end, or earlier: see [`next_moves`]): where the machine's
/// answer can change, the window's start, the floor, `latest` (when `tried`), and the
/// moments the answers show; in order. The start or the floor and `latest` stand in for
/// the moments between that no other candidate marks.
fn moments(
    step: &Step<'_>,
    record: Option<&Record>,
    floor: u64,
    (latest, tried): (u64, bool),
) -> Vec<u64> {
    let mut moments = vec![step.from, floor];
    if tried {
        moments.push(latest);
    }
    moments.extend_from_slice(&step.derived);
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
    // Where the cut's end is not always tried (a lost call, moments in any order), it
    // stands in for the moments the cut took away: tried only where one was.
    if !tried && moments.iter().any(|&at| at > latest && at < step.to) {
        moments.push(latest);
    }
    let earliest = step.from.max(floor.saturating_sub(TOLERANCE));
    moments.retain(|at| (earliest..=latest).contains(at));
    moments.sort_unstable();
    moments.dedup();
    moments
}

/// `until - duration` in milliseconds, as the store computed `until = now + duration`.
fn before(until: Timestamp, duration: Duration) -> Option<u64> {
    let millis = u64::try_from(clamp_duration(duration).as_millis()).ok()?;
    until.as_unix_millis().checked_sub(millis)
}
