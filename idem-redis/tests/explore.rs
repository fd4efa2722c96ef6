//! The fault explorer on RedisStore (standalone), in real time on the server's clock with
//! short leases: a seeded sample of single and paired faults over every scenario.
//! `IDEM_EXPLORE_SEED` and `IDEM_EXPLORE_RUNS` choose the sample; a failure prints the
//! seed and each violation's faults.

mod common;

use std::convert::Infallible;

use idem_testkit::explore::{Target, assert_sample_passes};

#[test]
fn sampled_faults_break_nothing() {
    let Some(url) = idem_testkit::service_url(common::STANDALONE) else {
        return;
    };
    let target = Target::real_time("redis", move || {
        let url = url.clone();
        async move { Ok::<_, Infallible>(common::standalone(&url).await) }
    });
    assert_sample_passes(target, 48);
}
