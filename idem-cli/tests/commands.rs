//! Every subcommand, end to end: the built `idem` binary against SQLite and each server
//! backend (PostgreSQL, Redis standalone and Cluster, DynamoDB Local on 127.0.0.1), with
//! the records seeded and checked through the library on the same namespace.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Admin, Fingerprint, Key, key::StepName, record::Lease, store::ClaimOutcome,
    store::ClaimRequest, store::WriteOutcome,
};
use idem_dynamodb::DynamoDbStore;
use idem_dynamodb::aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use idem_dynamodb::aws_sdk_dynamodb::types::TimeToLiveSpecification;
use idem_postgres::PostgresStore;
use idem_postgres::sqlx::postgres::PgPoolOptions;
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;
use idem_testkit::{Namespace, service_url};
use serde_json::Value;
use tokio::runtime::Runtime;

const LONG: Duration = Duration::from_secs(3600);

/// A store the binary is pointed at, and the same store opened through the library.
struct Backend {
    runtime: Runtime,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    store: Arc<dyn Admin>,
    /// Whether `idem purge` deletes (false: the store deletes expired records itself).
    purges: bool,
}

/// What one run of the binary did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|err| panic!("{err}: {self:?}"))
    }
}

impl Backend {
    /// Runs `idem ARGS` against this store, with no terminal on stdin.
    fn idem(&self, args: &[&str]) -> Run {
        let output = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(args)
            .args(&self.args)
            .env_remove("IDEM_STORE")
            .env_remove("IDEM_TABLE")
            .env_remove("IDEM_PREFIX")
            .env_remove("IDEM_LOG_HASH_SECRET")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .output()
            .expect("run the idem binary");
        Run {
            code: output.status.code().expect("exited, not killed"),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Runs the command, which must succeed.
    fn ok(&self, args: &[&str]) -> Run {
        let run = self.idem(args);
        assert_eq!(run.code, 0, "idem {args:?}: {run:?}");
        run
    }

    fn block<T>(&self, future: impl Future<Output = T>) -> T {
        self.runtime.block_on(future)
    }

    fn claim(&self, scope: &str, key: &str, lease: Duration, retention: Duration) -> Lease {
        let request = ClaimRequest::new(
            Key::new(scope, key).unwrap(),
            Fingerprint::of_bytes(key),
            lease,
            retention,
        );
        match self.block(self.store.claim(&request)).unwrap() {
            ClaimOutcome::Claimed { lease, .. } => lease,
            other => panic!("{scope}/{key}: {other:?}"),
        }
    }

    fn completed(&self, scope: &str, key: &str, retention: Duration, response: &str) {
        let lease = self.claim(scope, key, LONG, retention);
        let done = self.block(self.store.complete(&lease, response.as_bytes()));
        assert_eq!(done.unwrap(), WriteOutcome::Applied);
    }

    fn failed(&self, scope: &str, key: &str) {
        let lease = self.claim(scope, key, LONG, LONG);
        let done = self.block(self.store.fail(&lease, b"declined"));
        assert_eq!(done.unwrap(), WriteOutcome::Applied);
    }

    fn get(&self, scope: &str, key: &str) -> Option<idem_core::Record> {
        self.block(self.store.get(&Key::new(scope, key).unwrap()))
            .unwrap()
    }

    /// Five records: two completed and one stuck in `acct_1/charge`, one failed in
    /// `acct_2/refund`, one in progress with a live lease in `acct_3/charge`.
    fn seed(&self) {
        self.completed("acct_1/charge", "secret-a", LONG, "{\"paid\":1}");
        self.completed("acct_1/charge", "secret-b", LONG, "{\"paid\":2}");
        self.claim(
            "acct_1/charge",
            "secret-stuck",
            Duration::from_millis(1),
            LONG,
        );
        self.failed("acct_2/refund", "secret-f");
        self.claim("acct_3/charge", "secret-live", LONG, LONG);
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn sqlite() -> Option<Backend> {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("idem-cli-{}.db", Namespace::fresh().as_str()));
    let _ = std::fs::remove_file(&path);
    let store = SqliteStore::open(&path).expect("open a SQLite file");
    Some(Backend {
        runtime: runtime(),
        args: vec!["--store".into(), format!("sqlite://{}", path.display())],
        env: vec![],
        store: Arc::new(store),
        purges: true,
    })
}

fn postgres() -> Option<Backend> {
    let url = service_url("IDEM_TEST_POSTGRES_URL")?;
    let runtime = runtime();
    let table = format!("idem_cli_{}", Namespace::fresh().as_str());
    let store = runtime.block_on(async {
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect(&url)
            .await
            .expect("connect to the test PostgreSQL");
        sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE IF EXISTS \"{table}\"")))
            .execute(&pool)
            .await
            .expect("drop a stale table");
        let store = PostgresStore::builder(pool).table(&table).unwrap().build();
        store.migrate().await.expect("migrate");
        store
    });
    Some(Backend {
        runtime,
        args: vec!["--store".into(), url, "--table".into(), table],
        env: vec![],
        store: Arc::new(store),
        purges: true,
    })
}

