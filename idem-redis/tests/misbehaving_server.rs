//! The store against a server that misbehaves: a raw TCP listener on 127.0.0.1 speaking
//! just enough RESP, which counts what the store sends. The function library is loaded at
//! most twice per call, never for an error other than a missing function, and a script is
//! loaded only for `NOSCRIPT`: a call against a server that misbehaves ends, with the
//! server's error, after a bounded number of round trips. A count reads each key once,
//! in pipelines, and a key the batch could not read once more alone; a connection that
//! goes silent is replaced.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{Admin, Fingerprint, Key, Store, StoreError, raw::storage_name};
use idem_redis::RedisStore;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// One command as the fake server received it.
struct Call<'a> {
    args: &'a [Vec<u8>],
    /// How often the very same command came before.
    before: usize,
    /// Which connection it came on, from 0 in the order they were accepted.
    connection: usize,
}

/// A fake Redis on 127.0.0.1 answering each command with `answer(call)`, raw RESP, or
/// not at all for `None`; returns its URL and the commands it received, each as its name
/// (with the subcommand for `FUNCTION` and `SCRIPT`), upper-cased, and ` +` after it when
/// the next command came in the same write; `CONNECT` for each connection accepted.
async fn fake_redis(
    answer: impl Fn(&Call<'_>) -> Option<Vec<u8>> + Send + Sync + 'static,
) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let answer = Arc::new(answer);
    let times = Arc::new(Mutex::new(HashMap::<Vec<Vec<u8>>, usize>::new()));
    tokio::spawn(async move {
        let mut accepted = 0;
        while let Ok((socket, _)) = listener.accept().await {
            let connection = accepted;
            accepted += 1;
            log.lock().unwrap().push("CONNECT".to_owned());
            let (log, answer, times) = (Arc::clone(&log), Arc::clone(&answer), Arc::clone(&times));
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut read = BufReader::new(read);
                while let Some(args) = read_command(&mut read).await {
                    let mut name = String::from_utf8_lossy(&args[0]).to_uppercase();
                    if matches!(name.as_str(), "FUNCTION" | "SCRIPT") && args.len() > 1 {
                        name = format!("{name} {}", String::from_utf8_lossy(&args[1]));
                        name = name.to_uppercase();
                    }
                    // A command with more bytes already behind it came in one write with
                    // the next: a pipeline.
                    if !read.buffer().is_empty() {
                        name.push_str(" +");
                    }
                    log.lock().unwrap().push(name);
                    let before = {
                        let mut times = times.lock().unwrap();
                        let count = times.entry(args.clone()).or_default();
                        *count += 1;
                        *count - 1
                    };
                    let call = Call {
                        args: &args,
                        before,
                        connection,
                    };
                    if let Some(reply) = answer(&call)
                        && write.write_all(&reply).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (url, seen)
}

/// One command, an array of bulk strings; `None` at the end of the stream or on anything
/// else.
async fn read_command<R: tokio::io::AsyncBufRead + Unpin>(read: &mut R) -> Option<Vec<Vec<u8>>> {
    let mut line = String::new();
    if read.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let count: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        line.clear();
        read.read_line(&mut line).await.ok()?;
        let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
        let mut arg = vec![0; len + 2];
        read.read_exact(&mut arg).await.ok()?;
        arg.truncate(len);
        args.push(arg);
    }
    (!args.is_empty()).then_some(args)
}

fn is(args: &[Vec<u8>], name: &str) -> bool {
    args[0].eq_ignore_ascii_case(name.as_bytes())
}

/// A read of one key against a server answering with `answer`, bounded in time (a store
/// that loops forever fails here); answers the store's error and the commands the server
/// saw from the read alone.
async fn read_against(answer: fn(&[Vec<u8>]) -> &'static [u8]) -> (StoreError, Vec<String>) {
    let (url, seen) = fake_redis(move |call| Some(answer(call.args).to_vec())).await;
    let store = RedisStore::standalone(&url).await.expect("connect");
    seen.lock().unwrap().clear(); // the connection's own setup
    let key = Key::new("misbehaving", "k").unwrap();
    let read = tokio::time::timeout(Duration::from_secs(10), store.get(&key))
        .await
        .expect("the read ends");
    let err = read.expect_err("the server answers only errors");
    let seen = seen.lock().unwrap().clone();
    (err, seen)
}

fn count(seen: &[String], name: &str) -> usize {
    seen.iter().filter(|s| *s == name).count()
}

#[tokio::test]
async fn a_function_still_missing_after_two_loads_is_an_error_not_a_loop() {
    let (err, seen) = read_against(|args| {
        if is(args, "FCALL") {
            b"-ERR Function not found\r\n"
        } else if is(args, "FUNCTION") {
            b"$4\r\nidem\r\n"
        } else {
            b"+OK\r\n"
        }
    })
    .await;
    assert_eq!(count(&seen, "FUNCTION LOAD"), 2, "{seen:?}");
    assert_eq!(count(&seen, "FCALL"), 3, "{seen:?}");
    assert_eq!(count(&seen, "EVALSHA"), 0, "{seen:?}");
    assert!(format!("{err:?}").contains("Function not found"), "{err:?}");
}

#[tokio::test]
async fn another_error_from_a_function_loads_nothing() {
    let (err, seen) = read_against(|args| {
        if is(args, "FCALL") {
            b"-ERR something else went wrong\r\n"
        } else {
            b"+OK\r\n"
        }
    })
    .await;
    assert_eq!(seen, ["FCALL"]);
    assert!(format!("{err:?}").contains("something else"), "{err:?}");
}

#[tokio::test]
async fn a_script_is_loaded_once_for_noscript_and_never_for_another_error() {
    // No functions on this server (before Redis 7): the store sends the script.
    let (err, seen) = read_against(|args| {
        if is(args, "FCALL") {
            b"-ERR unknown command 'FCALL', with args beginning with: \r\n"
        } else if is(args, "EVALSHA") {
            b"-ERR the script failed\r\n"
        } else {
            b"+OK\r\n"
        }
    })
    .await;
    assert_eq!(seen, ["FCALL", "EVALSHA"]);
    assert!(format!("{err:?}").contains("the script failed"), "{err:?}");

    let (err, seen) = read_against(|args| {
        if is(args, "FCALL") {
            b"-ERR unknown command 'FCALL', with args beginning with: \r\n"
        } else if is(args, "EVALSHA") {
            b"-NOSCRIPT No matching script. Please use EVAL.\r\n"
        } else if is(args, "SCRIPT") {
            b"$40\r\n0000000000000000000000000000000000000000\r\n"
        } else {
            b"+OK\r\n"
        }
    })
    .await;
    assert_eq!(
        seen,
        ["FCALL", "EVALSHA", "SCRIPT LOAD", "EVALSHA"],
        "{err:?}"
    );
}

fn bulk(bytes: &[u8]) -> Vec<u8> {
    let mut out = format!("${}\r\n", bytes.len()).into_bytes();
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
    out
}

fn array(items: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", items.len()).into_bytes();
    for item in items {
        out.extend_from_slice(item);
    }
    out
}

/// A count on a fake server holding two keys of the store's layout under `fake:`, one a
/// completed record and one answered by `other(times read before)`; returns the count and
/// the `HMGET`s the server saw.
async fn count_with(
    other: impl Fn(usize) -> &'static [u8] + Send + Sync + 'static,
) -> (Result<idem_core::admin::Stats, StoreError>, Vec<String>) {
    let prefix = "fake:";
    let name = |key: &str| {
        let key = Key::new("fake", key).unwrap();
        format!("{prefix}{{{}}}", storage_name::key_name(&key)).into_bytes()
    };
    let record = name("a-record");
    let fields: Vec<Vec<u8>> = [
        Fingerprint::of_bytes("x").as_bytes().as_slice(),
        b"completed",
        b"1",
        &[0; 16],
        b"1",
        b"1",
        b"4102444800000",
    ]
    .iter()
    .map(|field| bulk(field))
    .collect();
    let (scanned, summary) = (
        array(&[bulk(b"0"), array(&[bulk(&record), bulk(&name("other"))])]),
        array(&fields),
    );
    let (url, seen) = fake_redis(move |&Call { args, before, .. }| {
        Some(if is(args, "TIME") {
            array(&[bulk(b"1700000000"), bulk(b"0")])
        } else if is(args, "SCAN") {
            scanned.clone()
        } else if is(args, "HMGET") && args[1] == record && before == 0 {
            summary.clone()
        } else if is(args, "HMGET") && args[1] == record {
            b"-ERR this key was read already\r\n".to_vec()
        } else if is(args, "HMGET") {
            other(before).to_vec()
        } else {
            b"+OK\r\n".to_vec()
        })
    })
    .await;
    let store = RedisStore::standalone(&url)
        .await
        .expect("connect")
        .with_prefix(prefix)
        .unwrap();
    let stats = tokio::time::timeout(Duration::from_secs(10), store.stats(10))
        .await
        .expect("the count ends");
    let seen = seen.lock().unwrap().clone();
    let reads = seen
        .into_iter()
        .filter(|s| s.starts_with("HMGET"))
        .collect();
    (stats, reads)
}

const WRONGTYPE: &[u8] = b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n";

/// A count reads each key's summary once, in the batch's pipeline: an answer of a key of
/// another type is counted unreadable from that answer, and a key that answered is not
/// read again (the server here refuses any second read of a key).
#[tokio::test]
async fn a_count_reads_each_key_once_and_counts_another_type_from_its_answer() {
    let warnings = common::Warnings::capture();
    let (stats, reads) = count_with(|before| {
        if before == 0 {
            WRONGTYPE
        } else {
            b"-ERR this key was read already\r\n"
        }
    })
    .await;
    let stats = stats.expect("a count");
    assert_eq!((stats.total, stats.unreadable), (1, 1), "{stats:?}");
    // Both in one pipeline: a round trip per batch, not per key.
    assert_eq!(reads, ["HMGET +", "HMGET"]);
    // The operator's log says what the skipped key is.
    let logged = warnings.text();
    assert!(
        logged.contains("skipped a key that is not a readable record")
            && logged.contains("not a record's hash"),
        "{logged}"
    );
}

/// A key whose answer in the batch is another error (a Cluster moving its slot answers
/// `TRYAGAIN`) is read again on its own: found of another type there, it is counted
/// unreadable; any other error there fails the count, which never leaves a record out
/// without saying so.
#[tokio::test]
async fn a_key_the_batch_could_not_read_is_read_again_alone() {
    let (stats, reads) = count_with(|before| {
        if before == 0 {
            b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n"
        } else {
            WRONGTYPE
        }
    })
    .await;
    let stats = stats.expect("a count");
    assert_eq!((stats.total, stats.unreadable), (1, 1), "{stats:?}");
    assert_eq!(reads, ["HMGET +", "HMGET", "HMGET"]);

    let (stats, _) = count_with(|before| {
        if before == 0 {
            b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n"
        } else {
            b"-ERR still moving\r\n"
        }
    })
    .await;
    assert!(
        matches!(stats, Err(StoreError::Backend { .. })),
        "{stats:?}"
    );
}

/// A store that found functions refused sends scripts from then on (for a minute) rather
/// than a refused `FCALL` before every call.
#[tokio::test]
async fn after_functions_are_refused_calls_go_straight_to_scripts() {
    let (url, seen) = fake_redis(|&Call { args, .. }| {
        Some(if is(args, "FCALL") {
            b"-ERR unknown command 'FCALL', with args beginning with: \r\n".to_vec()
        } else if is(args, "EVALSHA") {
            b"-ERR the script failed\r\n".to_vec()
        } else {
            b"+OK\r\n".to_vec()
        })
    })
    .await;
    let store = RedisStore::standalone(&url).await.expect("connect");
    seen.lock().unwrap().clear();
    let key = Key::new("misbehaving", "k").unwrap();
    for _ in 0..3 {
        store.get(&key).await.expect_err("only errors");
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, ["FCALL", "EVALSHA", "EVALSHA", "EVALSHA"]);
}

/// A connection that stops answering (packets dropped, no reset) is replaced after a
/// request times out: later calls reach the server again on a new connection.
#[tokio::test]
async fn a_connection_that_stops_answering_is_replaced() {
    let (url, seen) = fake_redis(
        |&Call {
             args, connection, ..
         }| {
            if is(args, "FCALL") && connection == 0 {
                None // silent from here on, as a dropped route is
            } else if is(args, "FCALL") {
                Some(b"-ERR answered on a new connection\r\n".to_vec())
            } else {
                Some(b"+OK\r\n".to_vec())
            }
        },
    )
    .await;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_millis(200)));
    let store = RedisStore::standalone_with_config(&url, config)
        .await
        .expect("connect");
    let key = Key::new("misbehaving", "k").unwrap();
    let first = store.get(&key).await.expect_err("no answer");
    assert!(matches!(first, StoreError::Unavailable { .. }), "{first:?}");
    // The first timeout replaces the connection (in the background), without waiting for
    // another call to time out too. Bounded: 5 s.
    let connects = || {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|s| *s == "CONNECT")
            .count()
    };
    for _ in 0..100 {
        if connects() > 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(connects(), 2, "a new connection after the timeout");
    // The store takes the new connection once it is set up: a call just before that
    // still meets the silent one (and times out). Bounded: 10 calls.
    let mut answered = false;
    for _ in 0..10 {
        let err = store.get(&key).await.expect_err("only errors");
        if format!("{err:?}").contains("answered on a new connection") {
            answered = true;
            break;
        }
    }
    assert!(answered, "the store kept the silent connection");
}

#[tokio::test]
async fn debug_shows_the_connection_kind_and_prefix() {
    let (url, _) = fake_redis(|_| Some(b"+OK\r\n".to_vec())).await;
    let store = RedisStore::standalone(&url)
        .await
        .expect("connect")
        .with_prefix("app1:")
        .unwrap();
    assert_eq!(
        format!("{store:?}"),
        r#"RedisStore { connection: "standalone", prefix: "app1:" }"#
    );
}

/// `idem migrate` on Redis connects, which proves the address, and says there is nothing
/// to create.
#[tokio::test]
async fn migrate_connects_and_says_there_is_no_schema() {
    let (url, seen) = fake_redis(|_| Some(b"+OK\r\n".to_vec())).await;
    let location = idem_core::connect::parse_url(
        &url,
        &idem_core::connect::ConnectOptions::default(),
        &[&idem_redis::BACKEND],
    )
    .unwrap();
    let said = location.migrate().await.expect("a server that answers");
    assert_eq!(
        said,
        format!("nothing to migrate: Redis prefix \"idem:\" at {url} needs no schema")
    );
    assert!(seen.lock().unwrap().contains(&"CONNECT".to_owned()));
}
