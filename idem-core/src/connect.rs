//! Opening a store from a URL. Each backend crate parses its own schemes (as sqlx drivers
//! declare `URL_SCHEMES`, or object_store's `parse_url`), and a program that takes a store
//! URL (the `idem` command, a proxy, a test harness) only dispatches to them: a new backend
//! is one crate and one entry in the program's list.
//!
//! ```
//! use idem_core::connect::{self, ConnectOptions, UrlError};
//!
//! // A program lists the backends it was built with; this one has none.
//! let err = connect::parse_url("mysql://127.0.0.1/db", &ConnectOptions::default(), &[]).unwrap_err();
//! assert!(matches!(err, UrlError::UnknownScheme { .. }));
//! assert!(err.to_string().contains("mysql"));
//!
//! // A mistyped URL shows its scheme only, never what may be a password.
//! let err = connect::parse_url("postgres:/app:hunter2@db/app", &ConnectOptions::default(), &[]).unwrap_err();
//! assert!(!err.to_string().contains("hunter2"), "{err}");
//!
//! // Odd settings are refused before any backend sees them.
//! let never = ConnectOptions::default().connect_timeout(std::time::Duration::ZERO);
//! let err = connect::parse_url("sqlite:///tmp/idem.db", &never, &[]).unwrap_err();
//! assert!(matches!(err, UrlError::ZeroConnectTimeout));
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{Admin, BoxError, StoreError};

/// How long opening waits for a server by default before it gives up.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// What a program adds to a URL: the flags beside it.
///
/// ```
/// use idem_core::connect::ConnectOptions;
///
/// let options = ConnectOptions::default().prefix("billing:");
/// assert_eq!(options.prefix.as_deref(), Some("billing:"));
/// assert_eq!(options.table, None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// The table (PostgreSQL's table, DynamoDB's in the URL): backends without tables refuse
    /// it ([`UrlError::OptionDoesNotApply`]). An empty string counts as none.
    pub table: Option<String>,
    /// The key prefix (Redis, DynamoDB): backends without one refuse it.
    pub prefix: Option<String>,
    /// How long opening waits for a server (default [`DEFAULT_CONNECT_TIMEOUT`]); zero is
    /// refused by [`parse_url`] ([`UrlError::ZeroConnectTimeout`]).
    pub connect_timeout: Duration,
    /// How many connections a pooled backend (PostgreSQL) opens at most: `None` for the
    /// backend's choice for an operator's command (a few); a server that serves requests
    /// (`idem proxy`) asks for as many as it runs at once. Backends without a pool of
    /// their own (Redis multiplexes, DynamoDB's client pools itself, SQLite has one
    /// writer) ignore it.
    pub connections: Option<u32>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            table: None,
            prefix: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            connections: None,
        }
    }
}

impl ConnectOptions {
    /// The same options with `table`.
    #[must_use]
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = Some(table.into()).filter(|table| !table.is_empty());
        self
    }

    /// The same options with `prefix`.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// The same options with `timeout` for connecting.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The same options with at most `connections` pooled connections (at least one).
    ///
    /// ```
    /// use idem_core::connect::ConnectOptions;
    ///
    /// assert_eq!(ConnectOptions::default().connections(16).connections, Some(16));
    /// assert_eq!(ConnectOptions::default().connections(0).connections, Some(1));
    /// ```
    #[must_use]
    pub fn connections(mut self, connections: u32) -> Self {
        self.connections = Some(connections.max(1));
        self
    }
}

/// Whether opening may create what is missing (a database file, a table). Only a
/// migration should: a mistyped path must not become an empty database that reports zero
/// records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Create {
    /// Open only what exists.
    No,
    /// Create what is missing.
    Yes,
}

/// A backend's side of URL dispatch: the schemes it owns and how it reads them.
///
/// - `schemes` are lower case, without `://`, and owned by one backend only.
/// - `parse` connects to nothing: every mistake in the URL or the options is found
///   before a connection is tried.
pub trait Backend: Send + Sync + 'static {
    /// The URL schemes this backend owns, as `["postgres", "postgresql"]`.
    fn schemes(&self) -> &'static [&'static str];

    /// The backend's name for messages, as `"PostgreSQL"`.
    fn name(&self) -> &'static str;

    /// Reads `url` (one of [`Backend::schemes`]) with `options`.
    ///
    /// # Errors
    /// [`UrlError::Invalid`] for a URL this backend cannot use, with the reason as the
    /// source; [`UrlError::OptionDoesNotApply`] for an option it does not take.
    fn parse(&self, url: &str, options: &ConnectOptions) -> Result<Box<dyn Location>, UrlError>;
}

/// A store a URL names, checked but not opened. `Display` says where it is for
/// messages, never with a password.
#[async_trait]
pub trait Location: fmt::Display + Send + Sync {
    /// The backend's name for messages, as `"SQLite"`.
    fn backend(&self) -> &'static str;

    /// Opens the store, with its operator's side.
    ///
    /// - Creates nothing unless `create` is [`Create::Yes`].
    /// - Proves the server answers before it returns, within the connect timeout, where
    ///   the backend can without asking for more permissions than the store needs
    ///   (DynamoDB cannot: its first operation tells).
    ///
    /// # Errors
    /// See [`OpenError`].
    async fn open(&self, create: Create) -> Result<Arc<dyn Admin>, OpenError>;