fn redis_standalone() -> Option<Backend> {
    let url = service_url("IDEM_TEST_REDIS_URL")?;
    let runtime = runtime();
    let prefix = format!("cli-{}:", Namespace::fresh().as_str());
    let store = runtime.block_on(async {
        RedisStore::standalone(&url)
            .await
            .expect("connect to the test Redis")
            .with_prefix(&prefix)
            .unwrap()
    });
    Some(Backend {
        runtime,
        args: vec!["--store".into(), url, "--prefix".into(), prefix],
        env: vec![],
        store: Arc::new(store),
        purges: false,
    })
}

fn redis_cluster() -> Option<Backend> {
    let nodes = service_url("IDEM_TEST_REDIS_CLUSTER_NODES")?;
    let runtime = runtime();
    let prefix = format!("cli-{}:", Namespace::fresh().as_str());
    let store = runtime.block_on(async {
        RedisStore::cluster(nodes.split(','))
            .await
            .expect("connect to the test Redis Cluster")
            .with_prefix(&prefix)
            .unwrap()
    });
    let url = format!("redis+cluster://{}", nodes.replace("redis://", ""));
    Some(Backend {
        runtime,
        args: vec!["--store".into(), url, "--prefix".into(), prefix],
        env: vec![],
        store: Arc::new(store),
        purges: false,
    })
}

fn dynamodb() -> Option<Backend> {
    let endpoint = service_url("IDEM_TEST_DYNAMODB_ENDPOINT")?;
    let runtime = runtime();
    let table = format!("idem_cli_{}", std::process::id());
    let prefix = format!("{}#", Namespace::fresh().as_str());
    let config = idem_dynamodb::aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(&endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "test",
            "test",
            None,
            None,
            "idem-cli-tests",
        ))
        .build();
    let client = idem_dynamodb::aws_sdk_dynamodb::Client::from_conf(config);
    runtime
        .block_on(idem_dynamodb::create_table(&client, &table))
        .expect("create the test table");
    // DynamoDB Local runs TTL deletions within a second or so of an item's TTL: with TTL
    // on, the records these tests expire vanish before `idem purge` can find them.
    runtime
        .block_on(
            client
                .update_time_to_live()
                .table_name(&table)
                .time_to_live_specification(
                    TimeToLiveSpecification::builder()
                        .attribute_name("ttl")
                        .enabled(false)
                        .build()
                        .expect("a TTL specification"),
                )
                .send(),
        )
        .expect("turn TTL off on the test table");
    let store = DynamoDbStore::builder(client, &table)
        .unwrap()
        .prefix(&prefix)
        .unwrap()
        .skew_margin(Duration::ZERO)
        .build();
    Some(Backend {
        runtime,
        args: vec![
            "--store".into(),
            format!("dynamodb://{table}?region=us-east-1&endpoint={endpoint}"),
            "--prefix".into(),
            prefix,
        ],
        env: vec![
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
        ],
        store: Arc::new(store),
        purges: true,
    })
}

