//! 64 tasks race each fresh key, on standalone Redis and on the cluster: one execution per
//! key. And a flush of the script cache and the function libraries in the middle of a run
//! breaks nothing.

mod common;

use std::sync::Arc;

use idem_core::{Fingerprint, Idempotency, Key, Outcome, WorkError};
use idem_redis::RedisStore;
use idem_redis::redis;

const TASKS: usize = 64;
const KEYS: usize = 100;

async fn race(store: RedisStore) {
    idem_testkit::execute_races(
        Arc::new(Idempotency::new(store)),
        KEYS,
        TASKS,
        |_key| async { Ok(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_per_key_execute_once_on_standalone() {
    let Some(url) = idem_testkit::service_url(common::STANDALONE) else {
        return;
    };
    race(common::standalone(&url).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_per_key_execute_once_on_the_cluster() {
    let Some(nodes) = idem_testkit::service_url(common::CLUSTER) else {
        return;
    };
    race(common::cluster(&nodes).await).await;
}

/// `SCRIPT FLUSH` and `FUNCTION FLUSH` on every given server: what a restart without
/// persistence, or a failover to a node that never had them, leaves.
async fn flush_scripts(urls: &[String]) {
    for url in urls {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

async fn survive_script_flushes(store: RedisStore, servers: Vec<String>) {
    let idem = Idempotency::new(store);
    for n in 0..60 {
        if n % 20 == 10 {
            flush_scripts(&servers).await;
        }
        let key = Key::new("flush", format!("key-{n}")).unwrap();
        let first = idem
            .execute(&key, Fingerprint::of_bytes("x"), |_ctx| async move {
                Ok::<_, WorkError<()>>(n)
            })
            .await
            .expect("a flushed library is loaded again transparently");
        assert!(!first.replayed());
        if n % 20 == 10 {
            flush_scripts(&servers).await;
        }
        let again = idem
            .execute(&key, Fingerprint::of_bytes("x"), |_ctx| async move {
                Ok::<_, WorkError<()>>(-1)
            })
            .await
            .unwrap();
        assert_eq!(
            again,
            Outcome::Completed {
                value: n,
                replayed: true
            }
        );
    }
}

#[tokio::test]
async fn a_flush_of_scripts_and_functions_mid_run_breaks_nothing_on_standalone() {
    let Some(url) = idem_testkit::service_url(common::STANDALONE) else {
        return;
    };
    survive_script_flushes(common::standalone(&url).await, vec![url]).await;
}

#[tokio::test]
async fn a_flush_of_scripts_and_functions_mid_run_breaks_nothing_on_the_cluster() {
    let Some(nodes) = idem_testkit::service_url(common::CLUSTER) else {
        return;
    };
    survive_script_flushes(common::cluster(&nodes).await, common::nodes(&nodes)).await;
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error() {
    // Port 1 on loopback: nothing listens.
    let err = RedisStore::standalone("redis://127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
}
