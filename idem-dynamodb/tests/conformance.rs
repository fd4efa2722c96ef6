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
