//! MemoryStore passes the whole conformance suite, on the system clock and on a manual one.

use idem_core::MemoryStore;

idem_testkit::conformance_tests!(|_| async { MemoryStore::new() });

mod manual_clock {
    use idem_core::MemoryStore;

    idem_testkit::conformance_tests!(manual_clock: |clock, _| async move {
        MemoryStore::with_clock(clock)
    });
}

mod admin {
    idem_testkit::admin_conformance_tests!(|_| async { idem_core::MemoryStore::new() });
}

mod admin_on_a_manual_clock {
    idem_testkit::admin_conformance_tests!(manual_clock: |clock, _| async move {
        idem_core::MemoryStore::with_clock(clock)
    });
}
