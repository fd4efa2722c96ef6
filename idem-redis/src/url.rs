//! Opening a store from a `redis://`, `rediss://` or `redis+cluster://` URL: this crate's
//! side of [`idem_core::connect`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::connect::{Backend, ConnectOptions, Create, Location, OpenError, UrlError};
use idem_core::{Admin, StoreError, store::Operation};
use redis::IntoConnectionInfo as _;
use url::Url;

use crate::layout::check_prefix;
use crate::{DEFAULT_PREFIX, PrefixError, RedisStore};

/// The URL schemes this crate opens: `redis+cluster://host:port,host:port` names any
/// nodes of a Redis Cluster.
///
/// ```
/// assert_eq!(idem_redis::URL_SCHEMES, ["redis", "rediss", "redis+cluster"]);
/// ```
pub const URL_SCHEMES: &[&str] = &["redis", "rediss", "redis+cluster"];

/// The backend's name in messages.
const NAME: &str = "Redis";

/// `redis://`, `rediss://` and `redis+cluster://` URLs, for
/// [`idem_core::connect::parse_url`]. The key prefix is
/// the prefix of the [`ConnectOptions`] (default `idem:`).
///
/// ```
/// use idem_core::connect::{self, ConnectOptions};
///
/// let location = connect::parse_url(
///     "redis+cluster://10.0.0.1:7001,10.0.0.2:7001",
///     &ConnectOptions::default().prefix("billing:"),
///     &[&idem_redis::BACKEND],
/// )?;
/// assert_eq!(
///     location.to_string(),
///     "Redis Cluster prefix \"billing:\" at redis://10.0.0.1:7001,redis://10.0.0.2:7001"
/// );
/// # Ok::<(), connect::UrlError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedisBackend;

/// The backend, for a program's list of backends (`&idem_redis::BACKEND`).
///
/// ```
/// use idem_core::connect::Backend;
///
/// assert_eq!(idem_redis::BACKEND.name(), "Redis");
/// ```
pub const BACKEND: RedisBackend = RedisBackend;

impl Backend for RedisBackend {
    fn schemes(&self) -> &'static [&'static str] {
        URL_SCHEMES
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn parse(&self, url: &str, options: &ConnectOptions) -> Result<Box<dyn Location>, UrlError> {
        Ok(Box::new(RedisLocation::parse(url, options)?))
    }
}

/// Why a Redis URL or its prefix was refused: the source of [`UrlError::Invalid`].
/// Never holds a password.
///
/// ```
/// use idem_core::connect::{ConnectOptions, UrlError};
/// use idem_redis::{RedisLocation, RedisUrlError};
///
/// let Err(UrlError::Invalid { source, .. }) = RedisLocation::parse("redis+cluster://", &ConnectOptions::default()) else {
///     panic!("a cluster needs a node");
/// };
/// assert!(matches!(source.downcast_ref(), Some(RedisUrlError::NoClusterNodes)));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisUrlError {
    /// Not a URL at all.
    #[error("not a valid URL ({0}); write it as redis://host:6379/0")]
    Malformed(#[from] url::ParseError),
    /// A URL of another scheme.
    #[error("a Redis URL starts with redis://, rediss:// or redis+cluster://, not {scheme}://")]
    NotRedis {
        /// The URL's scheme.
        scheme: String,
    },
    /// A URL the Redis client cannot use (a database that is not a number, `rediss://`
    /// in a build without TLS).
    #[error("{0}")]
    Unusable(#[source] redis::RedisError),
    /// `redis+cluster://` with no node after it.
    #[error(
        "a redis+cluster URL needs at least one host:port, as in redis+cluster://10.0.0.1:7001,10.0.0.2:7001"
    )]
    NoClusterNodes,
    /// A node of a `redis+cluster://` URL that is not `host:port` (a database number,
    /// say: a Cluster has only database 0).
    #[error("`{0}` is not a host:port for a redis+cluster URL")]
    BadClusterNode(String),
    /// The prefix option is not one the store accepts.
    #[error("the prefix option: {0}")]
    Prefix(#[from] PrefixError),
}

/// Where the records are: one server, or any nodes of a Cluster.
#[derive(Clone)]
enum Servers {
    Standalone(String),
    Cluster(Vec<String>),
}

