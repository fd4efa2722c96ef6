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

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use idem_core::{
    Record, Timestamp, machine, raw::clamp_duration, record::Lease, store::ClaimOutcome,
    store::RenewOutcome,
};

use super::history::{Answer, Call, Operation};

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

/// The nodes already reached, with subsumption over lost calls where the moments may come
/// in any order: a node whose answered calls and state match one reached before, and
/// whose placed lost calls include that one's, can reach nothing the earlier one cannot
/// (a lost call blocks no one and need never be placed, so the earlier node may leave
/// the extra ones out and make the same moves). Orders in which a lost call took effect
/// and was then overwritten meet the orders in which it never took effect.
///
/// Where the moments follow the order, the earlier node's unplaced lost calls can keep
/// its descendants' moment from resetting ([`floor_of`]) where the later node's reset,
/// and the moment itself is a moment the next call tries: the earlier node may then miss
/// a millisecond the later one tries, so there only nodes met exactly are skipped.
struct Visited {
    /// Whether a node may be skipped as subsumed, not only when met again exactly.
    subsume: bool,
    /// Per word of the placed set, the bits of lost calls.
    lost_mask: Vec<u64>,
    /// The lost calls' indices, to pack a node's placed lost calls densely.
    lost: Vec<usize>,
    /// (answered calls placed, state, moment) → the placed lost calls of each node
    /// reached with them, none a subset of another.
    seen: HashMap<(u64, u64, u64), Vec<Vec<u64>>>,
    /// Every node reached, as hashes of (placed set, state, moment): 24 bytes a node, so
    /// that a node is never explored twice even where `seen` keeps no more.
    exact: HashSet<(u64, u64, u64)>,
}

/// The most sets of placed lost calls kept per (answered calls, state, moment): past it a
/// node is only compared with the ones kept (and with itself): the search may then
/// explore a subsumed node, never skip one it should not.
const SUBSUMPTION_WIDTH: usize = 64;

impl Visited {
    fn new(lost: &[usize], words: usize, subsume: bool) -> Self {
        let mut lost_mask = vec![0; words];
        for &i in lost {
            place(&mut lost_mask, i);
        }
        Self {
            subsume,
            lost_mask,
            lost: lost.to_vec(),
            seen: HashMap::new(),
            exact: HashSet::new(),
        }
    }

    /// Records a node; false when it was reached before or is subsumed by a node that was.
    fn insert(&mut self, placed: &[u64], state: u64, floor: u64) -> bool {
        if !self.exact.insert((placed_hash(placed), state, floor)) {
            return false;
        }
        if !self.subsume {
            return true;
        }
        let answered: Vec<u64> = placed
            .iter()
            .zip(&self.lost_mask)
            .map(|(p, l)| p & !l)
            .collect();
        let mut lost = vec![0; self.lost.len().div_ceil(64)];
        for (n, &i) in self.lost.iter().enumerate() {
            if is_placed(placed, i) {
                place(&mut lost, n);
            }
        }
        let kept = self
            .seen
            .entry((placed_hash(&answered), state, floor))
            .or_default();
        let subset =
            |small: &[u64], large: &[u64]| small.iter().zip(large).all(|(s, l)| s & !l == 0);
        if kept.iter().any(|earlier| subset(earlier, &lost)) {
            return false;
        }
        kept.retain(|earlier| !subset(&lost, earlier));
        if kept.len() < SUBSUMPTION_WIDTH {
            kept.push(lost);
        }
        true
    }
}

