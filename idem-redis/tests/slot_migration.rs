//! An operator's listing and count while a Cluster moves slots. A key already moved to its
//! new node is found by that node's `SCAN`, but the node answers `MOVED` for it until the
//! slot is handed over: the client follows the redirection for the batch's pipelined read
//! (to the old node, which answers `ASK`), or gives up on the batch, and then the key is
//! read on its own, routed by its slot. Which of the two happens depends on where the
//! test's keys fall; either way every record is listed once, and a key of another type
//! counts as unreadable, not as a failure of the whole listing. The fallback itself is
//! checked deterministically against a fake server (`misbehaving_server.rs`).

mod common;

use std::collections::BTreeSet;

use idem_core::{Admin, Key, admin::ListQuery, raw::storage_name};
use redis::Value;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;

/// One primary of the test cluster: its id and a connection to it alone.
struct Node {
    id: String,
    host: String,
    port: u16,
    connection: MultiplexedConnection,
}

impl Node {
    async fn open(host: String, port: u16, id: String) -> Self {
        let client = redis::Client::open(format!("redis://{host}:{port}")).unwrap();
        let connection = client.get_multiplexed_async_connection().await.unwrap();
        Self {
            id,
            host,
            port,
            connection,
        }
    }

    async fn setslot(&mut self, slot: i64, args: &[&str]) {
        let () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(args)
            .query_async(&mut self.connection)
            .await
            .unwrap_or_else(|err| {
                panic!("CLUSTER SETSLOT {slot} {args:?} on {}: {err}", self.port)
            });
    }
}

/// A slot half-way through a move: `MIGRATING` on its owner, `IMPORTING` on another
/// primary, and one key already moved.
struct Migration {
    slot: i64,
    source: Node,
    target: Node,
}

impl Migration {
    /// Moves the key `name` (and starts moving its slot) to another primary.
    async fn start(cluster: &mut ClusterConnection, name: &str) -> Self {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(name)
            .query_async(cluster)
            .await
            .unwrap();
        let slots: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(cluster)
            .await
            .unwrap();
        let primaries = primaries(&slots);
        let (host, port, id) = primaries
            .iter()
            .find(|(start, end, ..)| (*start..=*end).contains(&slot))
            .map(|(_, _, host, port, id)| (host.clone(), *port, id.clone()))
            .expect("an owner for every slot");
        let (other_host, other_port, other_id) = primaries
            .iter()
            .find(|(.., other)| *other != id)
            .map(|(_, _, host, port, id)| (host.clone(), *port, id.clone()))
            .expect("a cluster of more than one primary");
        let mut source = Node::open(host, port, id).await;
        let mut target = Node::open(other_host, other_port, other_id).await;
        let source_id = source.id.clone();
        let target_id = target.id.clone();
        target.setslot(slot, &["IMPORTING", &source_id]).await;
        source.setslot(slot, &["MIGRATING", &target_id]).await;
        let moved: String = redis::cmd("MIGRATE")
            .arg(&target.host)
            .arg(target.port)
            .arg("")
            .arg(0)
            .arg(5_000)
            .arg("KEYS")
            .arg(name)
            .query_async(&mut source.connection)
            .await
            .unwrap();
        assert_eq!(moved, "OK");
        // The state this test is about: the new node holds the key but answers MOVED for
        // it unless asked with ASKING.
        let plain: redis::RedisResult<i64> = redis::cmd("EXISTS")
            .arg(name)
            .query_async(&mut target.connection)
            .await;
        assert_eq!(
            plain.expect_err("MOVED from the importing node").code(),
            Some("MOVED")
        );
        let (_, asked): ((), i64) = redis::pipe()
            .cmd("ASKING")
            .cmd("EXISTS")
            .arg(name)
            .query_async(&mut target.connection)
            .await
            .unwrap();
        assert_eq!(asked, 1, "the key is on the new node");
        Self {
            slot,
            source,
            target,
        }
    }

    /// Gives the slot back to its owner, with every key the new node took meanwhile (this
    /// test's and any another test wrote to the slot through an `ASK`). The owner first
    /// stops redirecting, so no key reaches the new node after the keys are moved back.
    async fn undo(mut self) {
        let slot = self.slot;
        self.source.setslot(slot, &["STABLE"]).await;
        let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(10_000)
            .query_async(&mut self.target.connection)
            .await
            .unwrap();
        if !keys.is_empty() {
            let (_, back): ((), String) = redis::pipe()
                .cmd("ASKING")
                .cmd("MIGRATE")
                .arg(&self.source.host)
                .arg(self.source.port)
                .arg("")
                .arg(0)
                .arg(5_000)
                .arg("KEYS")
                .arg(&keys)
                .query_async(&mut self.target.connection)
                .await
                .unwrap();
            assert_eq!(back, "OK");
        }
        self.target.setslot(slot, &["STABLE"]).await;
    }
}

