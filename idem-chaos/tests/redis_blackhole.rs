//! A standalone Redis connection that silently stops answering is replaced: found by the
//! chaos runs, where one blackholed connection stalled every request until the proxy gave
//! up on it ten seconds later.

use std::time::{Duration, Instant};

use idem_chaos::backends::address;
use idem_chaos::proxy::{Fault, FaultProxy};
use idem_core::{Fingerprint, Key, Store, store::ClaimRequest};
use idem_redis::RedisStore;
use redis::aio::ConnectionManagerConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_connection_is_replaced_not_waited_out() {
    let Some(url) = idem_testkit::service_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let proxy = FaultProxy::start(address(&url).unwrap(), 1).await.unwrap();
    let through = url.replace(
        &address(&url).unwrap().to_string(),
        &proxy.addr().to_string(),
    );
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_millis(300)))
        .set_connection_timeout(Some(Duration::from_millis(500)));
    let store = RedisStore::standalone_with_config(&through, config)
        .await
        .unwrap()
        .with_prefix(&format!("blackhole:{}:", std::process::id()))
        .unwrap();
    let claim = |n: usize| {
        ClaimRequest::new(
            Key::new("chaos", format!("k{n}")).unwrap(),
            Fingerprint::of_bytes("r"),
            Duration::from_secs(60),
            Duration::from_secs(60),
        )
    };
    store.claim(&claim(0)).await.expect("healthy at first");
    proxy.inject(Fault::Blackhole);
    let hung = store.claim(&claim(1)).await;
    assert!(hung.is_err(), "the blackholed request times out: {hung:?}");
    // The blackholed socket stays open for ten seconds; a fresh connection answers long
    // before that.
    let started = Instant::now();
    let mut n = 2;
    loop {
        if store.claim(&claim(n)).await.is_ok() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "still no answer after {:?}: the dead connection was kept",
            started.elapsed()
        );
        n += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
