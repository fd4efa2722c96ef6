//! DynamoDbStore passes the whole conformance suite on DynamoDB Local, each case under the
//! suite's namespace as its key prefix, in one table.

mod common;

use idem_testkit::Namespace;

idem_testkit::conformance_tests!(
    service: "IDEM_TEST_DYNAMODB_ENDPOINT",
    |endpoint: String, namespace: Namespace| async move {
        common::store_in(&endpoint, namespace.as_str()).await
    },
);

mod admin {
    use idem_testkit::Namespace;

    idem_testkit::admin_conformance_tests!(
        service: "IDEM_TEST_DYNAMODB_ENDPOINT",
        |endpoint: String, namespace: Namespace| async move {
            super::common::store_in(&endpoint, namespace.as_str()).await
        },
    );
}

/// The same suite with claims that read first: every answer must be the same.
mod claim_reads_first {
    use idem_testkit::Namespace;

    idem_testkit::conformance_tests!(
        service: "IDEM_TEST_DYNAMODB_ENDPOINT",
        |endpoint: String, namespace: Namespace| async move {
            let store = super::common::store_in(&endpoint, namespace.as_str()).await;
            idem_dynamodb::DynamoDbStore::builder(store.client().clone(), &super::common::table())
                .expect("a valid table name")
                .prefix(namespace.as_str())
                .expect("a valid prefix")
                .skew_margin(std::time::Duration::ZERO)
                .claim_reads_first(true)
                .build()
        },
    );
}
