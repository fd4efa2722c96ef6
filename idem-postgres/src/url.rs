//! Opening a store from a `postgres://` URL: this crate's side of [`idem_core::connect`].

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::connect::{Backend, ConnectOptions, Create, Location, OpenError, UrlError};
use idem_core::{Admin, StoreError, store::Operation};
use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use url::Url;

use crate::table::TableName;
use crate::{DEFAULT_TABLE, PostgresStore, TableNameError};

/// The URL schemes this crate opens.
///
/// ```
/// assert_eq!(idem_postgres::URL_SCHEMES, ["postgres", "postgresql"]);
/// ```
pub const URL_SCHEMES: &[&str] = &["postgres", "postgresql"];

/// The backend's name in messages.
const NAME: &str = "PostgreSQL";

/// A pooled connection idle this long is pinged before it is handed out; one in steady use
/// is not. sqlx's default pings before every acquire: a round trip in front of every store
/// call (measured: `idem proxy` replays on PostgreSQL at a fifth of SQLite's rate). A
/// connection the server dropped while it sat idle (a restart, an idle timeout, a
/// failover) is found by the ping and replaced; one that breaks while in use fails its
/// call, which the driver retries on another connection.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// `postgres://` and `postgresql://` URLs, for [`idem_core::connect::parse_url`]. The
/// table is the table of the [`ConnectOptions`] (default `idem_records`).
///
/// ```
/// use idem_core::connect::{self, ConnectOptions};
///
/// let location = connect::parse_url(
///     "postgres://app:secret@db.internal/app",
///     &ConnectOptions::default().table("billing.idem_records"),
///     &[&idem_postgres::BACKEND],
/// )?;
/// assert_eq!(location.to_string(), "PostgreSQL table billing.idem_records at postgres://app:***@db.internal/app");
/// # Ok::<(), connect::UrlError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PostgresBackend;

/// The backend, for a program's list of backends (`&idem_postgres::BACKEND`).
///
/// ```
/// use idem_core::connect::Backend;
///
/// assert_eq!(idem_postgres::BACKEND.name(), "PostgreSQL");
/// ```
pub const BACKEND: PostgresBackend = PostgresBackend;

impl Backend for PostgresBackend {
    fn schemes(&self) -> &'static [&'static str] {
        URL_SCHEMES
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn parse(&self, url: &str, options: &ConnectOptions) -> Result<Box<dyn Location>, UrlError> {
        Ok(Box::new(PostgresLocation::parse(url, options)?))
    }
}