/// A Redis server or Cluster a URL names, with the prefix option, checked but not
/// connected to.
///
/// ```
/// use idem_core::connect::{ConnectOptions, Location};
/// use idem_redis::RedisLocation;
///
/// let location = RedisLocation::parse("redis://127.0.0.1:6379/0", &ConnectOptions::default())?;
/// assert_eq!(location.prefix(), "idem:");
/// assert_eq!(location.backend(), "Redis");
/// # Ok::<(), idem_core::connect::UrlError>(())
/// ```
#[derive(Clone)]
pub struct RedisLocation {
    servers: Servers,
    /// The URL as messages show it: passwords replaced by `***`.
    shown: String,
    /// Checked by `check_prefix`.
    prefix: Option<String>,
    connect_timeout: Duration,
}

impl RedisLocation {
    /// Reads a Redis URL with the prefix option (Redis takes no table).
    ///
    /// ```
    /// use idem_core::connect::{ConnectOptions, UrlError};
    /// use idem_redis::RedisLocation;
    ///
    /// let refused = RedisLocation::parse("redis://127.0.0.1", &ConnectOptions::default().table("t"));
    /// assert!(matches!(refused, Err(UrlError::OptionDoesNotApply { option: "table", .. })));
    /// ```
    ///
    /// # Errors
    /// [`UrlError::OptionDoesNotApply`] for a table, and [`UrlError::Invalid`] with a
    /// [`RedisUrlError`] for a URL or a prefix the store cannot use.
    pub fn parse(url: &str, options: &ConnectOptions) -> Result<Self, UrlError> {
        if options.table.as_deref().is_some_and(|t| !t.is_empty()) {
            return Err(UrlError::OptionDoesNotApply {
                option: "table",
                backend: NAME,
            });
        }
        let invalid = |source: RedisUrlError| UrlError::Invalid {
            backend: NAME,
            source: source.into(),
        };
        if let Some(prefix) = &options.prefix {
            check_prefix(prefix).map_err(|err| invalid(err.into()))?;
        }
        let url = url.trim();
        let (servers, shown) = match url.split_once("://") {
            Some((scheme, nodes)) if scheme.eq_ignore_ascii_case("redis+cluster") => {
                let nodes = cluster_nodes(nodes).map_err(invalid)?;
                let shown = nodes
                    .iter()
                    .map(|node| without_password(node))
                    .collect::<Vec<_>>()
                    .join(",");
                (Servers::Cluster(nodes), shown)
            }
            _ => {
                let parsed = Url::parse(url).map_err(|err| invalid(err.into()))?;
                if !matches!(parsed.scheme(), "redis" | "rediss") {
                    return Err(invalid(RedisUrlError::NotRedis {
                        scheme: parsed.scheme().chars().take(40).collect(),
                    }));
                }
                // The client's own reading, so what it refuses is found before connecting.
                url.into_connection_info()
                    .map_err(|err| invalid(RedisUrlError::Unusable(err)))?;
                (Servers::Standalone(url.to_owned()), without_password(url))
            }
        };
        Ok(Self {
            servers,
            shown,
            prefix: options.prefix.clone(),
            connect_timeout: options.connect_timeout,
        })
    }

    /// The key prefix (default `idem:`).
    ///
    /// ```
    /// # use idem_core::connect::ConnectOptions;
    /// let options = ConnectOptions::default().prefix("billing:");
    /// let location = idem_redis::RedisLocation::parse("redis://cache.internal:6379", &options)?;
    /// assert_eq!(location.prefix(), "billing:");
    /// # Ok::<(), idem_core::connect::UrlError>(())
    /// ```
    pub fn prefix(&self) -> &str {
        self.prefix.as_deref().unwrap_or(DEFAULT_PREFIX)
    }

    /// Whether the URL names a Cluster (`redis+cluster://`).
    ///
    /// ```
    /// # use idem_core::connect::ConnectOptions;
    /// let location = idem_redis::RedisLocation::parse("redis+cluster://10.0.0.1:7001", &ConnectOptions::default())?;
    /// assert!(location.is_cluster());
    /// # Ok::<(), idem_core::connect::UrlError>(())
    /// ```
    pub fn is_cluster(&self) -> bool {
        matches!(self.servers, Servers::Cluster(_))
    }

