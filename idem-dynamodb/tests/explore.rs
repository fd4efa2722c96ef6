//! The fault explorer on DynamoDbStore (DynamoDB Local), in real time with short leases:
//! a seeded sample of single and paired faults over every scenario. `IDEM_EXPLORE_SEED`
//! and `IDEM_EXPLORE_RUNS` choose the sample; a failure prints the seed and each
//! violation's faults.

mod common;

use std::convert::Infallible;

use idem_testkit::explore::{Target, assert_sample_passes};

#[test]
fn sampled_faults_break_nothing() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let target = Target::real_time("dynamodb", move || {
        let endpoint = endpoint.clone();
        async move { Ok::<_, Infallible>(common::store(&endpoint).await) }
    });
    assert_sample_passes(target, 48);
}