/// Marks as placed every lost call that can no longer take effect: a call invoked after
/// its window (at `latest_invoked_ns`) is placed. Whether such a call took effect never
/// or was left out at one point or another is one and the same, so orders that differ
/// only in that meet in one node; and a lost call is never a move of its own to leave
/// out.
fn retire_lost(steps: &[Step<'_>], lost: &[usize], placed: &mut [u64], latest_invoked_ns: u64) {
    for &i in lost {
        if steps[i].last_ns < latest_invoked_ns {
            place(placed, i);
        }
    }
}

/// The moment the search is at, as far as it still matters: 0 when every unplaced
/// operation may take effect at or after it anyway, so that orders which differ only in
/// moments nothing left can see meet in one node.
fn floor_of(steps: &[Step<'_>], placed: &[u64], floor: u64) -> u64 {
    let earliest = steps
        .iter()
        .enumerate()
        .filter(|(i, _)| !is_placed(placed, *i))
        .map(|(_, step)| step.from)
        .min();
    match earliest {
        Some(from) if floor.saturating_sub(TOLERANCE) > from => floor,
        _ => 0,
    }
}

fn place(placed: &mut [u64], index: usize) {
    placed[index / 64] |= 1 << (index % 64);
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
fn next_moves(
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
struct OutcomeCache(HashMap<OutcomeKey, Vec<(State, u64)>>);

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
        (Call::Claim(request), Answer::Claim(actual)) => {
            let transition = machine::claim(existing, request, now);
            if !same_claim(actual, &transition.outcome) {
                return None;
            }
            let mut write = transition.write;
            if let (
                Some(record),
                ClaimOutcome::Claimed { lease, .. },
                ClaimOutcome::Claimed { resumed, .. },
            ) = (&mut write, actual, &transition.outcome)
            {
                // The store's times, which may be a millisecond off the machine's at the
                // moment tried (see `same_lease`).
                record.lease_until = lease.lease_until;
                if *resumed {
                    let before = existing.map_or(record.expires_at, |r| r.expires_at);
                    record.expires_at =
                        machine::kept_past(before, lease.lease_until, request.retention);
                } else {
                    record.created_at = lease.created_at;
                    record.expires_at = lease
                        .created_at
                        .saturating_add(clamp_duration(request.retention));
                }
            }
            Some(write.or_else(unchanged))
        }
        (Call::Renew(lease, extend), Answer::Renew(actual)) => {
            let transition = machine::renew(existing, lease, *extend, now);
            let same = match (actual, &transition.outcome) {
                (RenewOutcome::Renewed(a), RenewOutcome::Renewed(m)) => same_lease(a, m),
                (a, m) => a == m,
            };
            if !same {
                return None;
            }
            let mut write = transition.write;
            if let (Some(record), RenewOutcome::Renewed(renewed), Some(before)) =
                (&mut write, actual, existing)
            {
                record.lease_until = renewed.lease_until;
                record.expires_at =
                    machine::kept_past(before.expires_at, renewed.lease_until, lease.retention);
            }
            Some(write.or_else(unchanged))
        }
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
            ClaimOutcome::Claimed {
                lease: a,
                resumed: a_resumed,
                steps: a_steps,
                ..
            },
            ClaimOutcome::Claimed {
                lease: m,
                resumed: m_resumed,
                steps: m_steps,
                ..
            },
        ) => same_lease(a, m) && a_resumed == m_resumed && a_steps == m_steps,
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

/// A lease the store answered against the machine's: the same but for its times, which
/// may be a millisecond apart. A store that keeps finer times (PostgreSQL keeps
/// microseconds) finds a lease live at `lease_until.123` that the machine, on whole
/// milliseconds, finds ended at `lease_until`: its answer then matches the machine's a
/// millisecond earlier, with times a millisecond later.
fn same_lease(actual: &Lease, model: &Lease) -> bool {
    actual.key == model.key
        && actual.token == model.token
        && actual.attempt == model.attempt
        && actual.retention == model.retention
        && near(actual.lease_until, model.lease_until)
        && near(actual.created_at, model.created_at)
}

/// Two times a millisecond apart at most: a store that keeps finer times than the
/// machine's whole milliseconds rounds the other way.
fn near(a: Timestamp, m: Timestamp) -> bool {
    a.as_unix_millis().abs_diff(m.as_unix_millis()) <= 1
}

/// A record `get` returned against the machine's: the same, with the lease's end and the
/// expiry within a millisecond ([`near`]).
fn same_get(actual: Option<&Record>, model: Option<&Record>) -> bool {
    match (actual, model) {
        (None, None) => true,
        (Some(a), Some(m)) => {
            // The lease's end and the expiry too, within the millisecond a lease may be
            // off by (see `same_lease`): a read pins the moment of the write that set
            // them, at once, where a later answer at the expiry's edge would show a
            // wrong moment only after every order of the calls between.
            a.key == m.key
                && a.fingerprint == m.fingerprint
                && a.state == m.state
                && a.token == m.token
                && a.attempt == m.attempt
                && a.created_at == m.created_at
                && near(a.lease_until, m.lease_until)
                && near(a.expires_at, m.expires_at)
                && a.response == m.response
                && a.steps == m.steps
        }
        _ => false,
    }
}

fn placed_hash(placed: &[u64]) -> u64 {
    let mut hasher = DefaultHasher::new();
    placed.hash(&mut hasher);
    hasher.finish()
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

#[cfg(test)]
mod tests;