fn migrate_then_stats_count_by_state(backend: Backend) {
    // Twice: migrating is idempotent.
    backend.ok(&["migrate"]);
    backend.ok(&["migrate"]);
    let empty = backend.ok(&["stats", "--json"]).json();
    assert_eq!(empty["total"], 0, "{empty}");

    backend.seed();
    let stats = backend.ok(&["stats", "--json"]).json();
    assert_eq!(stats["total"], 5, "{stats}");
    assert_eq!(stats["completed"], 2, "{stats}");
    assert_eq!(stats["failed"], 1, "{stats}");
    assert_eq!(stats["in_progress"], 2, "{stats}");
    assert_eq!(stats["in_progress_live"], 1, "{stats}");
    assert_eq!(stats["in_progress_lease_ended"], 1, "{stats}");
    assert_eq!(stats["expired_not_deleted"], 0, "{stats}");
    assert_eq!(stats["top_scopes"][0]["scope"], "acct_1/charge", "{stats}");
    assert_eq!(stats["top_scopes"][0]["records"], 3, "{stats}");
    assert!(stats["oldest_in_progress_age_seconds"].as_f64().unwrap() >= 0.0);

    let text = backend.ok(&["stats"]).stdout;
    assert!(text.contains("lease live 1, lease ended 1"), "{text}");
    let prometheus = backend.ok(&["stats", "--prometheus", "--top", "1"]).stdout;
    // The scope's short hash, never the scope, is its label; `idem stats` shows both.
    let hash = idem_core::key::scope_short_hash("acct_1/charge").to_string();
    assert!(text.contains(&format!("{hash}  acct_1/charge")), "{text}");
    assert!(
        !prometheus.contains("acct_1"),
        "a raw scope in a label: {prometheus}"
    );
    let scope_line = format!("idem_store_scope_records{{scope=\"{hash}\"}} 3");
    for line in [
        "idem_store_records{state=\"completed\"} 2",
        "idem_store_records{state=\"in_progress\"} 2",
        "idem_store_in_progress_records{lease=\"ended\"} 1",
        "idem_store_expired_records 0",
        scope_line.as_str(),
    ] {
        assert!(
            prometheus.lines().any(|l| l == line),
            "{line} in {prometheus}"
        );
    }
    let raw = backend
        .ok(&["stats", "--prometheus", "--raw-scope-labels", "--top", "1"])
        .stdout;
    assert!(
        raw.lines()
            .any(|l| l == "idem_store_scope_records{scope=\"acct_1/charge\"} 3"),
        "{raw}"
    );
    assert!(!raw.contains("acct_2"), "--top 1: {raw}");
}

