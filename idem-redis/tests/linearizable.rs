//! Concurrent histories through two connections, on a standalone server and on a
//! three-master cluster, are explained by the state machine, on the servers' clocks.

mod common;

use std::sync::Arc;

use idem_core::Store;
use idem_testkit::linearizability::{Checker, Workload, assert_linearizable};

async fn check(stores: [Arc<dyn Store>; 2]) {
    let workload = Workload::default().operations(3_000);
    let checked = assert_linearizable(&stores, &workload, Checker::default()).await;
    println!("{checked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standalone_histories_are_linearizable() {
    let Some(url) = idem_testkit::service_url(common::STANDALONE) else {
        return;
    };
    let prefix = common::unique_prefix();
    check([
        Arc::new(common::standalone_in(&url, &prefix).await),
        Arc::new(common::standalone_in(&url, &prefix).await),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_histories_are_linearizable() {
    let Some(nodes) = idem_testkit::service_url(common::CLUSTER) else {
        return;
    };
    let prefix = common::unique_prefix();
    check([
        Arc::new(common::cluster_in(&nodes, &prefix).await),
        Arc::new(common::cluster_in(&nodes, &prefix).await),
    ])
    .await;
}
