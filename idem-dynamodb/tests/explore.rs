//! The fault explorer on DynamoDbStore (DynamoDB Local), in real time with short leases
//! and the skew margin on: a seeded sample of single and paired faults over every
//! scenario. `IDEM_EXPLORE_SEED`
//! and `IDEM_EXPLORE_RUNS` choose the sample; a failure prints the seed and each
//! violation's faults.

mod common;

use std::convert::Infallible;
use std::time::Duration;

use idem_testkit::explore::{Target, assert_sample_passes};

#[test]
fn sampled_faults_break_nothing() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    // With the skew margin on, as in production, scaled to the 300 ms leases: a takeover
    // waits 50 ms past a lease's end (the racer comes 75 ms past it).
    let target = Target::real_time("dynamodb", move || {
        let endpoint = endpoint.clone();
        async move {
            Ok::<_, Infallible>(
                common::store_with_margin(&endpoint, Duration::from_millis(50)).await,
            )
        }
    });
    assert_sample_passes(target, 48);
}
