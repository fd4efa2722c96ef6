//! PostgresStore passes the whole conformance suite on a real server, each case on a table
//! of its own.

mod common;

idem_testkit::conformance_tests!(service: "IDEM_TEST_POSTGRES_URL", |url: String| async move {
    common::fresh_store(&url, 16).await
});
