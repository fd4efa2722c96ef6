//! The fault explorer on SqliteStore, on a virtual clock (paused Tokio time): a seeded
//! sample of single and paired faults over every scenario, in memory, on a file, and on a
//! file shared by processes whose clocks differ.
//! `IDEM_EXPLORE_SEED` and `IDEM_EXPLORE_RUNS` choose the sample; a failure prints the
//! seed and each violation's faults.

mod common;

use std::path::PathBuf;

use idem_core::StoreError;
use idem_sqlite::SqliteStore;
use idem_testkit::explore::{Explorer, Mode, Scenario, Target, Timing, assert_sample_passes};

#[test]
fn sampled_faults_in_memory_break_nothing() {
    assert_sample_passes(
        Target::virtual_time("sqlite in memory", |clock| async move {
            SqliteStore::builder_in_memory().clock(clock).build()
        }),
        400,
    );
}

#[test]
fn sampled_faults_on_a_file_break_nothing() {
    assert_sample_passes(
        Target::virtual_time("sqlite file", |clock| async move {
            SqliteStore::builder(common::fresh_db_path())
                .clock(clock)
                .build()
        }),
        100,
    );
}

/// A file shared by processes, each through its own connection and its own clock.
fn file_per_process() -> Target {
    Target::per_process_clocks(
        "sqlite file, a clock per process",
        |_clock| async move { Ok::<_, StoreError>(common::fresh_db_path()) },
        |path: PathBuf, clock| async move { SqliteStore::builder(path).clock(clock).build() },
    )
}

#[test]
fn clocks_apart_past_the_margin_are_reported() {
    // Two leases apart: the waiting duplicate's connection reads a clock that sees the
    // first caller's live lease as over. That the explorer reports it shows each
    // connection's clock reaches SQLite's rules.
    let mut timing = Timing::virtual_time();
    timing.skew = timing.lease;
    let report = Explorer::new(file_per_process())
        .timing(timing)
        .scenarios([Scenario::WaitDuplicate])
        .run()
        .expect("the exploration runs");
    println!("{report}");
    assert!(report.by_kind().contains_key("effect repeated"), "{report}");
}

#[test]
fn sampled_faults_with_a_clock_per_process_break_nothing() {
    // The first caller's clock 10 ms behind, every other's 10 ms ahead, within the
    // driver's margin (a fiftieth of the 2 s lease). SQLite trusts its caller's clock.
    let mut timing = Timing::virtual_time();
    timing.skew = timing.lease / 200;
    let target = file_per_process();
    let mode = Mode::from_env(100).expect("IDEM_EXPLORE_SEED and IDEM_EXPLORE_RUNS are numbers");
    let report = Explorer::new(target)
        .timing(timing)
        .mode(mode)
        .run()
        .expect("the exploration runs");
    println!("{mode:?}\n{report}");
    assert!(report.passed(), "{mode:?}\n{report}");
}