/// Why a `postgres://` URL or its table was refused: the source of [`UrlError::Invalid`].
///
/// ```
/// use idem_core::connect::{ConnectOptions, UrlError};
/// use idem_postgres::{PostgresLocation, PostgresUrlError};
///
/// let options = ConnectOptions::default().table("idem-records");
/// let Err(UrlError::Invalid { source, .. }) = PostgresLocation::parse("postgres://127.0.0.1/app", &options) else {
///     panic!("a table name with `-` is refused");
/// };
/// assert!(matches!(source.downcast_ref(), Some(PostgresUrlError::Table(_))));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresUrlError {
    /// Not a URL at all.
    #[error("not a valid URL ({0}); write it as postgres://user@host:5432/database")]
    Malformed(#[from] url::ParseError),
    /// A URL of another scheme.
    #[error("a PostgreSQL URL starts with postgres:// or postgresql://, not {scheme}://")]
    NotPostgres {
        /// The URL's scheme.
        scheme: String,
    },
    /// A setting in the URL the driver cannot use (an unknown `sslmode`, a port that is
    /// not a number).
    #[error("{}", innermost(.0))]
    Settings(#[source] sqlx::Error),
    /// The table option is not a name the store accepts.
    #[error("the table option: {0}")]
    Table(#[from] TableNameError),
}

/// The last cause of `err`: sqlx wraps a setting's error in configuration errors twice.
fn innermost(err: &sqlx::Error) -> String {
    let mut cause: &dyn std::error::Error = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

/// A PostgreSQL table a `postgres://` URL and the table option name, checked but not
/// connected to.
///
/// ```
/// use idem_core::connect::{ConnectOptions, Location};
/// use idem_postgres::PostgresLocation;
///
/// let location = PostgresLocation::parse("postgresql://app@127.0.0.1/app", &ConnectOptions::default())?;
/// assert_eq!(location.table(), "idem_records");
/// assert_eq!(location.backend(), "PostgreSQL");
/// # Ok::<(), idem_core::connect::UrlError>(())
/// ```
#[derive(Clone)]
pub struct PostgresLocation {
    /// The URL as messages show it: the password replaced by `***`.
    shown: String,
    settings: PgConnectOptions,
    /// As given, checked by `TableName::parse`.
    table: Option<String>,
    connect_timeout: Duration,
    /// The pool's size for `open` (two, for an operator's command, unless asked).
    connections: u32,
}

impl PostgresLocation {
    /// Reads a `postgres://` URL with the table option (PostgreSQL takes no prefix).
    ///
    /// ```
    /// use idem_core::connect::{ConnectOptions, UrlError};
    /// use idem_postgres::PostgresLocation;
    ///
    /// let refused = PostgresLocation::parse("postgres://127.0.0.1/app", &ConnectOptions::default().prefix("p:"));
    /// assert!(matches!(refused, Err(UrlError::OptionDoesNotApply { option: "prefix", .. })));
    /// ```
    ///
    /// # Errors
    /// [`UrlError::OptionDoesNotApply`] for a prefix, and [`UrlError::Invalid`] with a
    /// [`PostgresUrlError`] for a URL or a table name the store cannot use.
    pub fn parse(url: &str, options: &ConnectOptions) -> Result<Self, UrlError> {
        if options.prefix.is_some() {
            return Err(UrlError::OptionDoesNotApply {
                option: "prefix",
                backend: NAME,
            });
        }
        let invalid = |source: PostgresUrlError| UrlError::Invalid {
            backend: NAME,
            source: source.into(),
        };
        let url = url.trim();
        let parsed = Url::parse(url).map_err(|err| invalid(err.into()))?;
        if !URL_SCHEMES.contains(&parsed.scheme()) {
            return Err(invalid(PostgresUrlError::NotPostgres {
                scheme: parsed.scheme().chars().take(40).collect(),
            }));
        }
        // The driver's own reading, so a setting it refuses is found before connecting.
        let settings = PgConnectOptions::from_str(url)
            .map_err(|err| invalid(PostgresUrlError::Settings(err)))?;
        let table = options.table.clone().filter(|table| !table.is_empty());
        if let Some(table) = &table {
            TableName::parse(table).map_err(|err| invalid(err.into()))?;
        }
        Ok(Self {
            shown: without_password(url, parsed),
            settings,
            table,
            connect_timeout: options.connect_timeout,
            connections: options.connections.unwrap_or(2),
        })
    }

    /// The table, as given (default `idem_records`).
    ///
    /// ```
    /// # use idem_core::connect::ConnectOptions;
    /// let options = ConnectOptions::default().table("billing.idem_records");
    /// let location = idem_postgres::PostgresLocation::parse("postgres://127.0.0.1/app", &options)?;
    /// assert_eq!(location.table(), "billing.idem_records");
    /// # Ok::<(), idem_core::connect::UrlError>(())
    /// ```
    pub fn table(&self) -> &str {
        self.table.as_deref().unwrap_or(DEFAULT_TABLE)
    }

    /// The store over a pool of `connections`, once one plain connection proved the
    /// server answers: a pool retries a refused connection until its own timeout, a
    /// single attempt says why at once.
    async fn store(&self, connections: u32) -> Result<PostgresStore, OpenError> {
        let pool = pool_options(connections).connect_lazy_with(self.settings.clone());
        let mut builder = PostgresStore::builder(pool);
        if let Some(table) = &self.table {
            // Checked by parse; a refusal here would be a bug, reported as setup.
            builder = builder.table(table).map_err(|err| {
                OpenError::Store(StoreError::Misconfigured {
                    operation: Operation::Setup,
                    source: err.into(),
                })
            })?;
        }
        let connecting = PgConnection::connect_with(&self.settings);
        let probe = tokio::time::timeout(self.connect_timeout, connecting)
            .await
            .map_err(|_| OpenError::Unreachable {
                location: self.to_string(),
                source: Box::new(idem_core::connect::NoAnswer(self.connect_timeout)),
            })?
            .map_err(|err| match err {
                // The server answered, and said no: a retry will not help.
                sqlx::Error::Database(_) | sqlx::Error::Configuration(_) => OpenError::Rejected {
                    location: self.to_string(),
                    source: err.into(),
                },
                err => OpenError::Unreachable {
                    location: self.to_string(),
                    source: err.into(),
                },
            })?;
        let _ = probe.close().await;
        Ok(builder.build())
    }
}

/// `url` as messages show it: a password, in the user part or a `password=` parameter,
/// replaced by `***`.
fn without_password(url: &str, mut parsed: Url) -> String {
    let in_query = parsed.query_pairs().any(|(key, _)| key == "password");
    if parsed.password().is_none() && !in_query {
        return url.to_owned();
    }
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    if in_query {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(key, value)| {
                let value = if key == "password" {
                    "***".into()
                } else {
                    value.into_owned()
                };
                (key.into_owned(), value)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

/// `PostgreSQL table <table> at <URL>`, without the password.
impl fmt::Display for PostgresLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PostgreSQL table {} at {}", self.table(), self.shown)
    }
}

/// As `Display`: never the password.
impl fmt::Debug for PostgresLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The pool's settings: `connections` at most, pinged only after [`PING_AFTER_IDLE`].
fn pool_options(connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(connections)
        .test_before_acquire(false)
        .before_acquire(|connection, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_AFTER_IDLE {
                    // A failed ping closes this connection (sqlx logs it) and the pool
                    // opens a new one for the caller.
                    connection.ping().await?;
                }
                Ok(true)
            })
        })
}

#[async_trait]
impl Location for PostgresLocation {
    fn backend(&self) -> &'static str {
        NAME
    }

    /// A pool of two connections, or as many as the options asked for; creates nothing
    /// (the table is `migrate`'s).
    async fn open(&self, _create: Create) -> Result<Arc<dyn Admin>, OpenError> {
        Ok(Arc::new(self.store(self.connections).await?))
    }

    /// Creates the table and its indexes when missing ([`PostgresStore::migrate`]).
    async fn migrate(&self) -> Result<String, OpenError> {
        self.store(1).await?.migrate().await?;
        Ok(format!(
            "migrated {self}: the table and its indexes are in place"
        ))
    }
}