    /// `connecting`, given up after the connect timeout.
    async fn within<T>(&self, connecting: impl Future<Output = T>) -> Result<T, OpenError> {
        tokio::time::timeout(self.connect_timeout, connecting)
            .await
            .map_err(|_| OpenError::Unreachable {
                location: self.to_string(),
                source: Box::new(idem_core::connect::NoAnswer(self.connect_timeout)),
            })
    }
}

/// The nodes of a `redis+cluster://` URL (what follows the scheme), each as a
/// `redis://host:port` URL the client reads.
fn cluster_nodes(nodes: &str) -> Result<Vec<String>, RedisUrlError> {
    let nodes = nodes
        .split(',')
        .map(str::trim)
        .filter(|node| !node.is_empty())
        .map(|node| {
            let single = format!("redis://{node}");
            match Url::parse(&single) {
                Ok(parsed)
                    if parsed.host().is_some()
                        && parsed.path().trim_matches('/').is_empty()
                        && single.as_str().into_connection_info().is_ok() =>
                {
                    Ok(single)
                }
                // Whatever is before an `@` may hold a password.
                _ => Err(RedisUrlError::BadClusterNode(match node.rsplit_once('@') {
                    Some((_, host)) => format!("***@{host}"),
                    None => node.to_owned(),
                })),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    if nodes.is_empty() {
        return Err(RedisUrlError::NoClusterNodes);
    }
    Ok(nodes)
}

/// `url` with any password replaced by `***`.
fn without_password(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(_) => url.to_owned(),
        Err(_) => "(an unreadable URL)".to_owned(),
    }
}

/// `Redis prefix "<prefix>" at <URL>`, or `Redis Cluster prefix "<prefix>" at <nodes>`,
/// without passwords.
impl fmt::Display for RedisLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} prefix {:?} at {}",
            self.backend(),
            self.prefix(),
            self.shown
        )
    }
}

/// As `Display`: never a password.
impl fmt::Debug for RedisLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[async_trait]
impl Location for RedisLocation {
    fn backend(&self) -> &'static str {
        match self.servers {
            Servers::Standalone(_) => "Redis",
            Servers::Cluster(_) => "Redis Cluster",
        }
    }

    /// Connects (a connection manager, or a Cluster connection) within the connect
    /// timeout. Redis has nothing to create.
    async fn open(&self, _create: Create) -> Result<Arc<dyn Admin>, OpenError> {
        let opened = match &self.servers {
            Servers::Standalone(url) => self.within(RedisStore::standalone(url)).await?,
            Servers::Cluster(nodes) => {
                self.within(RedisStore::cluster(nodes.iter().map(String::as_str)))
                    .await?
            }
        }
        .map_err(|err| OpenError::Unreachable {
            location: self.to_string(),
            source: err.into(),
        })?;
        let store = match &self.prefix {
            // Checked by parse; a refusal here would be a bug, reported as setup.
            Some(prefix) => opened.with_prefix(prefix).map_err(|err| {
                OpenError::Store(StoreError::Misconfigured {
                    operation: Operation::Setup,
                    source: err.into(),
                })
            })?,
            None => opened,
        };
        Ok(Arc::new(store))
    }

    /// Connects, which proves the address: Redis has no schema.
    async fn migrate(&self) -> Result<String, OpenError> {
        self.open(Create::Yes).await?;
        Ok(format!("nothing to migrate: {self} needs no schema"))
    }
}

#[cfg(test)]
mod tests {
    use idem_core::connect::parse_url;

    use super::*;

    fn parse(url: &str) -> Result<RedisLocation, UrlError> {
        RedisLocation::parse(url, &ConnectOptions::default())
    }

