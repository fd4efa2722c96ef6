//! Setting up each backend twice: idem and the raw baseline, plus the same pair wired for
//! counting round trips (through a counting proxy, or counting calls in process).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use idem_core::MemoryStore;
use idem_dynamodb::DynamoDbStore;
use idem_postgres::PostgresStore;
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;
use sqlx::postgres::PgPoolOptions;

use crate::counting::CountingStore;
use crate::proxy::{CountingProxy, POSTGRES_SYNC};
use crate::raw::PlainLoop;
use crate::raw::{
    dynamodb::RawDynamoDb, memory::RawMemory, postgres::RawPostgres, redis::RawRedis,
    sqlite::RawSqlite,
};
use crate::server::{PostgresClock, ProcessClock, RedisClock, ServerClock};
use crate::target::{BoxError, IdemTarget, Target};

/// A target and how to read how many round trips (or store calls) it has made.
pub(crate) struct Counted {
    pub(crate) target: Arc<dyn Target>,
    pub(crate) trips: Box<dyn Fn() -> u64 + Send + Sync>,
    /// Bytes on the wire so far (client to server, server to client), when proxied.
    pub(crate) bytes: Option<Arc<CountingProxy>>,
}

/// One backend, ready to measure.
pub(crate) struct Backend {
    pub(crate) name: &'static str,
    /// What a "trip" is here: a network round trip, or an in-process store call.
    pub(crate) trip_unit: &'static str,
    pub(crate) idem: Arc<dyn Target>,
    pub(crate) raw: Arc<dyn Target>,
    pub(crate) idem_counted: Counted,
    pub(crate) raw_counted: Counted,
    /// The server's own accounting of its time, where it has one.
    pub(crate) server: Option<Arc<dyn ServerClock>>,
    /// The CPU of the server's processes, for everything the engine's figure leaves out
    /// (protocol, transactions, the event loop).
    pub(crate) server_cpu: Option<Arc<ProcessClock>>,
    /// The raw replay in a bare loop, to check the harness against.
    pub(crate) plain: Option<Arc<dyn PlainLoop>>,
    /// Keeps the counting proxies running.
    pub(crate) _proxies: Vec<Arc<CountingProxy>>,
}

fn calls(counter: &Arc<AtomicU64>) -> Box<dyn Fn() -> u64 + Send + Sync> {
    let counter = Arc::clone(counter);
    Box::new(move || counter.load(Ordering::Relaxed))
}

fn proxied(proxy: &Arc<CountingProxy>) -> Box<dyn Fn() -> u64 + Send + Sync> {
    let proxy = Arc::clone(proxy);
    Box::new(move || proxy.round_trips())
}

/// The `127.0.0.1:port` inside a service URL; only loopback servers are benchmarked.
fn loopback_addr(url: &str) -> Result<SocketAddr, BoxError> {
    let start = url
        .find("127.0.0.1:")
        .ok_or("the service URL must point at 127.0.0.1")?;
    let rest = &url[start + "127.0.0.1:".len()..];
    let port: u16 = rest
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()?;
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

fn through(url: &str, proxy: &CountingProxy) -> Result<String, BoxError> {
    let upstream = loopback_addr(url)?;
    Ok(url.replacen(&upstream.to_string(), &proxy.addr.to_string(), 1))
}

async fn proxy_for(url: &str) -> Result<Arc<CountingProxy>, BoxError> {
    Ok(Arc::new(
        CountingProxy::start(loopback_addr(url)?, None).await?,
    ))
}

pub(crate) async fn memory() -> Result<Backend, BoxError> {
    let idem_calls = Arc::new(AtomicU64::new(0));
    let counted_raw = RawMemory::new();
    let counted_raw_calls = Arc::clone(&counted_raw.calls);
    Ok(Backend {
        name: "memory",
        trip_unit: "store calls",
        idem: Arc::new(IdemTarget::new(MemoryStore::new())),
        raw: Arc::new(RawMemory::new()),
        idem_counted: Counted {
            target: Arc::new(IdemTarget::new(CountingStore::new(
                MemoryStore::new(),
                Arc::clone(&idem_calls),
            ))),
            trips: calls(&idem_calls),
            bytes: None,
        },
        raw_counted: Counted {
            target: Arc::new(counted_raw),
            trips: calls(&counted_raw_calls),
            bytes: None,
        },
        server: None,
        server_cpu: None,
        plain: None,
        _proxies: Vec::new(),
    })
}

pub(crate) async fn sqlite(dir: &std::path::Path) -> Result<Backend, BoxError> {
    let path = |name: &str| -> PathBuf { dir.join(name) };
    let idem_calls = Arc::new(AtomicU64::new(0));
    let counted_raw = RawSqlite::open(&path("raw-counted.db"))?;
    let counted_raw_calls = Arc::clone(&counted_raw.calls);
    Ok(Backend {
        name: "sqlite",
        trip_unit: "store calls",
        idem: Arc::new(IdemTarget::new(SqliteStore::open(path("idem.db"))?)),
        raw: Arc::new(RawSqlite::open(&path("raw.db"))?),
        idem_counted: Counted {
            target: Arc::new(IdemTarget::new(CountingStore::new(
                SqliteStore::open(path("idem-counted.db"))?,
                Arc::clone(&idem_calls),
            ))),
            trips: calls(&idem_calls),
            bytes: None,
        },
        raw_counted: Counted {
            target: Arc::new(counted_raw),
            trips: calls(&counted_raw_calls),
            bytes: None,
        },
        server: None,
        server_cpu: None,
        plain: None,
        _proxies: Vec::new(),
    })
}

pub(crate) async fn pg_pool(url: &str) -> Result<sqlx::PgPool, BoxError> {
    // No health-check query before each acquire: it would be one more round trip per call.
    Ok(PgPoolOptions::new()
        .max_connections(16)
        .test_before_acquire(false)
        .connect(url)
        .await?)
}

/// A PostgreSQL store on `table`, dropped and created again: every run starts empty.
pub(crate) async fn fresh_pg_store(
    pool: sqlx::PgPool,
    table: &str,
) -> Result<PostgresStore, BoxError> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
        .execute(&pool)
        .await?;
    let store = PostgresStore::builder(pool).table(table)?.build();
    store.migrate().await?;
    Ok(store)
}

