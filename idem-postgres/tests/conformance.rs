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
