//! The durable servers a chaos run targets, stores over them, and their crashes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use idem_core::Store;
use idem_dynamodb::aws_sdk_dynamodb::config::retry::RetryConfig;
use idem_dynamodb::aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use idem_dynamodb::aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use idem_dynamodb::aws_sdk_dynamodb::{Client, Config};

use crate::proxy::FaultProxy;
use crate::run::BoxError;

/// A server backend a chaos run targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// PostgreSQL with fsync on, crashed by an immediate shutdown.
    Postgres,
    /// Redis with an append-only file, killed with SIGKILL.
    Redis,
    /// DynamoDB Local on a database file, killed with SIGKILL.
    DynamoDb,
}

impl Backend {
    /// Every backend, in the order runs go.
    pub const ALL: [Backend; 3] = [Backend::Postgres, Backend::Redis, Backend::DynamoDb];

    /// The backend named `name` (`postgres`, `redis`, `dynamodb`).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|backend| backend.name() == name)
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Redis => "redis",
            Backend::DynamoDb => "dynamodb",
        }
    }

    /// The services script's name for its durable server.
    pub fn service(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres-durable",
            Backend::Redis => "redis-durable",
            Backend::DynamoDb => "dynamodb-durable",
        }
    }

    /// The environment variable holding the durable server's address.
    pub fn variable(self) -> &'static str {
        match self {
            Backend::Postgres => "IDEM_CHAOS_POSTGRES_URL",
            Backend::Redis => "IDEM_CHAOS_REDIS_URL",
            Backend::DynamoDb => "IDEM_CHAOS_DYNAMODB_ENDPOINT",
        }
    }

    /// The server's address, from [`Backend::variable`].
    ///
    /// # Errors
    /// When the variable is unset or its address is not on loopback.
    pub fn url(self) -> Result<String, BoxError> {
        let url = std::env::var(self.variable()).map_err(|_| {
            format!(
                "{} is unset: eval \"$(scripts/services.sh start {})\"",
                self.variable(),
                self.service()
            )
        })?;
        address(&url)?;
        Ok(url)
    }

    /// A store over the server at `url`, reached at `through` (the proxy) when given,
    /// keeping its records under `namespace`. Set up (schema, table) on the direct path.
    ///
    /// # Errors
    /// When the server cannot be reached or set up.
    pub async fn store(
        self,
        url: &str,
        through: Option<SocketAddr>,
        namespace: &str,
    ) -> Result<Arc<dyn Store>, BoxError> {
        self.store_with(url, through, namespace, None).await
    }

    /// As [`Backend::store`], for the linearizability checker: DynamoDB's takeovers wait
    /// for a lease's end and no skew margin past it, as the state machine says, and its
    /// client makes each call once (no SDK retries).
    ///
    /// # Errors
    /// When the server cannot be reached or set up.
    pub async fn checked_store(
        self,
        url: &str,
        through: Option<SocketAddr>,
        namespace: &str,
    ) -> Result<Arc<dyn Store>, BoxError> {
        self.store_with(url, through, namespace, Some(Duration::ZERO))
            .await
    }

    async fn store_with(
        self,
        url: &str,
        through: Option<SocketAddr>,
        namespace: &str,
        skew_margin: Option<Duration>,
    ) -> Result<Arc<dyn Store>, BoxError> {
        let url = match through {
            Some(proxy) => url.replace(&address(url)?.to_string(), &proxy.to_string()),
            None => url.to_owned(),
        };
        Ok(match self {
            Backend::Postgres => {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(16)
                    .acquire_timeout(Duration::from_secs(3))
                    // A connection the proxy cut or the server lost is found before use.
                    .test_before_acquire(true)
                    .connect_lazy(&url)?;
                let store = idem_postgres::PostgresStore::builder(pool)
                    .table(namespace)?
                    .build();
                if through.is_none() {
                    store.migrate().await?;
                }
                Arc::new(store)
            }
            Backend::Redis => {
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_response_timeout(Some(Duration::from_secs(2)))
                    .set_connection_timeout(Some(Duration::from_secs(1)))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(200));
                Arc::new(
                    idem_redis::RedisStore::standalone_with_config(&url, config)
                        .await?
                        .with_prefix(namespace)?,
                )
            }
            Backend::DynamoDb => {
                let mut client = dynamodb_client(&url);
                if skew_margin.is_some() {
                    // The checker holds each call to one effect. The SDK's own retries
                    // apply a write twice, and a checkpoint or a release whose first try
                    // landed then answers as the second try finds the item: `Fenced`
                    // after a takeover in between. Off here, a lost answer is an error.
                    client = Client::from_conf(
                        client
                            .config()
                            .to_builder()
                            .retry_config(RetryConfig::disabled())
                            .build(),
                    );
                }
                if through.is_none() {
                    idem_dynamodb::create_table(&client, namespace).await?;
                }
                let mut store = idem_dynamodb::DynamoDbStore::builder(client, namespace)?;
                if let Some(margin) = skew_margin {
                    store = store.skew_margin(margin);
                }
                Arc::new(store.build())
            }
        })
    }
}

