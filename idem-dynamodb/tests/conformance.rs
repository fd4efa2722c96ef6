//! DynamoDbStore passes the whole conformance suite on DynamoDB Local, each case under a
//! key prefix of its own.

mod common;

use idem_dynamodb::MAX_RESPONSE_BYTES;
use idem_testkit::Capabilities;

fn capabilities() -> Capabilities {
    // DynamoDB holds at most 400 KB per item: the store declares its own cap.
    Capabilities::default().with_max_response_bytes(MAX_RESPONSE_BYTES)
}

mod system_clock {
    idem_testkit::conformance_tests!(
        service: "IDEM_TEST_DYNAMODB_ENDPOINT",
        |endpoint: String| async move { super::common::store(&endpoint).await },
        super::capabilities(),
    );
}
