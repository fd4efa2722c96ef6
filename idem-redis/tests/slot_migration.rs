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
    async fn open(host: &str, port: u16, id: &str) -> Self {
        // Slots are moved only on a cluster of this machine's.
        assert!(
            matches!(host, "127.0.0.1" | "::1" | "localhost"),
            "the test moves slots only on a loopback cluster, not {host}"
        );
        let client = redis::Client::open(format!("redis://{host}:{port}")).unwrap();
        let connection = client.get_multiplexed_async_connection().await.unwrap();
        Self {
            id: id.to_owned(),
            host: host.to_owned(),
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

    /// The slots this node has open: `MIGRATING` (`[slot->-id]`) or `IMPORTING`
    /// (`[slot-<-id]`) in its own line of `CLUSTER NODES`.
    async fn open_slots(&mut self) -> Vec<i64> {
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut self.connection)
            .await
            .unwrap();
        let mine = nodes
            .lines()
            .find(|line| line.contains("myself"))
            .unwrap_or_default();
        mine.split_whitespace()
            .filter_map(|part| part.strip_prefix('['))
            .filter_map(|part| part.split(['-', '>', '<']).next()?.parse().ok())
            .collect()
    }
}

/// The primaries of the cluster, each once, and the owner of each slot range.
struct Layout {
    nodes: Vec<Node>,
    /// `(first slot, last slot, index in nodes)`.
    ranges: Vec<(i64, i64, usize)>,
}

impl Layout {
    async fn of(cluster: &mut ClusterConnection) -> Self {
        let slots: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(cluster)
            .await
            .unwrap();
        let mut nodes: Vec<Node> = Vec::new();
        let mut ranges = Vec::new();
        for (start, end, host, port, id) in primaries(&slots) {
            let index = match nodes.iter().position(|node| node.id == id) {
                Some(index) => index,
                None => {
                    nodes.push(Node::open(&host, port, &id).await);
                    nodes.len() - 1
                }
            };
            ranges.push((start, end, index));
        }
        Self { nodes, ranges }
    }

    fn owner(&self, slot: i64) -> usize {
        self.ranges
            .iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .map(|(.., index)| *index)
            .expect("an owner for every slot")
    }
}

/// Puts every slot left open on the cluster back in order: by this test just now, or by
/// a run of it that was killed midway (a test runner ends the tests still running at the
/// first failure). The owner stops redirecting first, so no key reaches another node
/// after that; then each key another node took is moved back to the owner, or dropped
/// there if the owner has that key again; then every node marks the slot stable.
async fn settle_open_slots(cluster: &mut ClusterConnection) {
    let mut layout = Layout::of(cluster).await;
    let mut open = BTreeSet::new();
    for node in &mut layout.nodes {
        open.extend(node.open_slots().await);
    }
    for slot in open {
        let owner = layout.owner(slot);
        layout.nodes[owner].setslot(slot, &["STABLE"]).await;
        let (owner_host, owner_port) = (layout.nodes[owner].host.clone(), layout.nodes[owner].port);
        for (index, node) in layout.nodes.iter_mut().enumerate() {
            if index == owner {
                continue;
            }
            let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(10_000)
                .query_async(&mut node.connection)
                .await
                .unwrap();
            for key in keys {
                let back: redis::RedisResult<((), String)> = redis::pipe()
                    .cmd("ASKING")
                    .cmd("MIGRATE")
                    .arg(&owner_host)
                    .arg(owner_port)
                    .arg(&key)
                    .arg(0)
                    .arg(5_000)
                    .query_async(&mut node.connection)
                    .await;
                match back {
                    Ok(_) => {}
                    Err(err) if err.code() == Some("BUSYKEY") => {
                        let ((), _): ((), i64) = redis::pipe()
                            .cmd("ASKING")
                            .cmd("DEL")
                            .arg(&key)
                            .query_async(&mut node.connection)
                            .await
                            .unwrap();
                    }
                    Err(err) => panic!("moving a key of slot {slot} back: {err}"),
                }
            }
            node.setslot(slot, &["STABLE"]).await;
        }
    }
}

