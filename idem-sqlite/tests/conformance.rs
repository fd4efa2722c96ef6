//! SqliteStore passes the whole conformance suite, in memory and on files.

mod common;

mod in_memory {
    use idem_sqlite::SqliteStore;

    idem_testkit::conformance_tests!(manual_clock: |clock, _| async move {
        SqliteStore::builder_in_memory()
            .clock(clock)
            .build()
            .expect("an in-memory database")
    });
}

mod file {
    use idem_sqlite::SqliteStore;

    idem_testkit::conformance_tests!(|_| async {
        SqliteStore::open(super::common::fresh_db_path()).expect("a database file")
    });
}

mod file_on_a_manual_clock {
    use idem_sqlite::SqliteStore;

    idem_testkit::conformance_tests!(manual_clock: |clock, _| async move {
        SqliteStore::builder(super::common::fresh_db_path())
            .clock(clock)
            .build()
            .expect("a database file")
    });
}

mod admin_in_memory {
    use idem_sqlite::SqliteStore;

    idem_testkit::admin_conformance_tests!(manual_clock: |clock, _| async move {
        SqliteStore::builder_in_memory()
            .clock(clock)
            .build()
            .expect("an in-memory database")
    });
}

mod admin_file {
    use idem_sqlite::SqliteStore;

    idem_testkit::admin_conformance_tests!(|_| async {
        SqliteStore::open(super::common::fresh_db_path()).expect("a database file")
    });
}
