//! The fault explorer on SqliteStore, on a virtual clock (paused Tokio time): a seeded
//! sample of single and paired faults over every scenario, in memory and on a file.
//! `IDEM_EXPLORE_SEED` and `IDEM_EXPLORE_RUNS` choose the sample; a failure prints the
//! seed and each violation's faults.

mod common;

use idem_sqlite::SqliteStore;
use idem_testkit::explore::{Target, assert_sample_passes};

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
