//! Stores on the test servers, each under a key prefix no other test uses.

#![allow(dead_code)] // each test binary uses what it needs

use idem_redis::RedisStore;

pub(crate) const STANDALONE: &str = "IDEM_TEST_REDIS_URL";
pub(crate) const CLUSTER: &str = "IDEM_TEST_REDIS_CLUSTER_NODES";

/// A prefix no other test uses, in this process or any other: the testkit's namespace
/// carries a tag drawn per process, since a busy run reuses process ids while the records
/// an earlier process left on the shared server still live.
pub(crate) fn unique_prefix() -> String {
    format!("idem-test:{}:", idem_testkit::Namespace::fresh())
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

/// A store on the standalone server under a prefix of its own, with that prefix and a
/// plain connection to the server, to plant hashes or read them as Redis holds them.
pub(crate) async fn standalone_and_connection(
    url: &str,
) -> (
    RedisStore,
    String,
    idem_redis::redis::aio::MultiplexedConnection,
) {
    let prefix = unique_prefix();
    let store = standalone_in(url, &prefix).await;
    let conn = idem_redis::redis::Client::open(url)
        .expect("a valid URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the test Redis");
    (store, prefix, conn)
}

pub(crate) async fn standalone(url: &str) -> RedisStore {
    standalone_in(url, &unique_prefix()).await
}

pub(crate) async fn cluster(list: &str) -> RedisStore {
    cluster_in(list, &unique_prefix()).await
}

/// Creates an ACL user on the standalone server allowed the keys `keys` (an ACL key
/// pattern such as `~*`) and every command but `denied`, and returns the URL to connect
/// as it; the user is deleted by [`drop_user`].
pub(crate) async fn user_without(url: &str, name: &str, keys: &str, denied: &[&str]) -> String {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut setuser = redis::cmd("ACL");
    setuser
        .arg("SETUSER")
        .arg(name)
        .arg("reset")
        .arg("on")
        .arg(">idem-test-password")
        .arg(keys)
        .arg("&*")
        .arg("+@all");
    for command in denied {
        setuser.arg(format!("-{command}"));
    }
    let () = setuser.query_async(&mut conn).await.unwrap();
    let mut as_user = url::Url::parse(url).unwrap();
    as_user.set_username(name).unwrap();
    as_user.set_password(Some("idem-test-password")).unwrap();
    as_user.to_string()
}

/// Deletes a user [`user_without`] made.
pub(crate) async fn drop_user(url: &str, name: &str) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: i64 = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(name)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// Completes one execution on each of `keys`, so each has a finished record.
pub(crate) async fn completed(store: &RedisStore, keys: &[idem_core::Key]) {
    let idem = idem_core::Idempotency::builder(store.clone())
        .build()
        .unwrap();
    for key in keys {
        idem.execute(key, idem_core::Fingerprint::of_bytes("x"), |_ctx| async {
            Ok::<_, idem_core::WorkError<()>>(1_u32)
        })
        .await
        .unwrap();
    }
}

/// The warnings logged on this thread while it lives, as text.
pub(crate) struct Warnings {
    written: Captured,
    _guard: tracing::subscriber::DefaultGuard,
}

#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Warnings {
    /// Starts capturing (a `#[tokio::test]` runs on one thread, so the store's own code
    /// logs here).
    pub(crate) fn capture() -> Self {
        let written = Captured::default();
        let writer = written.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || writer.clone())
            .finish();
        Self {
            written,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    /// What was logged so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.written.0.lock().unwrap()).into_owned()
    }
}
