//! Concurrent histories through two clients are explained by the state machine. The
//! stores read the test process's clock, with no skew margin: a takeover waits for the
//! lease's end and no longer, as the machine says. The conditions compare with a `now`
//! the client read before sending, so the moments the checker tries need not follow the
//! order it places the calls in (`Checker::moments_in_any_order`).

mod common;

use std::sync::Arc;

use idem_core::Store;
use idem_testkit::linearizability::{Checker, Workload, assert_linearizable};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn histories_are_linearizable() {
    let Some(endpoint) = idem_testkit::service_url(common::ENDPOINT) else {
        return;
    };
    let prefix = common::unique_prefix();
    let stores: [Arc<dyn Store>; 2] = [
        Arc::new(common::store_in(&endpoint, &prefix).await),
        Arc::new(common::store_in(&endpoint, &prefix).await),
    ];
    let workload = Workload::default().operations(3_000);
    let checker = Checker::default().moments_in_any_order();
    let checked = assert_linearizable(&stores, &workload, checker).await;
    println!("{checked:?}");
}
