//! PostgresStore passes the whole conformance suite on a real server, each case on a table
//! named after the suite's namespace.

mod common;

use idem_testkit::Namespace;

idem_testkit::conformance_tests!(
    service: "IDEM_TEST_POSTGRES_URL",
    |url: String, namespace: Namespace| async move {
        common::store_in(&url, namespace.as_str(), 16).await
    }
);

mod admin {
    use idem_testkit::Namespace;

    idem_testkit::admin_conformance_tests!(
        service: "IDEM_TEST_POSTGRES_URL",
        |url: String, namespace: Namespace| async move {
            super::common::store_in(&url, namespace.as_str(), 16).await
        }
    );
}

/// The same suite on a table carrying the CHECK constraints of tables an older idem made:
/// idem's statements never write a value those refuse.
mod with_older_checks {
    use idem_testkit::Namespace;

    idem_testkit::conformance_tests!(
        service: "IDEM_TEST_POSTGRES_URL",
        |url: String, namespace: Namespace| async move {
            let store = super::common::store_in(&url, namespace.as_str(), 16).await;
            super::common::add_older_checks(&store, namespace.as_str()).await;
            store
        }
    );

    mod admin {
        use idem_testkit::Namespace;

        idem_testkit::admin_conformance_tests!(
            service: "IDEM_TEST_POSTGRES_URL",
            |url: String, namespace: Namespace| async move {
                let store = super::super::common::store_in(&url, namespace.as_str(), 16).await;
                super::super::common::add_older_checks(&store, namespace.as_str()).await;
                store
            }
        );
    }
}