fn dynamodb_client(endpoint: &str) -> Client {
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(1))
        .operation_attempt_timeout(Duration::from_secs(2))
        .operation_timeout(Duration::from_secs(5))
        .build();
    let config = Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("chaos", "chaos", None, None, "idem-chaos"))
        .timeout_config(timeouts)
        .build();
    Client::from_conf(config)
}

/// The loopback `host:port` of a server URL.
///
/// # Errors
/// When the URL names no port or an address off loopback.
pub fn address(url: &str) -> Result<SocketAddr, BoxError> {
    let rest = url.split("://").nth(1).ok_or("a URL without a scheme")?;
    let host_port = rest.split('/').next().unwrap_or(rest);
    let host_port = host_port.rsplit('@').next().unwrap_or(host_port);
    let addr: SocketAddr = host_port
        .parse()
        .map_err(|_| format!("{host_port} is not an IP address and port"))?;
    if !addr.ip().is_loopback() {
        return Err(format!("{addr} is not on loopback: chaos runs only target 127.0.0.1").into());
    }
    Ok(addr)
}

/// The project's services script.
fn services_script() -> PathBuf {
    std::env::var_os("IDEM_SERVICES_SCRIPT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/services.sh"),
        PathBuf::from,
    )
}

/// The longest `scripts/services.sh` may take to crash or revive a server.
pub const SERVICES_TIMEOUT: Duration = Duration::from_secs(180);

/// Crashes `backend`'s durable server, cuts every connection through `proxy`, and revives
/// the server on the data it had after a short outage.
///
/// # Errors
/// When `scripts/services.sh` fails or takes over three minutes.
pub async fn crash_and_revive_once(backend: Backend, proxy: &FaultProxy) -> Result<(), BoxError> {
    services("crash", backend.service()).await?;
    proxy.cut_all();
    tokio::time::sleep(Duration::from_millis(300)).await;
    services("revive", backend.service()).await
}

/// Runs `scripts/services.sh COMMAND SERVICE`, bounded by [`SERVICES_TIMEOUT`].
///
/// # Errors
/// When the script fails or takes longer.
pub async fn services(command: &str, service: &str) -> Result<(), BoxError> {
    let output = tokio::process::Command::new("bash")
        .arg(services_script())
        .args([command, service])
        .kill_on_drop(true)
        .output();
    // A revival waits for the server to answer; one that never does must not hang the run.
    let output = tokio::time::timeout(SERVICES_TIMEOUT, output)
        .await
        .map_err(|_| format!("services.sh {command} {service} took over {SERVICES_TIMEOUT:?}"))??;
    if !output.status.success() {
        return Err(format!(
            "services.sh {command} {service} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_loopback_only() {
        assert_eq!(
            address("postgres://postgres@127.0.0.1:55433/postgres").unwrap(),
            "127.0.0.1:55433".parse().unwrap()
        );
        assert_eq!(address("redis://127.0.0.1:56380").unwrap().port(), 56380);
        assert!(address("postgres://db.example.com:5432/x").is_err());
        assert!(address("redis://10.0.0.1:6379").is_err());
    }
}