async fn pg_idem(url: &str, table: &str) -> Result<Arc<dyn Target>, BoxError> {
    let store = fresh_pg_store(pg_pool(url).await?, table).await?;
    Ok(Arc::new(IdemTarget::new(store)))
}

pub(crate) async fn postgres(url: &str) -> Result<Backend, BoxError> {
    let upstream = loopback_addr(url)?;
    let idem_proxy = Arc::new(CountingProxy::start(upstream, Some(POSTGRES_SYNC)).await?);
    let raw_proxy = Arc::new(CountingProxy::start(upstream, Some(POSTGRES_SYNC)).await?);
    let raw = Arc::new(RawPostgres::new(pg_pool(url).await?, "idem_bench_raw").await?);
    let server = PostgresClock::new(pg_pool(url).await?)
        .await
        .map(|clock| Arc::new(clock) as Arc<dyn ServerClock>);
    Ok(Backend {
        name: "postgres",
        trip_unit: "round trips",
        idem: pg_idem(url, "idem_bench").await?,
        raw: Arc::clone(&raw) as Arc<dyn Target>,
        idem_counted: Counted {
            target: pg_idem(&through(url, &idem_proxy)?, "idem_bench_counted").await?,
            trips: proxied(&idem_proxy),
            bytes: Some(Arc::clone(&idem_proxy)),
        },
        raw_counted: Counted {
            target: Arc::new(
                RawPostgres::new(
                    pg_pool(&through(url, &raw_proxy)?).await?,
                    "idem_bench_raw_counted",
                )
                .await?,
            ),
            trips: proxied(&raw_proxy),
            bytes: Some(Arc::clone(&raw_proxy)),
        },
        server,
        server_cpu: Some(Arc::new(ProcessClock::new(vec![
            "postgres".into(),
            format!("port={}", upstream.port()),
        ]))),
        plain: Some(raw),
        _proxies: vec![idem_proxy, raw_proxy],
    })
}

async fn redis_idem(url: &str, prefix: &str) -> Result<Arc<dyn Target>, BoxError> {
    Ok(Arc::new(IdemTarget::new(
        RedisStore::standalone(url).await?.with_prefix(prefix)?,
    )))
}

async fn redis_manager(url: &str) -> Result<redis::aio::ConnectionManager, BoxError> {
    Ok(redis::aio::ConnectionManager::new(redis::Client::open(url)?).await?)
}

async fn redis_raw(url: &str, prefix: &str) -> Result<Arc<RawRedis>, BoxError> {
    Ok(Arc::new(RawRedis::new(
        redis_manager(url).await?,
        prefix.to_owned(),
    )))
}