    /// The backend's own reason for refusing `url` with `options`.
    fn refusal(url: &str, options: ConnectOptions) -> RedisUrlError {
        match RedisLocation::parse(url, &options) {
            Err(UrlError::Invalid { backend, source }) => {
                assert_eq!(backend, "Redis");
                *source.downcast().expect("a RedisUrlError")
            }
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn every_scheme_parses() {
        let options = ConnectOptions::default();
        let standalone = parse_url("redis://127.0.0.1:6379/0", &options, &[&BACKEND]).unwrap();
        assert_eq!(standalone.backend(), "Redis");
        assert_eq!(
            standalone.to_string(),
            "Redis prefix \"idem:\" at redis://127.0.0.1:6379/0"
        );
        let cluster = parse_url(
            "redis+cluster://127.0.0.1:7001, 127.0.0.1:7002",
            &options,
            &[&BACKEND],
        )
        .unwrap();
        assert_eq!(cluster.backend(), "Redis Cluster");
        assert_eq!(
            cluster.to_string(),
            "Redis Cluster prefix \"idem:\" at redis://127.0.0.1:7001,redis://127.0.0.1:7002"
        );
        assert!(
            parse("REDIS+CLUSTER://127.0.0.1:7001")
                .unwrap()
                .is_cluster()
        );
        assert!(!parse("redis://127.0.0.1:7001").unwrap().is_cluster());
        // rediss:// is a Redis URL; the client refuses it in a build without TLS.
        match RedisLocation::parse("rediss://127.0.0.1", &options) {
            Ok(location) => assert_eq!(location.backend(), "Redis"),
            Err(UrlError::Invalid { source, .. }) => assert!(matches!(
                source.downcast_ref(),
                Some(RedisUrlError::Unusable(_))
            )),
            Err(other) => panic!("{other}"),
        }
        let prefixed = ConnectOptions::default().prefix("billing:");
        assert_eq!(
            RedisLocation::parse("redis://h", &prefixed)
                .unwrap()
                .prefix(),
            "billing:"
        );
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        let none = ConnectOptions::default;
        assert!(matches!(
            refusal("redis+cluster://", none()),
            RedisUrlError::NoClusterNodes
        ));
        assert!(matches!(
            refusal("redis+cluster:// , ", none()),
            RedisUrlError::NoClusterNodes
        ));
        assert!(matches!(
            refusal("redis+cluster://127.0.0.1:7001/3", none()),
            RedisUrlError::BadClusterNode(node) if node == "127.0.0.1:7001/3"
        ));
        assert!(matches!(
            refusal("redis://[::1", none()),
            RedisUrlError::Malformed(_)
        ));
        assert!(matches!(
            refusal("memcached://h", none()),
            RedisUrlError::NotRedis { scheme } if scheme == "memcached"
        ));
        assert!(matches!(
            refusal("redis://h/not-a-number", none()),
            RedisUrlError::Unusable(_)
        ));
        assert!(matches!(
            refusal("redis://h", none().prefix("app{1}")),
            RedisUrlError::Prefix(PrefixError::Braces)
        ));
    }

    #[test]
    fn the_backend_is_named_for_messages() {
        assert_eq!(BACKEND.name(), "Redis");
        assert_eq!(BACKEND.schemes(), URL_SCHEMES);
    }

    #[test]
    fn flags_must_fit_the_backend() {
        for url in ["redis://127.0.0.1", "redis+cluster://127.0.0.1:7001"] {
            assert!(matches!(
                RedisLocation::parse(url, &ConnectOptions::default().table("t")),
                Err(UrlError::OptionDoesNotApply {
                    option: "table",
                    backend: "Redis"
                })
            ));
            // An exported but empty table option names no table.
            assert!(RedisLocation::parse(url, &ConnectOptions::default().table("")).is_ok());
        }
    }

    #[test]
    fn passwords_never_show() {
        for url in [
            "redis://:hunter2@127.0.0.1:6379",
            "redis+cluster://:hunter2@127.0.0.1:7001",
        ] {
            let location = parse(url).unwrap();
            for shown in [location.to_string(), format!("{location:?}")] {
                assert!(!shown.contains("hunter2"), "{shown}");
                assert!(shown.contains("***"), "{shown}");
            }
        }
        let bad = refusal(
            "redis+cluster://:hunter2@127.0.0.1:7001/3",
            ConnectOptions::default(),
        );
        assert!(!bad.to_string().contains("hunter2"), "{bad}");
    }

    #[tokio::test]
    async fn an_unreachable_server_is_unreachable() {
        // Port 1 on loopback: nothing listens there. The client retries a refused
        // connection for seconds; the connect timeout ends that sooner.
        let options = ConnectOptions::default().connect_timeout(Duration::from_millis(500));
        let location = RedisLocation::parse("redis://:hunter2@127.0.0.1:1", &options).unwrap();
        let err = location.open(Create::No).await.map(|_| ()).unwrap_err();
        assert!(matches!(err, OpenError::Unreachable { .. }), "{err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
}