/// Starts moving the slot of `name` to another primary: `IMPORTING` there, `MIGRATING`
/// on its owner, and `name` itself moved; [`settle_open_slots`] undoes it.
async fn start_migration(cluster: &mut ClusterConnection, name: &str) {
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(name)
        .query_async(cluster)
        .await
        .unwrap();
    let mut layout = Layout::of(cluster).await;
    let source = layout.owner(slot);
    let target = (source + 1) % layout.nodes.len();
    assert_ne!(source, target, "a cluster of more than one primary");
    let (source_id, target_id) = (
        layout.nodes[source].id.clone(),
        layout.nodes[target].id.clone(),
    );
    let (target_host, target_port) = (layout.nodes[target].host.clone(), layout.nodes[target].port);
    layout.nodes[target]
        .setslot(slot, &["IMPORTING", &source_id])
        .await;
    layout.nodes[source]
        .setslot(slot, &["MIGRATING", &target_id])
        .await;
    let moved: String = redis::cmd("MIGRATE")
        .arg(&target_host)
        .arg(target_port)
        .arg(name)
        .arg(0)
        .arg(5_000)
        .query_async(&mut layout.nodes[source].connection)
        .await
        .unwrap();
    assert_eq!(moved, "OK");
    // The state this test is about: the new node holds the key but answers MOVED for
    // it unless asked with ASKING.
    let target = &mut layout.nodes[target].connection;
    let plain: redis::RedisResult<i64> = redis::cmd("EXISTS").arg(name).query_async(target).await;
    assert_eq!(
        plain.expect_err("MOVED from the importing node").code(),
        Some("MOVED")
    );
    let ((), asked): ((), i64) = redis::pipe()
        .cmd("ASKING")
        .cmd("EXISTS")
        .arg(name)
        .query_async(target)
        .await
        .unwrap();
    assert_eq!(asked, 1, "the key is on the new node");
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

async fn cluster_connection(list: &str) -> ClusterConnection {
    redis::cluster::ClusterClient::new(common::nodes(list))
        .unwrap()
        .get_async_connection()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_listing_during_a_slot_migration_reads_every_record_once() {
    let Some(list) = idem_testkit::service_url(common::CLUSTER) else {
        return;
    };
    let mut cluster = cluster_connection(&list).await;
    settle_open_slots(&mut cluster).await;
    // In a task, so that the slots are settled whatever happens in it.
    let outcome = tokio::spawn(list_while_slots_move(list)).await;
    settle_open_slots(&mut cluster).await;
    if let Err(err) = outcome {
        std::panic::resume_unwind(err.into_panic());
    }
}

/// `call`, bounded well within a test runner's limit, so that the slots are settled by the
/// test rather than left open by a runner that ends it.
async fn bounded<T>(call: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(30), call)
        .await
        .expect("the call ends while a slot moves")
}

async fn list_while_slots_move(list: String) {
    let prefix = common::unique_prefix();
    let store = common::cluster_in(&list, &prefix).await;
    assert_eq!(
        format!("{store:?}"),
        format!("RedisStore {{ connection: \"cluster\", prefix: {prefix:?} }}")
    );
    // Names of this run's own, so that their slots differ from run to run.
    let run = idem_testkit::Namespace::fresh();
    let keys: Vec<Key> = (0..5)
        .map(|n| Key::new("migration", format!("order-{n}-{run}")).unwrap())
        .collect();
    common::completed(&store, &keys).await;
    let name = |key: &Key| format!("{prefix}{{{}}}", storage_name::key_name(key));
    let mut cluster = cluster_connection(&list).await;
    // A key of the store's layout that is not a hash (gone in ten minutes).
    let odd = name(&Key::new("migration", format!("a-string-{run}")).unwrap());
    let () = redis::cmd("SET")
        .arg(&odd)
        .arg("x")
        .arg("PX")
        .arg(600_000)
        .query_async(&mut cluster)
        .await
        .unwrap();
    start_migration(&mut cluster, &name(&keys[0])).await;
    let listed = bounded(store.list(&ListQuery::new())).await;
    let stats = bounded(store.stats(10)).await;
    // The other key moves too.
    start_migration(&mut cluster, &odd).await;
    let listed_with_odd = bounded(store.list(&ListQuery::new())).await;
    let stats_with_odd = bounded(store.stats(10)).await;

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
    tracing::warn!("captured");
    let page = store.list(&ListQuery::new().limit(100)).await.unwrap();
    let stats = store.stats(10).await.unwrap();
    let logged = warnings.text();
    assert_eq!(page.records.len(), keys.len());
    assert_eq!((stats.total, stats.unreadable), (30, 0), "{stats:?}");
    assert!(logged.contains("captured"), "the capture works: {logged}");
    assert!(!logged.contains("pipeline failed"), "{logged}");
}
