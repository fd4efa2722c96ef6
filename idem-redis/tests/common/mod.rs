//! Stores on the test servers, each under a key prefix no other test uses.

#![allow(dead_code)] // each test binary uses what it needs

use std::sync::atomic::{AtomicUsize, Ordering};

use idem_redis::RedisStore;

pub(crate) const STANDALONE: &str = "IDEM_TEST_REDIS_URL";
pub(crate) const CLUSTER: &str = "IDEM_TEST_REDIS_CLUSTER_NODES";

pub(crate) fn unique_prefix() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "idem-test:{}:{}:",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

pub(crate) fn nodes(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A store on the standalone server under `prefix`.
pub(crate) async fn standalone_in(url: &str, prefix: &str) -> RedisStore {
    RedisStore::standalone(url)
        .await
        .expect("connect to the test Redis")
        .with_prefix(prefix)
        .expect("a valid prefix")
}

/// A store on the cluster under `prefix`.
pub(crate) async fn cluster_in(list: &str, prefix: &str) -> RedisStore {
    RedisStore::cluster(nodes(list))
        .await
        .expect("connect to the test Redis Cluster")
        .with_prefix(prefix)
        .expect("a valid prefix")
}

pub(crate) async fn standalone(url: &str) -> RedisStore {
    standalone_in(url, &unique_prefix()).await
}

pub(crate) async fn cluster(list: &str) -> RedisStore {
    cluster_in(list, &unique_prefix()).await
}
