//! Each backend the binary is pointed at: SQLite always, the servers when their URL is
//! set (none otherwise, and the case passes without running).

use std::sync::Arc;
use std::time::Duration;

use idem_dynamodb::DynamoDbStore;
use idem_dynamodb::aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use idem_dynamodb::aws_sdk_dynamodb::types::TimeToLiveSpecification;
use idem_postgres::PostgresStore;
use idem_postgres::sqlx::postgres::PgPoolOptions;
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;
use idem_testkit::{Namespace, service_url};
use tokio::runtime::Runtime;

use crate::support::Backend;

pub(crate) fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub(crate) fn sqlite() -> Option<Backend> {
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

pub(crate) fn postgres() -> Option<Backend> {
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

pub(crate) fn redis_standalone() -> Option<Backend> {
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

pub(crate) fn redis_cluster() -> Option<Backend> {
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

pub(crate) fn dynamodb() -> Option<Backend> {
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