    /// Creates or upgrades what the store needs (a schema, a table, TTL) and says what it
    /// did, in one line.
    ///
    /// - Safe to run again, and from several processes at once.
    ///
    /// # Errors
    /// See [`OpenError`].
    async fn migrate(&self) -> Result<String, OpenError>;
}

/// As `Display`: where the store is, never a password.
impl fmt::Debug for dyn Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why a store URL or its options were refused. Nothing was connected to.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// No URL at all.
    #[error("no store URL given")]
    Missing,
    /// No backend in the program owns the URL's scheme.
    #[error("`{scheme}` is not a store URL this program knows: use {}", known.iter().map(|s| format!("{s}://")).collect::<Vec<_>>().join(", "))]
    UnknownScheme {
        /// The scheme (at most 40 characters of it).
        scheme: String,
        /// Every scheme the program knows.
        known: Vec<&'static str>,
    },
    /// The backend cannot use the URL.
    #[error("the {backend} store's URL or options are not valid: {source}")]
    Invalid {
        /// The backend's name.
        backend: &'static str,
        /// What is wrong, as the backend says it.
        #[source]
        source: BoxError,
    },
    /// A connect timeout of zero: every open would fail at once.
    #[error("the connect timeout must be longer than zero")]
    ZeroConnectTimeout,
    /// An option the backend does not take.
    #[error("the {option} option does not apply to {backend} stores")]
    OptionDoesNotApply {
        /// `"table"` or `"prefix"`.
        option: &'static str,
        /// The backend's name.
        backend: &'static str,
    },
}

/// Why a store named by a valid URL could not be opened or migrated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// There is nothing to open and [`Create::No`] forbade creating it.
    #[error("no {what} at {location}: check the URL, or migrate to create it")]
    NotFound {
        /// What is missing, as `"SQLite database"`.
        what: &'static str,
        /// Where it was looked for.
        location: String,
    },
    /// The server did not answer (refused, unreachable, or silent for the connect
    /// timeout). Retryable.
    #[error("could not reach the {location}: {source}; check the URL and that the server is up")]
    Unreachable {
        /// Where the store is, as [`Location`] shows it.
        location: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The server answered and said no: credentials, a database that does not exist,
    /// permissions.
    #[error(
        "the {location} refused the connection: {source}; check the credentials, the database name and the permissions"
    )]
    Rejected {
        /// Where the store is, as [`Location`] shows it.
        location: String,
        /// The server's answer.
        #[source]
        source: BoxError,
    },
    /// A setting the URL leaves to the environment is missing (an AWS region, AWS
    /// credentials).
    #[error("{what}")]
    MissingSetting {
        /// What is missing and how to give it.
        what: &'static str,
    },
    /// The store failed while opening or migrating.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl OpenError {
    /// Whether trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            OpenError::Unreachable { .. } => true,
            OpenError::Store(err) => err.is_retryable(),
            _ => false,
        }
    }
}

/// A server that did not answer in time: the source of [`OpenError::Unreachable`] when
/// connecting, and of `StoreError::Unavailable` when a store call outlasts the driver's
/// store timeout.
///
/// ```
/// use std::time::Duration;
/// use idem_core::connect::NoAnswer;
///
/// assert_eq!(NoAnswer(Duration::from_secs(20)).to_string(), "no answer within 20s");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no answer within {0:?}")]
pub struct NoAnswer(pub Duration);

/// Reads `url` with the first of `backends` that owns its scheme.
///
/// # Errors
/// [`UrlError::Missing`] for an empty URL, [`UrlError::ZeroConnectTimeout`],
/// [`UrlError::UnknownScheme`] when no backend owns the scheme, else the backend's own
/// [`Backend::parse`] error.
pub fn parse_url(
    url: &str,
    options: &ConnectOptions,
    backends: &[&dyn Backend],
) -> Result<Box<dyn Location>, UrlError> {
    let url = url.trim();
    if url.is_empty() {
        return Err(UrlError::Missing);
    }
    if options.connect_timeout.is_zero() {
        return Err(UrlError::ZeroConnectTimeout);
    }
    // Without `://` the scheme is what comes before the first `:` or `/`: never the rest,
    // which may hold a password (`postgres:/app:secret@db`).
    let scheme = url.split_once("://").map_or_else(
        || url.split([':', '/']).next().unwrap_or(url),
        |(scheme, _)| scheme,
    );
    let lower = scheme.to_ascii_lowercase();
    backends
        .iter()
        .find(|backend| backend.schemes().contains(&lower.as_str()))
        .ok_or_else(|| UrlError::UnknownScheme {
            scheme: scheme.chars().take(40).collect(),
            known: backends
                .iter()
                .flat_map(|backend| backend.schemes().iter().copied())
                .collect(),
        })?
        .parse(url, options)
}

/// The text after `scheme://` in `url`, whatever the scheme's case: for backends that
/// read the rest by hand.
///
/// ```
/// assert_eq!(idem_core::connect::after_scheme("SQLite:///var/idem.db"), Some("/var/idem.db"));
/// assert_eq!(idem_core::connect::after_scheme("idem.db"), None);
/// ```
pub fn after_scheme(url: &str) -> Option<&str> {
    url.split_once("://").map(|(_, rest)| rest)
}