/// `(first slot, last slot, host, port, id)` of each range's primary in a `CLUSTER SLOTS`
/// reply.
fn primaries(slots: &Value) -> Vec<(i64, i64, String, u16, String)> {
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).unwrap(),
        other => panic!("a string in CLUSTER SLOTS, not {other:?}"),
    };
    let Value::Array(ranges) = slots else {
        panic!("CLUSTER SLOTS: {slots:?}");
    };
    ranges
        .iter()
        .map(|range| match range {
            Value::Array(parts) => match parts.as_slice() {
                [
                    Value::Int(start),
                    Value::Int(end),
                    Value::Array(primary),
                    ..,
                ] => match primary.as_slice() {
                    [host, Value::Int(port), id, ..] => (
                        *start,
                        *end,
                        text(host),
                        u16::try_from(*port).unwrap(),
                        text(id),
                    ),
                    other => panic!("a primary in CLUSTER SLOTS: {other:?}"),
                },
                other => panic!("a range in CLUSTER SLOTS: {other:?}"),
            },
            other => panic!("a range in CLUSTER SLOTS: {other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn a_listing_during_a_slot_migration_reads_every_record_once() {
    let Some(list) = idem_testkit::service_url(common::CLUSTER) else {
        return;
    };
    let prefix = common::unique_prefix();
    let store = common::cluster_in(&list, &prefix).await;
    assert_eq!(
        format!("{store:?}"),
        format!("RedisStore {{ connection: \"cluster\", prefix: {prefix:?} }}")
    );
    let keys: Vec<Key> = (0..5)
        .map(|n| Key::new("migration", format!("order-{n}")).unwrap())
        .collect();
    common::completed(&store, &keys).await;
    let name = |key: &Key| format!("{prefix}{{{}}}", storage_name::key_name(key));
    let mut cluster = redis::cluster::ClusterClient::new(common::nodes(&list))
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    // A key of the store's layout that is not a hash.
    let odd = name(&Key::new("migration", "a-string").unwrap());
    let () = redis::cmd("SET")
        .arg(&odd)
        .arg("x")
        .query_async(&mut cluster)
        .await
        .unwrap();

    let moving = Migration::start(&mut cluster, &name(&keys[0])).await;
    let listed = store.list(&ListQuery::new()).await;
    let stats = store.stats(10).await;
    // The other key moves alone: a read of it fails the batch's pipeline on the new node
    // with WRONGTYPE only once it is asked for on its own.
    let moving_odd = Migration::start(&mut cluster, &odd).await;
    let listed_with_odd = store.list(&ListQuery::new()).await;
    let stats_with_odd = store.stats(10).await;
    moving_odd.undo().await;
    moving.undo().await;

    let expected: BTreeSet<&Key> = keys.iter().collect();
    for (listed, stats) in [(listed, stats), (listed_with_odd, stats_with_odd)] {
        let page = listed.expect("a listing while a slot moves");
        let found: Vec<&Key> = page.records.iter().map(|r| &r.record.key).collect();
        assert_eq!(found.len(), keys.len(), "each record once: {found:?}");
        assert_eq!(found.into_iter().collect::<BTreeSet<_>>(), expected);
        let stats = stats.expect("a count while a slot moves");
        assert_eq!((stats.total, stats.unreadable), (5, 1), "{stats:?}");
    }
}

/// Each node's batch of keys is read in one pipeline sent to that node, not key by key:
/// the keys of a batch lie in many slots, which a pipeline routed by its keys would refuse.
#[tokio::test]
async fn a_listing_on_a_cluster_reads_each_batch_in_one_pipeline() {
    let Some(list) = idem_testkit::service_url(common::CLUSTER) else {
        return;
    };
    let store = common::cluster(&list).await;
    let keys: Vec<Key> = (0..30)
        .map(|n| Key::new("batches", format!("order-{n}")).unwrap())
        .collect();
    common::completed(&store, &keys).await;
    let warnings = common::Warnings::capture();
    let page = store.list(&ListQuery::new().limit(100)).await.unwrap();
    let stats = store.stats(10).await.unwrap();
    let logged = warnings.text();
    assert_eq!(page.records.len(), keys.len());
    assert_eq!((stats.total, stats.unreadable), (30, 0), "{stats:?}");
    assert!(!logged.contains("pipeline failed"), "{logged}");
}
