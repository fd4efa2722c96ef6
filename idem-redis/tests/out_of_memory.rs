//! A full Redis (`maxmemory` reached under `noeviction`) refuses new claims but still
//! answers replays and reads. Redis refuses a whole function that may write when it is out
//! of memory, and `FUNCTION LOAD` too, where a script is refused only at its first write:
//! the store sends such a call as a script.
//!
//! It runs a Redis server of its own (on 127.0.0.1, a port the system chose), since filling
//! the shared test server would fail every other test's writes meanwhile.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use idem_core::{Error, Fingerprint, Idempotency, Key, Outcome, Store, WorkError};
use idem_redis::{RedisStore, redis};

/// A `redis-server` child, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn own_server() -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server on the PATH (scripts/services.sh installs it)");
    let server = Server {
        child,
        url: format!("redis://127.0.0.1:{port}"),
    };
    let client = redis::Client::open(server.url.as_str()).unwrap();
    for _ in 0..100 {
        if let Ok(mut conn) = client.get_multiplexed_async_connection().await
            && redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .is_ok()
        {
            return server;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("redis-server did not answer on {} within 5 s", server.url);
}

async fn config(url: &str, args: &[&str]) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    let _: redis::Value = cmd.query_async(&mut conn).await.unwrap();
}

fn work(
    value: i64,
) -> impl FnOnce(idem_core::Context) -> std::future::Ready<Result<i64, WorkError<()>>> {
    move |_ctx| std::future::ready(Ok(value))
}

#[tokio::test]
async fn a_full_server_refuses_new_claims_and_still_replays() {
    // Needs the test services' machine (redis-server installed); skipped like the others.
    if idem_testkit::service_url(common::STANDALONE).is_none() {
        return;
    }
    let server = own_server().await;
    let store = RedisStore::standalone(&server.url).await.unwrap();
    let idem = Idempotency::new(store.clone());
    let done = Key::new("oom", "done").unwrap();
    let first = idem
        .execute(&done, Fingerprint::of_bytes("x"), work(7))
        .await
        .unwrap();
    assert!(!first.replayed());

    config(&server.url, &["CONFIG", "SET", "maxmemory", "1"]).await;
    let replay = idem
        .execute(&done, Fingerprint::of_bytes("x"), work(-1))
        .await
        .expect("a replay on a full server");
    assert_eq!(
        replay,
        Outcome::Completed {
            value: 7,
            replayed: true
        }
    );
    assert!(store.get(&done).await.expect("a read").is_some());
    let fresh = Key::new("oom", "fresh").unwrap();
    match idem
        .execute(&fresh, Fingerprint::of_bytes("x"), work(1))
        .await
    {
        Err(Error::Store(err)) => assert!(err.is_retryable(), "{err:?}"),
        other => panic!("a new claim on a full server ran: {other:?}"),
    }

    // A full server that lost the library (a restart without persistence) refuses to load
    // it again; the replay is answered all the same.
    config(&server.url, &["FUNCTION", "FLUSH"]).await;
    let again = idem
        .execute(&done, Fingerprint::of_bytes("x"), work(-1))
        .await
        .expect("a replay on a full server without the library");
    assert!(again.replayed());

    config(&server.url, &["CONFIG", "SET", "maxmemory", "0"]).await;
    let later = idem
        .execute(&fresh, Fingerprint::of_bytes("x"), work(1))
        .await
        .expect("a claim once memory is free");
    assert!(!later.replayed());
}