#[cfg(test)]
mod tests {
    use idem_core::connect::parse_url;

    use super::*;

    fn parse(url: &str) -> Result<PostgresLocation, UrlError> {
        PostgresLocation::parse(url, &ConnectOptions::default())
    }

    #[test]
    fn the_pool_does_not_ping_before_every_call() {
        let options = pool_options(4);
        assert!(!options.get_test_before_acquire());
        assert_eq!(options.get_max_connections(), 4);
    }

    /// The backend's own reason for refusing `url` with `options`.
    fn refusal(url: &str, options: ConnectOptions) -> PostgresUrlError {
        match PostgresLocation::parse(url, &options) {
            Err(UrlError::Invalid { backend, source }) => {
                assert_eq!(backend, "PostgreSQL");
                *source.downcast().expect("a PostgresUrlError")
            }
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn every_scheme_parses() {
        for url in [
            "postgres://u@127.0.0.1/db",
            "postgresql://u@127.0.0.1/db",
            "POSTGRES://u@h/db",
        ] {
            let location = parse_url(url, &ConnectOptions::default(), &[&BACKEND]).unwrap();
            assert_eq!(location.backend(), "PostgreSQL");
        }
        let location = parse("postgres://u@127.0.0.1:5432/db").unwrap();
        assert_eq!(
            location.to_string(),
            "PostgreSQL table idem_records at postgres://u@127.0.0.1:5432/db"
        );
        let options = ConnectOptions::default().table("Billing.Idem_2");
        let location = PostgresLocation::parse("postgres://h/db", &options).unwrap();
        assert_eq!(location.table(), "Billing.Idem_2");
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        let none = ConnectOptions::default;
        assert!(matches!(
            refusal("postgres://[::1", none()),
            PostgresUrlError::Malformed(_)
        ));
        assert!(matches!(
            refusal("mysql://h/db", none()),
            PostgresUrlError::NotPostgres { scheme } if scheme == "mysql"
        ));
        let settings = refusal("postgres://h/db?sslmode=sometimes", none());
        assert!(matches!(settings, PostgresUrlError::Settings(_)));
        assert!(
            settings
                .to_string()
                .starts_with("unknown value \"sometimes\""),
            "{settings}"
        );
        let table = refusal("postgres://h/db", none().table("a;drop table x"));
        assert!(matches!(
            table,
            PostgresUrlError::Table(TableNameError::NotAnIdentifier { .. })
        ));
        let said = UrlError::Invalid {
            backend: NAME,
            source: table.into(),
        }
        .to_string();
        assert!(
            said.contains("the table option") && said.contains("plain identifier"),
            "{said}"
        );
    }

    #[test]
    fn flags_must_fit_the_backend() {
        assert!(matches!(
            PostgresLocation::parse(
                "postgres://127.0.0.1/db",
                &ConnectOptions::default().prefix("p:")
            ),
            Err(UrlError::OptionDoesNotApply {
                option: "prefix",
                backend: "PostgreSQL"
            })
        ));
        // An empty table names none.
        let location =
            PostgresLocation::parse("postgres://h/db", &ConnectOptions::default().table(""))
                .unwrap();
        assert_eq!(location.table(), DEFAULT_TABLE);
    }

    #[test]
    fn passwords_never_show() {
        for url in [
            "postgres://app:hunter2@127.0.0.1/db",
            "postgres://app@127.0.0.1/db?password=hunter2&sslmode=disable",
        ] {
            let location = parse(url).unwrap();
            for shown in [location.to_string(), format!("{location:?}")] {
                assert!(!shown.contains("hunter2"), "{shown}");
                assert!(shown.contains("***"), "{shown}");
            }
        }
        assert!(
            parse("postgres://app@127.0.0.1/db?sslmode=disable")
                .unwrap()
                .to_string()
                .ends_with("?sslmode=disable")
        );
        // A URL with no password is shown as given: its query is not re-encoded.
        let plain = "postgres://app@127.0.0.1/db?application_name=billing%20api";
        assert_eq!(
            parse(plain).unwrap().to_string(),
            format!("PostgreSQL table idem_records at {plain}")
        );
    }

    #[test]
    fn the_backend_is_named_for_messages() {
        assert_eq!(BACKEND.name(), "PostgreSQL");
        assert_eq!(BACKEND.schemes(), ["postgres", "postgresql"]);
    }

    #[tokio::test]
    async fn an_unreachable_server_is_unreachable() {
        // Port 1 on loopback: nothing listens there, so the connection is refused at once.
        let location = parse("postgres://app:hunter2@127.0.0.1:1/db").unwrap();
        let err = location.open(Create::No).await.map(|_| ()).unwrap_err();
        assert!(matches!(err, OpenError::Unreachable { .. }), "{err}");
        assert!(err.is_retryable());
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
}
