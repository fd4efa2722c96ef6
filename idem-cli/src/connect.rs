//! Opening the store a [`Target`] names, and migrating it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::Admin;
use idem_dynamodb::DynamoDbStore;
use idem_dynamodb::aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use idem_dynamodb::aws_sdk_dynamodb::{self, Client};
use idem_postgres::PostgresStore;
use idem_postgres::sqlx::postgres::{PgConnection, PgPoolOptions};
use idem_postgres::sqlx::{self, Connection as _};
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;

use crate::failure::Failure;
use crate::target::Target;

/// How long connecting may take before the command gives up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// An open store, with the admin side every backend has.
pub(crate) type OpenStore = Arc<dyn Admin>;

/// Whether opening may create what is missing (only `idem migrate` may).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Create {
    No,
    Yes,
}

/// Opens the store `target` names. Creates nothing unless `create` says so (a mistyped
/// SQLite path must not become an empty database that reports zero records).
pub(crate) async fn open(target: &Target, create: Create) -> Result<OpenStore, Failure> {
    let store = Failure::store(target);
    match target {
        Target::Sqlite { path } => {
            if create == Create::No && !path.exists() {
                return Err(Failure::NoDatabase {
                    path: path.display().to_string(),
                });
            }
            Ok(Arc::new(SqliteStore::open(path).map_err(store)?))
        }
        Target::Postgres { url, table } => Ok(Arc::new(
            postgres_store(target, url, table.as_deref(), 2).await?,
        )),
        Target::Redis { url, prefix } => {
            let opened = within(target, RedisStore::standalone(url))
                .await?
                .map_err(|err| unreachable(target, err))?;
            Ok(Arc::new(redis_prefix(opened, prefix.as_deref())?))
        }
        Target::RedisCluster { nodes, prefix } => {
            let opened = within(
                target,
                RedisStore::cluster(nodes.iter().map(String::as_str)),
            )
            .await?
            .map_err(|err| unreachable(target, err))?;
            Ok(Arc::new(redis_prefix(opened, prefix.as_deref())?))
        }
        Target::DynamoDb {
            table,
            prefix,
            region,
            endpoint,
        } => {
            let client = dynamodb_client(region.as_deref(), endpoint.as_deref())?;
            let builder = DynamoDbStore::builder(client, table).map_err(|err| Failure::Usage {
                what: format!("the DynamoDB table name: {err}"),
            })?;
            let builder = match prefix {
                Some(prefix) => builder.prefix(prefix).map_err(|err| Failure::Usage {
                    what: format!("--prefix: {err}"),
                })?,
                None => builder,
            };
            Ok(Arc::new(builder.build()))
        }
    }
}

/// Creates or upgrades what the store needs, and says what it did.
pub(crate) async fn migrate(target: &Target) -> Result<String, Failure> {
    let store = Failure::store(target);
    match target {
        Target::Sqlite { path } => {
            let existed = path.exists();
            // Opening creates the file and brings its schema up to date.
            open(target, Create::Yes).await?;
            Ok(format!(
                "{} {target}: schema version {}",
                if existed { "migrated" } else { "created" },
                idem_sqlite::SCHEMA_VERSION
            ))
        }
        Target::Postgres { url, table } => {
            let opened = postgres_store(target, url, table.as_deref(), 1).await?;
            opened.migrate().await.map_err(store)?;
            Ok(format!(
                "migrated {target}: the table and its indexes are in place"
            ))
        }
        Target::Redis { .. } | Target::RedisCluster { .. } => {
            // Connecting proves the address; Redis has no schema.
            open(target, Create::Yes).await?;
            Ok(format!("nothing to migrate: {target} needs no schema"))
        }
        Target::DynamoDb {
            table,
            region,
            endpoint,
            ..
        } => {
            let client = dynamodb_client(region.as_deref(), endpoint.as_deref())?;
            idem_dynamodb::create_table(&client, table)
                .await
                .map_err(store)?;
            Ok(format!(
                "{target} is active, with TTL on attribute `{}`",
                idem_dynamodb::attributes::TTL
            ))
        }
    }
}

/// The PostgreSQL store on `table` (the default when `None`) over a pool of
/// `connections`. The table name is checked before anything connects, and one plain
/// connection proves the server answers (a pool retries a refused connection until its
/// timeout; a single attempt says why at once).
async fn postgres_store(
    target: &Target,
    url: &str,
    table: Option<&str>,
    connections: u32,
) -> Result<PostgresStore, Failure> {
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .connect_lazy(url)
        .map_err(|err| Failure::Usage {
            what: format!("the PostgreSQL URL: {err}"),
        })?;
    let mut builder = PostgresStore::builder(pool);
    if let Some(table) = table {
        builder = builder.table(table).map_err(|err| Failure::Usage {
            what: format!("--table: {err}"),
        })?;
    }
    let probe = within(target, PgConnection::connect(url))
        .await?
        .map_err(|err| match err {
            // The server answered, and said no: a retry will not help.
            sqlx::Error::Database(_) | sqlx::Error::Configuration(_) => Failure::Rejected {
                target: target.to_string(),
                source: Box::new(err),
            },
            err => unreachable(target, err),
        })?;
    let _ = probe.close().await;
    Ok(builder.build())
}

fn redis_prefix(store: RedisStore, prefix: Option<&str>) -> Result<RedisStore, Failure> {
    match prefix {
        Some(prefix) => store.with_prefix(prefix).map_err(|err| Failure::Usage {
            what: format!("--prefix: {err}"),
        }),
        None => Ok(store),
    }
}

async fn within<T>(target: &Target, connecting: impl Future<Output = T>) -> Result<T, Failure> {
    tokio::time::timeout(CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| Failure::Unreachable {
            target: target.to_string(),
            source: format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()).into(),
        })
}

fn unreachable(target: &Target, err: impl std::error::Error + Send + Sync + 'static) -> Failure {
    Failure::Unreachable {
        target: target.to_string(),
        source: Box::new(err),
    }
}

/// A DynamoDB client from the URL and the standard AWS environment variables.
fn dynamodb_client(region: Option<&str>, endpoint: Option<&str>) -> Result<Client, Failure> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let region = region
        .map(str::to_owned)
        .or_else(|| env("AWS_REGION"))
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .ok_or_else(|| Failure::Usage {
            what: "no AWS region: add ?region=... to the dynamodb URL or set AWS_REGION".into(),
        })?;
    let (Some(id), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) else {
        return Err(Failure::Usage {
            what: "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), for example with `eval \"$(aws configure export-credentials --format env)\"`".into(),
        });
    };
    let credentials = Credentials::new(id, secret, env("AWS_SESSION_TOKEN"), None, "environment");
    let timeouts = aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(5))
        .operation_attempt_timeout(Duration::from_secs(30))
        .build();
    let mut config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region))
        .credentials_provider(credentials)
        .timeout_config(timeouts);
    if let Some(endpoint) = endpoint {
        config = config.endpoint_url(endpoint);
    }
    Ok(Client::from_conf(config.build()))
}