fn list_filters_pages_and_hides_keys(backend: Backend) {
    backend.seed();
    for n in 0..5 {
        backend.completed("acct_4/charge", &format!("secret-{n}"), LONG, "{}");
    }
    // Every record exactly once through the cursors, keys hidden.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let mut args = vec!["list", "--json", "--limit", "3"];
        if let Some(cursor) = &cursor {
            args.extend(["--cursor", cursor.as_str()]);
        }
        let page = backend.ok(&args);
        assert!(
            !page.stdout.contains("secret-"),
            "keys hidden: {}",
            page.stdout
        );
        let json = page.json();
        for record in json["records"].as_array().unwrap() {
            seen.push(record["key_hash"].as_str().unwrap().to_owned());
        }
        match json["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let count = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!((count, seen.len()), (10, 10));

    let stuck = backend
        .ok(&["list", "--stuck", "0s", "--json", "--show-keys"])
        .json();
    let stuck = stuck["records"].as_array().unwrap();
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert_eq!(stuck[0]["key"], "secret-stuck");
    assert_eq!(stuck[0]["lease_live"], false);
    // Stuck for an hour: nothing yet.
    let none = backend.ok(&["list", "--stuck", "1h"]);
    assert!(none.stdout.contains("no records match"), "{none:?}");

    let failed = backend
        .ok(&["list", "--state", "failed", "--show-keys"])
        .stdout;
    assert!(
        failed.contains("secret-f") && failed.contains("acct_2/refund"),
        "{failed}"
    );
    assert_eq!(failed.lines().count(), 2, "a header and one row: {failed}");

    let scoped = backend
        .ok(&["list", "--scope-prefix", "acct_3/", "--json"])
        .json();
    assert_eq!(scoped["records"].as_array().unwrap().len(), 1, "{scoped}");
    assert!(scoped["records"][0].get("key").is_none(), "{scoped}");
    assert!(
        scoped["records"][0].get("response_base64").is_none(),
        "{scoped}"
    );

    let table = backend.ok(&["list", "--limit", "2"]).stdout;
    let hash = Key::new("acct_1/charge", "secret-a").unwrap().short_hash();
    assert!(table.contains(&format!("#{hash}")), "{table}");
    assert!(
        table.contains("more records follow: add --cursor "),
        "{table}"
    );

    // Under the service's log hash secret the hashes change, so they match its logs.
    let keyed = backend
        .ok(&[
            "list",
            "--limit",
            "2",
            "--log-hash-secret",
            "0123456789abcdef-secret",
        ])
        .stdout;
    assert!(!keyed.contains(&format!("#{hash}")), "{keyed}");
    assert_eq!(keyed.lines().count(), table.lines().count(), "{keyed}");
    let short = backend.idem(&["list", "--log-hash-secret", "short"]);
    assert_eq!(short.code, 2, "{short:?}");
    assert!(short.stderr.contains("at least 16"), "{short:?}");

    let bad = backend.idem(&["list", "--cursor", "not-a-cursor"]);
    assert_eq!(bad.code, 2, "{bad:?}");
}

fn inspect_shows_one_record(backend: Backend) {
    backend.seed();
    let shown = backend.ok(&["inspect", "acct_1/charge", "secret-a"]).stdout;
    assert!(
        shown.contains("secret-a"),
        "the typed key is shown: {shown}"
    );
    assert!(shown.contains("completed"), "{shown}");
    assert!(shown.contains("response     10 B"), "{shown}");
    assert!(!shown.contains("paid"), "no body unless asked: {shown}");
    let body = backend
        .ok(&["inspect", "acct_1/charge", "secret-a", "--show-response"])
        .stdout;
    assert!(body.contains("{\"paid\":1}"), "{body}");
    let lease = backend.claim("acct_5/charge", "secret-s", LONG, LONG);
    let step = StepName::new("charge").unwrap();
    let written = backend.block(backend.store.checkpoint(&lease, &step, b"ch_3PzL"));
    assert_eq!(written.unwrap(), WriteOutcome::Applied);
    let steps = backend.ok(&["inspect", "acct_5/charge", "secret-s"]).stdout;
    assert!(
        steps.contains("charge (7 B)") && !steps.contains("ch_3PzL"),
        "{steps}"
    );
    let steps = backend
        .ok(&["inspect", "acct_5/charge", "secret-s", "--show-steps"])
        .stdout;
    assert!(steps.contains("step value   charge: ch_3PzL"), "{steps}");
    let json = backend
        .ok(&[
            "inspect",
            "acct_3/charge",
            "secret-live",
            "--json",
            "--derive",
            "charge",
        ])
        .json();
    let record = backend.get("acct_3/charge", "secret-live").unwrap();
    assert_eq!(
        json["derived_keys"]["charge"],
        record.derive("charge"),
        "{json}"
    );
    let text = backend
        .ok(&[
            "inspect",
            "acct_3/charge",
            "secret-live",
            "--derive",
            "charge",
        ])
        .stdout;
    assert!(text.contains(&record.derive("charge")), "{text}");
    assert_eq!(json["state"], "in_progress");
    assert_eq!(json["lease_live"], true);
    assert_eq!(json["token"], 1);

    let missing = backend.idem(&["inspect", "acct_1/charge", "never-claimed"]);
    assert_eq!(missing.code, 3, "{missing:?}");
    assert!(missing.stderr.contains("no record"), "{missing:?}");
    assert!(!missing.stderr.contains("in quotes"), "{missing:?}");
    // Copied from the Idempotency-Key header, quotes and all.
    let quoted = backend.idem(&["inspect", "acct_1/charge", "\"secret-a\""]);
    assert_eq!(quoted.code, 3, "{quoted:?}");
    assert!(quoted.stderr.contains("try `secret-a`"), "{quoted:?}");

    // An idem-http record reads as the response its client got.
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    let stored = idem_http::StoredResponse::new(
        http::StatusCode::CREATED,
        headers,
        bytes::Bytes::from_static(b"{\"id\":7}"),
    );
    let lease = backend.claim("acct_6/POST /payments", "k-http", LONG, LONG);
    let done = backend.block(backend.store.complete(&lease, &stored.encode()));
    assert_eq!(done.unwrap(), WriteOutcome::Applied);
    let shown = backend
        .ok(&[
            "inspect",
            "acct_6/POST /payments",
            "k-http",
            "--show-response",
        ])
        .stdout;
    assert!(shown.contains("response:    HTTP 201 Created"), "{shown}");
    assert!(
        shown.contains("  content-type: application/json"),
        "{shown}"
    );
    assert!(shown.contains("{\"id\":7}"), "{shown}");
    let json = backend
        .ok(&[
            "inspect",
            "acct_6/POST /payments",
            "k-http",
            "--show-response",
            "--json",
        ])
        .json();
    assert_eq!(json["http_response"]["status"], 201, "{json}");
    assert_eq!(json["http_response"]["body"], "{\"id\":7}", "{json}");
    assert_eq!(json["http_response"]["body_encoding"], "utf-8", "{json}");
    assert_eq!(
        json["http_response"]["headers"][0][0], "content-type",
        "{json}"
    );
    let bad = backend.idem(&["inspect", "acct_1/charge", ""]);
    assert_eq!(bad.code, 2, "{bad:?}");
}

fn release_fences_the_owner(backend: Backend) {
    let owner = backend.claim("acct_1/charge", "secret-r", LONG, LONG);
    let step = StepName::new("charge").unwrap();
    let written = backend.block(backend.store.checkpoint(&owner, &step, b"ch_1"));
    assert_eq!(written.unwrap(), WriteOutcome::Applied);

    // No terminal and no --yes: nothing changes.
    let unconfirmed = backend.idem(&["release", "acct_1/charge", "secret-r"]);
    assert_eq!(unconfirmed.code, 5, "{unconfirmed:?}");
    assert_eq!(backend.get("acct_1/charge", "secret-r").unwrap().token, 1);

    let released = backend.ok(&["release", "acct_1/charge", "secret-r", "--yes"]);
    assert!(
        released.stdout.contains("released: token 1 -> 2"),
        "{released:?}"
    );
    assert!(
        released.stdout.contains("charge"),
        "names the steps: {released:?}"
    );
    // The old owner is fenced; the next claim takes over at once, with the checkpoint.
    let late = backend.block(backend.store.complete(&owner, b"late"));
    assert_eq!(late.unwrap(), WriteOutcome::Fenced);
    let request = ClaimRequest::new(
        Key::new("acct_1/charge", "secret-r").unwrap(),
        Fingerprint::of_bytes("secret-r"),
        LONG,
        LONG,
    );
    match backend.block(backend.store.claim(&request)).unwrap() {
        ClaimOutcome::Claimed { lease, steps, .. } => {
            assert_eq!(lease.token, 3);
            assert_eq!(steps.get("charge").map(Vec::as_slice), Some(&b"ch_1"[..]));
        }
        other => panic!("{other:?}"),
    }

    backend.completed("acct_1/charge", "secret-done", LONG, "{}");
    let refused = backend.idem(&["release", "acct_1/charge", "secret-done", "--yes"]);
    assert_eq!(refused.code, 4, "{refused:?}");
    assert!(refused.stderr.contains("idem delete"), "{refused:?}");
    let record = backend.get("acct_1/charge", "secret-done").unwrap();
    assert_eq!((record.state.as_str(), record.token), ("completed", 1));

    let missing = backend.idem(&["release", "acct_1/charge", "never-claimed", "--yes"]);
    assert_eq!(missing.code, 3, "{missing:?}");
}

fn delete_removes_one_record(backend: Backend) {
    backend.completed("acct_1/charge", "secret-d", LONG, "{}");
    let unconfirmed = backend.idem(&["delete", "acct_1/charge", "secret-d"]);
    assert_eq!(unconfirmed.code, 5, "{unconfirmed:?}");
    assert!(backend.get("acct_1/charge", "secret-d").is_some());

    let deleted = backend.ok(&["delete", "acct_1/charge", "secret-d", "--yes"]);
    assert!(
        deleted
            .stdout
            .contains("deleted: the record (completed, token 1)"),
        "{deleted:?}"
    );
    assert!(backend.get("acct_1/charge", "secret-d").is_none());
    // The next request runs the work again: a new lifetime.
    let lease = backend.claim("acct_1/charge", "secret-d", LONG, LONG);
    assert_eq!(lease.token, 1);

    let missing = backend.idem(&["delete", "acct_1/charge", "secret-d-never", "--yes"]);
    assert_eq!(missing.code, 3, "{missing:?}");
}

fn purge_deletes_only_expired_records(backend: Backend) {
    let short = Duration::from_millis(1);
    for n in 0..5 {
        backend.completed("acct_1/charge", &format!("old-{n}"), short, "{}");
    }
    backend.completed("acct_1/charge", "kept", LONG, "{}");
    // Retention over, but a live lease holds it: present, never purged.
    backend.claim("acct_1/charge", "held", LONG, short);
    std::thread::sleep(Duration::from_millis(50));

    let purged = backend.ok(&["purge", "--batch", "2"]);
    if backend.purges {
        assert!(
            purged.stdout.starts_with("purged 5 expired records"),
            "{purged:?}"
        );
    } else {
        assert!(purged.stdout.contains("nothing to purge"), "{purged:?}");
    }
    let stats = backend.ok(&["stats", "--json"]).json();
    assert_eq!(stats["total"], 2, "{stats}");
    assert_eq!(stats["expired_not_deleted"], 0, "{stats}");
    assert!(backend.get("acct_1/charge", "held").is_some());

    let again = backend.ok(&["purge"]);
    if backend.purges {
        assert!(again.stdout.starts_with("purged 0 "), "{again:?}");
    }
}

fn purge_stops_at_max(backend: Backend) {
    for n in 0..4 {
        let key = format!("old-{n}");
        backend.completed("acct_1/charge", &key, Duration::from_millis(1), "{}");
    }
    std::thread::sleep(Duration::from_millis(50));
    let purged = backend.ok(&["purge", "--max", "3", "--batch", "2"]);
    let stats = backend.ok(&["stats", "--json"]).json();
    if backend.purges {
        assert!(purged.stdout.starts_with("purged 3 "), "{purged:?}");
        assert_eq!(stats["total"], 1, "{stats}");
    } else {
        // The store deleted all four itself: the purge has nothing to stop at.
        assert!(purged.stdout.contains("nothing to purge"), "{purged:?}");
        assert_eq!(stats["total"], 0, "{stats}");
    }
}

macro_rules! every_backend {
    ($($backend:ident),* $(,)?) => {
        $(
            mod $backend {
                macro_rules! case {
                    ($case:ident) => {
                        #[test]
                        fn $case() {
                            if let Some(backend) = super::$backend() {
                                super::$case(backend);
                            }
                        }
                    };
                }
                case!(migrate_then_stats_count_by_state);
                case!(list_filters_pages_and_hides_keys);
                case!(inspect_shows_one_record);
                case!(release_fences_the_owner);
                case!(delete_removes_one_record);
                case!(purge_deletes_only_expired_records);
                case!(purge_stops_at_max);
            }
        )*
    };
}

every_backend!(sqlite, postgres, redis_standalone, redis_cluster, dynamodb);

/// Runs the binary with no store flags from a backend.
fn bare(args: &[&str]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_STORE")
        .env_remove("IDEM_TABLE")
        .env_remove("IDEM_PREFIX")
        .env_remove("IDEM_LOG_HASH_SECRET")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .stdin(Stdio::null())
        .output()
        .expect("run the idem binary");
    Run {
        code: output.status.code().expect("exited"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[test]
fn usage_errors_exit_2_and_say_what_to_do() {
    let none = bare(&["stats"]);
    assert_eq!(none.code, 2, "{none:?}");
    assert!(none.stderr.contains("--store"), "{none:?}");
    let scheme = bare(&["stats", "--store", "mysql://127.0.0.1/db"]);
    assert_eq!(scheme.code, 2, "{scheme:?}");
    assert!(scheme.stderr.contains("sqlite://"), "{scheme:?}");
    let flag = bare(&["stats", "--store", "sqlite:///tmp/x.db", "--prefix", "p"]);
    assert_eq!(flag.code, 2, "{flag:?}");
    assert!(flag.stderr.contains("--prefix"), "{flag:?}");
    let unknown = bare(&["frobnicate"]);
    assert_eq!(unknown.code, 2, "{unknown:?}");
    let no_creds = bare(&[
        "stats",
        "--store",
        "dynamodb://idem?region=us-east-1&endpoint=http://127.0.0.1:1",
    ]);
    assert_eq!(no_creds.code, 2, "{no_creds:?}");
    assert!(
        no_creds.stderr.contains("AWS_ACCESS_KEY_ID"),
        "{no_creds:?}"
    );
    // A table name DynamoDB refuses is found from the URL alone, before credentials.
    let bad_table = bare(&["stats", "--store", "dynamodb://t?region=us-east-1"]);
    assert_eq!(bad_table.code, 2, "{bad_table:?}");
    assert!(bad_table.stderr.contains("3 to 255"), "{bad_table:?}");
}

#[test]
fn inspect_shows_a_record_that_does_not_decode_as_stored() {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("idem-cli-{}.db", Namespace::fresh().as_str()));
    let _ = std::fs::remove_file(&path);
    drop(SqliteStore::open(&path).expect("create the schema"));
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "PRAGMA ignore_check_constraints = ON;
         INSERT INTO idem_records VALUES
           ('acct_9/charge', 'hand-edited', zeroblob(32), 'paused', 1, zeroblob(16), 1, 1,
            4102444800000, x'7b7d');",
    )
    .unwrap();
    let store = format!("sqlite://{}", path.display());
    let shown = bare(&["inspect", "acct_9/charge", "hand-edited", "--store", &store]);
    assert_ne!(shown.code, 0, "{shown:?}");
    let hash = Key::new("acct_9/charge", "hand-edited")
        .unwrap()
        .short_hash();
    assert!(
        shown.stdout.contains("does not decode") && shown.stdout.contains("'paused'"),
        "{shown:?}"
    );
    assert!(shown.stdout.contains("response       2 bytes"), "{shown:?}");
    assert!(shown.stderr.contains(&format!("#{hash}")), "{shown:?}");
    let json = bare(&[
        "inspect",
        "acct_9/charge",
        "hand-edited",
        "--json",
        "--store",
        &store,
    ]);
    let value: Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(value["decodes"], false);
    assert_eq!(value["stored"]["state"], "'paused'");
}

#[test]
fn a_missing_sqlite_file_is_not_created_except_by_migrate() {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("idem-cli-{}.db", Namespace::fresh().as_str()));
    let _ = std::fs::remove_file(&path);
    let url = format!("sqlite://{}", path.display());
    let missing = bare(&["stats", "--store", &url]);
    assert_eq!(missing.code, 6, "{missing:?}");
    assert!(missing.stderr.contains("idem migrate"), "{missing:?}");
    assert!(!path.exists(), "a typo must not create a database");
    let created = bare(&["migrate", "--store", &url]);
    assert_eq!(created.code, 0, "{created:?}");
    assert!(created.stdout.starts_with("created"), "{created:?}");
    assert!(path.exists());
    let again = bare(&["migrate", "--store", &url]);
    assert!(again.stdout.starts_with("migrated"), "{again:?}");
}

#[test]
fn an_unreachable_server_exits_1_without_showing_the_password() {
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    let down = bare(&["stats", "--store", "postgres://app:hunter2@127.0.0.1:1/db"]);
    assert_eq!(down.code, 1, "{down:?}");
    assert!(down.stderr.contains("could not reach"), "{down:?}");
    assert!(!down.stderr.contains("hunter2"), "{down:?}");
}

#[test]
fn a_server_that_says_no_exits_6() {
    let Some(url) = service_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let mut wrong = url::Url::parse(&url).expect("a URL");
    wrong.set_path("/no_such_database_for_idem");
    let refused = bare(&["stats", "--store", wrong.as_str()]);
    assert_eq!(refused.code, 6, "{refused:?}");
    assert!(
        refused.stderr.contains("refused the connection"),
        "{refused:?}"
    );
    assert!(
        refused.stderr.contains("no_such_database_for_idem"),
        "{refused:?}"
    );
}