pub(crate) async fn redis(url: &str) -> Result<Backend, BoxError> {
    let run = std::process::id();
    let idem_proxy = proxy_for(url).await?;
    let raw_proxy = proxy_for(url).await?;
    let raw = redis_raw(url, &format!("bench:{run}:raw:")).await?;
    Ok(Backend {
        name: "redis",
        trip_unit: "round trips",
        idem: redis_idem(url, &format!("bench:{run}:idem:")).await?,
        raw: Arc::clone(&raw) as Arc<dyn Target>,
        idem_counted: Counted {
            target: redis_idem(
                &through(url, &idem_proxy)?,
                &format!("bench:{run}:idem-counted:"),
            )
            .await?,
            trips: proxied(&idem_proxy),
            bytes: Some(Arc::clone(&idem_proxy)),
        },
        raw_counted: Counted {
            target: redis_raw(
                &through(url, &raw_proxy)?,
                &format!("bench:{run}:raw-counted:"),
            )
            .await?,
            trips: proxied(&raw_proxy),
            bytes: Some(Arc::clone(&raw_proxy)),
        },
        server: Some(Arc::new(RedisClock {
            connection: redis_manager(url).await?,
        })),
        server_cpu: Some(Arc::new(ProcessClock::new(vec![
            "redis-server".into(),
            loopback_addr(url)?.to_string(),
        ]))),
        plain: Some(raw),
        _proxies: vec![idem_proxy, raw_proxy],
    })
}

pub(crate) fn dynamodb_client(endpoint: &str) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::from_conf(dynamodb_config(endpoint))
}

/// The client configuration for DynamoDB Local at `endpoint`.
pub(crate) fn dynamodb_config(endpoint: &str) -> aws_sdk_dynamodb::Config {
    aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("bench", "bench", None, None, "idem-bench"))
        .build()
}

async fn dynamodb_pair(
    endpoint: &str,
    prefix: &str,
) -> Result<(Arc<dyn Target>, Arc<dyn Target>), BoxError> {
    let client = dynamodb_client(endpoint);
    idem_dynamodb::create_table(&client, "idem_bench").await?;
    idem_dynamodb::create_table(&client, "idem_bench_raw").await?;
    let store = DynamoDbStore::builder(client.clone(), "idem_bench")?
        .prefix(prefix)?
        .build();
    let raw = RawDynamoDb::new(client, "idem_bench_raw".into(), prefix.to_owned());
    Ok((Arc::new(IdemTarget::new(store)), Arc::new(raw)))
}

pub(crate) async fn dynamodb(endpoint: &str) -> Result<Backend, BoxError> {
    let run = std::process::id();
    let idem_proxy = proxy_for(endpoint).await?;
    let raw_proxy = proxy_for(endpoint).await?;
    let (idem, raw) = dynamodb_pair(endpoint, &format!("{run}#")).await?;
    let (idem_counted, _) =
        dynamodb_pair(&through(endpoint, &idem_proxy)?, &format!("{run}#counted#")).await?;
    let (_, raw_counted) =
        dynamodb_pair(&through(endpoint, &raw_proxy)?, &format!("{run}#counted#")).await?;
    // Table setup went through the proxies too: the counting pass measures deltas.
    Ok(Backend {
        name: "dynamodb",
        trip_unit: "round trips",
        idem,
        raw,
        idem_counted: Counted {
            target: idem_counted,
            trips: proxied(&idem_proxy),
            bytes: Some(Arc::clone(&idem_proxy)),
        },
        raw_counted: Counted {
            target: raw_counted,
            trips: proxied(&raw_proxy),
            bytes: Some(Arc::clone(&raw_proxy)),
        },
        // DynamoDB Local keeps no statistics: the CPU of the Java process serving this port.
        server: None,
        server_cpu: Some(Arc::new(ProcessClock::new(vec![
            "DynamoDBLocal.jar".into(),
            format!("-port {}", loopback_addr(endpoint)?.port()),
        ]))),
        plain: None,
        _proxies: vec![idem_proxy, raw_proxy],
    })
}

/// The HTTP layer (on the memory store) against the bare handler, over loopback HTTP.
pub(crate) async fn http() -> Result<Backend, BoxError> {
    let (layered, bare) = crate::http::targets().await?;
    let (layered_requests, bare_requests) =
        (Arc::clone(&layered.requests), Arc::clone(&bare.requests));
    let (layered, bare): (Arc<dyn Target>, Arc<dyn Target>) = (layered, bare);
    Ok(Backend {
        name: "http",
        trip_unit: "HTTP request",
        idem: Arc::clone(&layered),
        raw: Arc::clone(&bare),
        idem_counted: Counted {
            target: layered,
            trips: calls(&layered_requests),
            bytes: None,
        },
        raw_counted: Counted {
            target: bare,
            trips: calls(&bare_requests),
            bytes: None,
        },
        server: None,
        server_cpu: None,
        plain: None,
        _proxies: Vec::new(),
    })
}
