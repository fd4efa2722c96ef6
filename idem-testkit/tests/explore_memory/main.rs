//! The explorer on the memory store: every scenario, every single fault at every fault
//! point its fault-free run reaches, and a bounded sample of pairs (the only runs that
//! fault a takeover), with no violation. And the explorer can fail: stores broken on
//! purpose are reported, each by the check its flaw breaks.
//!
//! This file runs the whole exploration and pins its counts; `support` holds the targets
//! and plans the tests share, `flawed` the memory store broken on purpose, `flaws` what
//! the explorer reports of it, `plans` single runs with chosen faults, and `timing` other
//! clocks, retentions and heartbeats.

mod flawed;
mod flaws;
mod plans;
mod support;
mod timing;

use idem_testkit::explore::{DEFAULT_SEED, Explorer, Mode};

use support::memory;

/// Pairs sampled per scenario: enough to meet the two-fault paths (a fault in the
/// takeover after a crash) while the whole test stays within seconds.
const PAIRS: usize = 300;

#[test]
fn every_single_fault_and_sampled_pairs_on_memory() {
    let report = Explorer::new(memory())
        .mode(Mode::exhaustive_with_pairs(DEFAULT_SEED, PAIRS))
        .run()
        .expect("the exploration runs");
    println!("{report}");
    assert!(report.passed(), "{report}");
    assert!(
        report.runs() > report.fault_points() * 3,
        "{}",
        report.summary()
    );
}

/// Per scenario of the exhaustive singles on memory: the runs, and how many of them
/// repeated an effect as the contract allows. Runs replay exactly, so these are exact: a
/// change that widens at-least-once (a driver that stores a checkpoint later than it did,
/// an excuse grown too wide) changes a count, and must say why here.
const SINGLES: [(&str, usize, usize); 19] = [
    ("plain", 33, 8),
    ("steps", 91, 28),
    ("saga-fails-at-step-1", 23, 0),
    ("saga-fails-at-step-2", 87, 6),
    ("saga-fails-at-step-3", 140, 13),
    ("saga-fails-after-steps", 198, 20),
    ("saga-rerun-stops-early", 140, 13),
    ("saga-undo-fails", 161, 20),
    ("prepare-completion", 76, 6),
    ("long-work", 195, 15),
    ("wait-duplicate", 148, 15),
    ("encrypted", 91, 28),
    ("encrypted-saga", 198, 20),
    ("retryable-then-done", 92, 15),
    ("saga-undo-unknown", 187, 20),
    ("saga-undo-retryable", 267, 20),
    ("saga-step-too-large", 92, 13),
    ("saga-step-unserializable", 92, 13),
    ("bytes-saga", 198, 20),
];

#[test]
fn the_singles_repeat_exactly_as_often_as_pinned() {
    let report = Explorer::new(memory())
        .mode(Mode::exhaustive())
        .run()
        .expect("the exploration runs");
    assert!(report.passed(), "{report}");
    let found: Vec<(&str, usize, usize)> = report
        .scenarios
        .iter()
        .map(|s| (s.scenario.as_str(), s.runs, s.at_least_once))
        .collect();
    assert_eq!(found, SINGLES, "{}", report.summary());
}
