//! Which store a URL names, checked before anything connects.

use std::fmt;
use std::path::PathBuf;

use url::Url;

/// A store the command can open.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Sqlite {
        path: PathBuf,
    },
    Postgres {
        url: String,
        table: Option<String>,
    },
    Redis {
        url: String,
        prefix: Option<String>,
    },
    RedisCluster {
        nodes: Vec<String>,
        prefix: Option<String>,
    },
    DynamoDb {
        table: String,
        region: Option<String>,
        endpoint: Option<String>,
        prefix: Option<String>,
    },
}

/// Why a store URL or its flags were refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum TargetError {
    #[error("no store given: pass --store URL or set IDEM_STORE (see `idem --help`)")]
    Missing,
    #[error(
        "`{0}` is not a store URL this command knows: use sqlite://, postgres://, redis://, redis+cluster:// or dynamodb://"
    )]
    UnknownScheme(String),
    #[error("the store URL is not a valid URL: {0}")]
    Malformed(#[from] url::ParseError),
    #[error("a sqlite URL needs a file path, as in sqlite:///var/lib/app/idem.db")]
    NoSqlitePath,
    #[error("a sqlite URL takes no query (`?...`); name the file only")]
    SqliteQuery,
    #[error(
        "a redis+cluster URL needs at least one host:port, as in redis+cluster://10.0.0.1:7001,10.0.0.2:7001"
    )]
    NoClusterNodes,
    #[error("`{0}` is not a host:port for a redis+cluster URL")]
    BadClusterNode(String),
    #[error("a dynamodb URL needs a table name, as in dynamodb://idem?region=eu-west-1")]
    NoDynamoTable,
    #[error("`{0}` is not a parameter of a dynamodb URL: use region, endpoint")]
    UnknownDynamoParameter(String),
    #[error("--{flag} (or IDEM_{}) does not apply to {scheme} stores", flag.to_ascii_uppercase())]
    FlagDoesNotApply {
        flag: &'static str,
        scheme: &'static str,
    },
}

