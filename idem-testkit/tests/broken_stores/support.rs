//! The suites over flawed stores, and the check that a report names exactly the cases a
//! flaw breaks.

use std::sync::Arc;

use idem_core::SystemClock;
use idem_testkit::{AdminSuite, CaseName, Report, Suite};

use crate::common::{Flaw, LIMIT, Setup, factory};

/// An admin suite over stores with `flaw`, all on one shared backend.
pub(crate) fn admin_suite(flaw: Option<Flaw>) -> AdminSuite {
    let make = factory(flaw, Setup::default());
    AdminSuite::new(move |namespace| make(Arc::new(SystemClock), namespace))
}

/// A suite over stores with `flaw`, all on one shared backend.
pub(crate) fn suite(flaw: Option<Flaw>) -> Suite {
    suite_with(flaw, Setup::default())
}

/// A suite over stores with `flaw` made as `setup` says, all on one shared backend.
pub(crate) fn suite_with(flaw: Option<Flaw>, setup: Setup) -> Suite {
    let make = factory(flaw, setup);
    if setup.manual_clock {
        Suite::with_manual_clock(move |clock, namespace| make(Arc::new(clock), namespace))
    } else {
        Suite::new(move |namespace| make(Arc::new(SystemClock), namespace))
    }
}

/// Stores that declare (and, unflawed, enforce) a record limit.
pub(crate) const LIMITED: Setup = Setup {
    limit: Some(LIMIT),
    manual_clock: false,
};
/// Stores on the suite's manual clock.
pub(crate) const MANUAL: Setup = Setup {
    limit: None,
    manual_clock: true,
};

/// The report must name every case in `required` and nothing outside `required` and
/// `also_allowed`.
pub(crate) fn assert_reported<C: CaseName>(report: &Report<C>, required: &[C], also_allowed: &[C]) {
    let failed = report.failed();
    for case in required {
        assert!(
            failed.contains(case),
            "the suite missed the flaw: {} passed\n{report}",
            case.name()
        );
    }
    for case in &failed {
        assert!(
            required.contains(case) || also_allowed.contains(case),
            "{} failed, but it is named for another behaviour than the flaw\n{report}",
            case.name()
        );
    }
}
