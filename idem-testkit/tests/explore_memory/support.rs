//! What the tests share: the memory store as a target (one clock, or one per process),
//! faults placed by hand, and the checks of a report.

use std::convert::Infallible;

use idem_core::MemoryStore;
use idem_core::store::Operation;
use idem_testkit::explore::{
    DEFAULT_SEED, Explorer, Fault, FaultPoint, Mode, PlacedFault, Process, Report, Scenario, Site,
    Target, Timing,
};

pub(crate) fn memory() -> Target {
    Target::virtual_time("memory", |clock| async move {
        Ok::<_, Infallible>(MemoryStore::with_clock(clock))
    })
}

/// The memory store shared by processes whose clocks differ: a handle per process.
pub(crate) fn memory_per_process() -> Target {
    Target::per_process_clocks(
        "memory, a clock per process",
        |clock| async move { Ok::<_, Infallible>(MemoryStore::with_clock(clock)) },
        |store: MemoryStore, clock| async move { Ok::<_, Infallible>(store.sharing_with_clock(clock)) },
    )
}

pub(crate) fn at_point(process: Process, name: &str, fault: Fault) -> PlacedFault {
    PlacedFault {
        point: FaultPoint {
            process,
            site: Site::Point {
                name: name.into(),
                occurrence: 0,
            },
        },
        fault,
    }
}

pub(crate) fn at_call(
    process: Process,
    index: u32,
    operation: Operation,
    fault: Fault,
) -> PlacedFault {
    PlacedFault {
        point: FaultPoint {
            process,
            site: Site::Call { index, operation },
        },
        fault,
    }
}

/// The report has violations of `kind`, and prints them.
pub(crate) fn assert_found(report: &Report, kind: &str) {
    println!("{report}");
    assert!(
        report.by_kind().contains_key(kind),
        "expected violations of kind `{kind}`:\n{report}"
    );
}

/// Every single fault and 50 pairs per scenario of `scenarios` on `target` under `timing`:
/// no violation.
pub(crate) fn assert_passes(target: Target, timing: Timing, scenarios: Vec<Scenario>) -> Report {
    let report = Explorer::new(target)
        .timing(timing)
        .scenarios(scenarios)
        .mode(Mode::exhaustive_with_pairs(DEFAULT_SEED, 50))
        .run()
        .expect("the exploration runs");
    println!("{report}");
    assert!(report.passed(), "{report}");
    report
}