impl Target {
    /// The store `url` names, with the `--table` and `--prefix` flags it takes.
    pub(crate) fn parse(
        url: Option<&str>,
        table: Option<&str>,
        prefix: Option<&str>,
    ) -> Result<Self, TargetError> {
        let url = url
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .ok_or(TargetError::Missing)?;
        // An empty IDEM_TABLE (exported, then cleared) means none; no table is named "".
        let table = table.filter(|t| !t.is_empty());
        let scheme = url.split_once("://").map_or(url, |(scheme, _)| scheme);
        let refuse = |flag, scheme| TargetError::FlagDoesNotApply { flag, scheme };
        let target = match scheme.to_ascii_lowercase().as_str() {
            "sqlite" => {
                if let Some(flag) = table.map(|_| "table").or(prefix.map(|_| "prefix")) {
                    return Err(refuse(flag, "sqlite"));
                }
                let rest = &url["sqlite://".len()..];
                if rest.contains('?') {
                    return Err(TargetError::SqliteQuery);
                }
                if rest.is_empty() {
                    return Err(TargetError::NoSqlitePath);
                }
                Target::Sqlite {
                    path: PathBuf::from(rest),
                }
            }
            "postgres" | "postgresql" => {
                if prefix.is_some() {
                    return Err(refuse("prefix", "postgres"));
                }
                Url::parse(url)?;
                Target::Postgres {
                    url: url.to_owned(),
                    table: table.map(str::to_owned),
                }
            }
            "redis" | "rediss" => {
                if table.is_some() {
                    return Err(refuse("table", "redis"));
                }
                Url::parse(url)?;
                Target::Redis {
                    url: url.to_owned(),
                    prefix: prefix.map(str::to_owned),
                }
            }
            "redis+cluster" => {
                if table.is_some() {
                    return Err(refuse("table", "redis"));
                }
                let nodes = url["redis+cluster://".len()..]
                    .split(',')
                    .map(str::trim)
                    .filter(|node| !node.is_empty())
                    .map(|node| {
                        let single = format!("redis://{node}");
                        match Url::parse(&single) {
                            Ok(parsed)
                                if parsed.host().is_some()
                                    && parsed.path().trim_matches('/').is_empty() =>
                            {
                                Ok(single)
                            }
                            _ => Err(TargetError::BadClusterNode(node.to_owned())),
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if nodes.is_empty() {
                    return Err(TargetError::NoClusterNodes);
                }
                Target::RedisCluster {
                    nodes,
                    prefix: prefix.map(str::to_owned),
                }
            }
            "dynamodb" => {
                if table.is_some() {
                    return Err(refuse("table", "dynamodb"));
                }
                // Parsed by hand: a table name is not a host name (case and `.` matter).
                let rest = &url["dynamodb://".len()..];
                let (name, query) = rest.split_once('?').unwrap_or((rest, ""));
                let name = name.trim_end_matches('/');
                if name.is_empty() {
                    return Err(TargetError::NoDynamoTable);
                }
                let (mut region, mut endpoint) = (None, None);
                for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
                    match key.as_ref() {
                        "region" => region = Some(value.into_owned()),
                        "endpoint" => endpoint = Some(value.into_owned()),
                        other => return Err(TargetError::UnknownDynamoParameter(other.to_owned())),
                    }
                }
                if let Some(endpoint) = &endpoint {
                    Url::parse(endpoint)?;
                }
                Target::DynamoDb {
                    table: name.to_owned(),
                    region,
                    endpoint,
                    prefix: prefix.map(str::to_owned),
                }
            }
            _ => {
                return Err(TargetError::UnknownScheme(
                    scheme.chars().take(40).collect(),
                ));
            }
        };
        Ok(target)
    }

    /// The backend's name, for messages.
    pub(crate) fn backend(&self) -> &'static str {
        match self {
            Target::Sqlite { .. } => "SQLite",
            Target::Postgres { .. } => "PostgreSQL",
            Target::Redis { .. } => "Redis",
            Target::RedisCluster { .. } => "Redis Cluster",
            Target::DynamoDb { .. } => "DynamoDB",
        }
    }
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

/// Where the store is, as messages show it: never a password.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Sqlite { path } => write!(f, "SQLite database {}", path.display()),
            Target::Postgres { url, table } => write!(
                f,
                "PostgreSQL table {} at {}",
                table.as_deref().unwrap_or(idem_postgres::DEFAULT_TABLE),
                without_password(url)
            ),
            Target::Redis { url, prefix } => write!(
                f,
                "Redis prefix {:?} at {}",
                prefix.as_deref().unwrap_or(idem_redis::DEFAULT_PREFIX),
                without_password(url)
            ),
            Target::RedisCluster { nodes, prefix } => write!(
                f,
                "Redis Cluster prefix {:?} at {}",
                prefix.as_deref().unwrap_or(idem_redis::DEFAULT_PREFIX),
                nodes
                    .iter()
                    .map(|node| without_password(node))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Target::DynamoDb {
                table,
                region,
                endpoint,
                prefix,
            } => {
                write!(f, "DynamoDB table {table}")?;
                if let Some(prefix) = prefix {
                    write!(f, " prefix {prefix:?}")?;
                }
                if let Some(region) = region {
                    write!(f, " in {region}")?;
                }
                if let Some(endpoint) = endpoint {
                    write!(f, " at {endpoint}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<Target, TargetError> {
        Target::parse(Some(url), None, None)
    }

    #[test]
    fn every_scheme_parses() {
        assert_eq!(
            parse("sqlite:///var/lib/idem.db"),
            Ok(Target::Sqlite {
                path: "/var/lib/idem.db".into()
            })
        );
        assert_eq!(
            parse("sqlite://data/idem.db"),
            Ok(Target::Sqlite {
                path: "data/idem.db".into()
            })
        );
        assert!(matches!(
            parse("postgres://u@127.0.0.1/db"),
            Ok(Target::Postgres { .. })
        ));
        assert!(matches!(
            parse("postgresql://u@127.0.0.1/db"),
            Ok(Target::Postgres { .. })
        ));
        assert!(matches!(
            parse("redis://127.0.0.1:6379/0"),
            Ok(Target::Redis { .. })
        ));
        assert_eq!(
            parse("redis+cluster://127.0.0.1:7001, 127.0.0.1:7002"),
            Ok(Target::RedisCluster {
                nodes: vec![
                    "redis://127.0.0.1:7001".into(),
                    "redis://127.0.0.1:7002".into()
                ],
                prefix: None
            })
        );
        assert_eq!(
            parse("dynamodb://Idem.Records?region=eu-west-1&endpoint=http://127.0.0.1:8000"),
            Ok(Target::DynamoDb {
                table: "Idem.Records".into(),
                region: Some("eu-west-1".into()),
                endpoint: Some("http://127.0.0.1:8000".into()),
                prefix: None
            })
        );
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        assert_eq!(Target::parse(None, None, None), Err(TargetError::Missing));
        assert_eq!(
            parse("mysql://x"),
            Err(TargetError::UnknownScheme("mysql".into()))
        );
        assert_eq!(
            parse("idem.db"),
            Err(TargetError::UnknownScheme("idem.db".into()))
        );
        assert_eq!(parse("sqlite://"), Err(TargetError::NoSqlitePath));
        assert_eq!(
            parse("sqlite:///x.db?mode=ro"),
            Err(TargetError::SqliteQuery)
        );
        assert_eq!(parse("redis+cluster://"), Err(TargetError::NoClusterNodes));
        assert_eq!(
            parse("redis+cluster://127.0.0.1:7001/3"),
            Err(TargetError::BadClusterNode("127.0.0.1:7001/3".into()))
        );
        assert_eq!(
            parse("dynamodb://?region=x"),
            Err(TargetError::NoDynamoTable)
        );
        assert_eq!(
            parse("dynamodb://t?regoin=x"),
            Err(TargetError::UnknownDynamoParameter("regoin".into()))
        );
        assert!(matches!(
            parse("postgres://[::1"),
            Err(TargetError::Malformed(_))
        ));
    }

    #[test]
    fn flags_must_fit_the_backend() {
        assert_eq!(
            Target::parse(Some("redis://127.0.0.1"), Some("t"), None),
            Err(TargetError::FlagDoesNotApply {
                flag: "table",
                scheme: "redis"
            })
        );
        assert_eq!(
            Target::parse(Some("postgres://127.0.0.1/db"), None, Some("p:")),
            Err(TargetError::FlagDoesNotApply {
                flag: "prefix",
                scheme: "postgres"
            })
        );
        assert!(Target::parse(Some("sqlite:///x.db"), None, Some("p")).is_err());
        // An exported but empty IDEM_TABLE names no table.
        assert!(Target::parse(Some("redis://127.0.0.1"), Some(""), None).is_ok());
    }

    #[test]
    fn passwords_never_show() {
        let target = parse("postgres://app:hunter2@127.0.0.1/db").unwrap();
        let shown = target.to_string();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("***"), "{shown}");
        let target = parse("redis+cluster://:hunter2@127.0.0.1:7001").unwrap();
        assert!(!target.to_string().contains("hunter2"));
    }
}
