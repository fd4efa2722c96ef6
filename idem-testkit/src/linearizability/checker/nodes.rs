//! The search's nodes: the placed set (a bit per operation), the lost calls retired from
//! it, the moment that still matters, and the nodes already reached (with subsumption
//! over lost calls).

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use super::{State, Step, TOLERANCE};

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
pub(super) struct Visited {
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
    pub(super) fn new(lost: &[usize], words: usize, subsume: bool) -> Self {
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
    pub(super) fn insert(&mut self, placed: &[u64], state: u64, floor: u64) -> bool {
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
pub(super) fn retire_lost(
    steps: &[Step<'_>],
    lost: &[usize],
    placed: &mut [u64],
    latest_invoked_ns: u64,
) {
    for &i in lost {
        if steps[i].last_ns < latest_invoked_ns {
            place(placed, i);
        }
    }
}

/// The moment the search is at, as far as it still matters: 0 when every unplaced
/// operation may take effect at or after it anyway, so that orders which differ only in
/// moments nothing left can see meet in one node.
pub(super) fn floor_of(steps: &[Step<'_>], placed: &[u64], floor: u64) -> u64 {
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

pub(super) fn place(placed: &mut [u64], index: usize) {
    placed[index / 64] |= 1 << (index % 64);
}

pub(super) fn is_placed(placed: &[u64], index: usize) -> bool {
    placed[index / 64] & (1 << (index % 64)) != 0
}

pub(super) fn all_answered_placed(steps: &[Step<'_>], placed: &[u64]) -> bool {
    steps
        .iter()
        .enumerate()
        .all(|(i, step)| step.operation.is_lost() || is_placed(placed, i))
}

fn placed_hash(placed: &[u64]) -> u64 {
    let mut hasher = DefaultHasher::new();
    placed.hash(&mut hasher);
    hasher.finish()
}

pub(super) fn state_hash(state: &State) -> u64 {
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
