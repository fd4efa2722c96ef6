//! Opening a store from a `sqlite://` URL: this crate's side of
//! [`idem_core::connect`]. Parsed by hand: the rest of the URL is a file path, not a URL.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use idem_core::Admin;
use idem_core::connect::{Backend, ConnectOptions, Create, Location, OpenError, UrlError};

use crate::{SCHEMA_VERSION, SqliteStore};

/// The URL schemes this crate opens.
///
/// ```
/// assert_eq!(idem_sqlite::URL_SCHEMES, ["sqlite"]);
/// ```
pub const URL_SCHEMES: &[&str] = &["sqlite"];

/// The backend's name in messages.
const NAME: &str = "SQLite";

/// `sqlite://` URLs, for [`idem_core::connect::parse_url`].
///
/// ```
/// use idem_core::connect::{self, ConnectOptions};
///
/// let location = connect::parse_url(
///     "sqlite:///var/lib/app/idem.db",
///     &ConnectOptions::default(),
///     &[&idem_sqlite::BACKEND],
/// )?;
/// assert_eq!(location.to_string(), "SQLite database /var/lib/app/idem.db");
/// # Ok::<(), connect::UrlError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SqliteBackend;

/// The backend, for a program's list of backends (`&idem_sqlite::BACKEND`).
///
/// ```
/// use idem_core::connect::Backend;
///
/// assert_eq!(idem_sqlite::BACKEND.name(), "SQLite");
/// ```
pub const BACKEND: SqliteBackend = SqliteBackend;

impl Backend for SqliteBackend {
    fn schemes(&self) -> &'static [&'static str] {
        URL_SCHEMES
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn parse(&self, url: &str, options: &ConnectOptions) -> Result<Box<dyn Location>, UrlError> {
        Ok(Box::new(SqliteLocation::parse(url, options)?))
    }
}

/// Why a `sqlite://` URL was refused: the source of [`UrlError::Invalid`].
///
/// ```
/// use idem_core::connect::{ConnectOptions, UrlError};
/// use idem_sqlite::{SqliteLocation, SqliteUrlError};
///
/// let Err(UrlError::Invalid { source, .. }) = SqliteLocation::parse("sqlite://", &ConnectOptions::default()) else {
///     panic!("an empty path is refused");
/// };
/// assert_eq!(source.downcast_ref::<SqliteUrlError>(), Some(&SqliteUrlError::NoPath));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SqliteUrlError {
    /// The URL does not start with `sqlite://`.
    #[error("a SQLite URL starts with sqlite://, as in sqlite:///var/lib/app/idem.db")]
    NotSqlite,
    /// Nothing after `sqlite://`.
    #[error("a sqlite URL needs a file path, as in sqlite:///var/lib/app/idem.db")]
    NoPath,
    /// A `?` after the path: SQLite's URI parameters are not read, so none is accepted.
    #[error("a sqlite URL takes no query (`?...`); name the file only")]
    Query,
}

/// A SQLite database file a `sqlite://` URL names: `sqlite:///var/lib/app/idem.db`
/// (absolute) or `sqlite://data/idem.db` (relative to the working directory).
///
/// ```
/// use idem_core::connect::{ConnectOptions, Location};
/// use idem_sqlite::SqliteLocation;
///
/// let location = SqliteLocation::parse("sqlite://data/idem.db", &ConnectOptions::default())?;
/// assert_eq!(location.path(), std::path::Path::new("data/idem.db"));
/// assert_eq!(location.backend(), "SQLite");
/// # Ok::<(), idem_core::connect::UrlError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqliteLocation {
    path: PathBuf,
}

impl SqliteLocation {
    /// Reads a `sqlite://` URL. SQLite takes neither a table nor a prefix.
    ///
    /// ```
    /// use idem_core::connect::{ConnectOptions, UrlError};
    /// use idem_sqlite::SqliteLocation;
    ///
    /// let refused = SqliteLocation::parse("sqlite:///x.db", &ConnectOptions::default().prefix("p"));
    /// assert!(matches!(refused, Err(UrlError::OptionDoesNotApply { option: "prefix", .. })));
    /// ```
    ///
    /// # Errors
    /// [`UrlError::OptionDoesNotApply`] for a table or a prefix, and
    /// [`UrlError::Invalid`] with a [`SqliteUrlError`] for a URL without a path.
    pub fn parse(url: &str, options: &ConnectOptions) -> Result<Self, UrlError> {
        let refuse = |option| UrlError::OptionDoesNotApply {
            option,
            backend: NAME,
        };
        if options.table.as_deref().is_some_and(|t| !t.is_empty()) {
            return Err(refuse("table"));
        }
        if options.prefix.is_some() {
            return Err(refuse("prefix"));
        }
        let invalid = |source: SqliteUrlError| UrlError::Invalid {
            backend: NAME,
            source: source.into(),
        };
        let url = url.trim();
        let path = match url.split_once("://") {
            Some((scheme, path)) if scheme.eq_ignore_ascii_case("sqlite") => path,
            _ => return Err(invalid(SqliteUrlError::NotSqlite)),
        };
        if path.contains('?') {
            return Err(invalid(SqliteUrlError::Query));
        }
        if path.is_empty() {
            return Err(invalid(SqliteUrlError::NoPath));
        }
        Ok(Self { path: path.into() })
    }

    /// The database file.
    ///
    /// ```
    /// # use idem_core::connect::ConnectOptions;
    /// let location = idem_sqlite::SqliteLocation::parse("sqlite:///var/idem.db", &ConnectOptions::default())?;
    /// assert_eq!(location.path(), std::path::Path::new("/var/idem.db"));
    /// # Ok::<(), idem_core::connect::UrlError>(())
    /// ```
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `SQLite database <path>`.
impl fmt::Display for SqliteLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SQLite database {}", self.path.display())
    }
}

#[async_trait]
impl Location for SqliteLocation {
    fn backend(&self) -> &'static str {
        NAME
    }

    /// Opens the file; with [`Create::No`], a file that does not exist is
    /// [`OpenError::NotFound`] (a mistyped path must not become an empty database).
    async fn open(&self, create: Create) -> Result<Arc<dyn Admin>, OpenError> {
        if create == Create::No && !self.path.exists() {
            return Err(OpenError::NotFound {
                what: "SQLite database",
                location: self.path.display().to_string(),
            });
        }
        Ok(Arc::new(SqliteStore::open(&self.path)?))
    }

    /// Creates the file or brings its schema up to date (opening does both).
    async fn migrate(&self) -> Result<String, OpenError> {
        let existed = self.path.exists();
        self.open(Create::Yes).await?;
        Ok(format!(
            "{} {self}: schema version {SCHEMA_VERSION}",
            if existed { "migrated" } else { "created" },
        ))
    }
}

#[cfg(test)]
mod tests {
    use idem_core::connect::parse_url;

    use super::*;

    fn parse(url: &str) -> Result<SqliteLocation, UrlError> {
        SqliteLocation::parse(url, &ConnectOptions::default())
    }

    /// The backend's own reason for refusing `url`.
    fn refusal(url: &str) -> SqliteUrlError {
        match parse(url) {
            Err(UrlError::Invalid { backend, source }) => {
                assert_eq!(backend, "SQLite");
                *source.downcast().expect("a SqliteUrlError")
            }
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn the_backend_names_itself_and_its_schemes() {
        // As the doc examples say; cargo-mutants' test runs leave doc tests out.
        assert_eq!(BACKEND.name(), "SQLite");
        assert_eq!(BACKEND.schemes(), URL_SCHEMES);
    }

    #[test]
    fn every_scheme_parses() {
        assert_eq!(
            parse("sqlite:///var/lib/idem.db").unwrap().path(),
            Path::new("/var/lib/idem.db")
        );
        assert_eq!(
            parse("sqlite://data/idem.db").unwrap().path(),
            Path::new("data/idem.db")
        );
        assert_eq!(
            parse(" SQLite:///x.db ").unwrap().path(),
            Path::new("/x.db")
        );
        let location =
            parse_url("sqlite:///x.db", &ConnectOptions::default(), &[&BACKEND]).unwrap();
        assert_eq!(location.backend(), "SQLite");
        assert_eq!(location.to_string(), "SQLite database /x.db");
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        assert_eq!(refusal("sqlite://"), SqliteUrlError::NoPath);
        assert_eq!(refusal("sqlite:///x.db?mode=ro"), SqliteUrlError::Query);
        assert_eq!(refusal("sqlite"), SqliteUrlError::NotSqlite);
        assert_eq!(refusal("postgres://x/db"), SqliteUrlError::NotSqlite);
        let said = parse("sqlite://").unwrap_err().to_string();
        assert!(said.contains("sqlite:///var/lib/app/idem.db"), "{said}");
    }

    #[test]
    fn flags_must_fit_the_backend() {
        let with = |options: ConnectOptions| SqliteLocation::parse("sqlite:///x.db", &options);
        assert!(matches!(
            with(ConnectOptions::default().prefix("p")),
            Err(UrlError::OptionDoesNotApply {
                option: "prefix",
                backend: "SQLite"
            })
        ));
        assert!(matches!(
            with(ConnectOptions::default().table("t")),
            Err(UrlError::OptionDoesNotApply {
                option: "table",
                backend: "SQLite"
            })
        ));
        // An empty table names none.
        assert!(with(ConnectOptions::default().table("")).is_ok());
    }

    #[tokio::test]
    async fn a_missing_file_is_created_only_by_migrate() {
        let dir = std::env::temp_dir().join(format!("idem-sqlite-url-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("idem.db");
        let _ = std::fs::remove_file(&path);
        let location = parse(&format!("sqlite://{}", path.display())).unwrap();
        match location.open(Create::No).await {
            Err(OpenError::NotFound { what, location }) => {
                assert_eq!(what, "SQLite database");
                assert_eq!(location, path.display().to_string());
            }
            other => panic!("{:?}", other.map(|_| "opened")),
        }
        assert!(!path.exists(), "a mistyped path must not become a database");
        assert!(
            location
                .migrate()
                .await
                .unwrap()
                .starts_with("created SQLite database")
        );
        assert!(location.migrate().await.unwrap().starts_with("migrated"));
        location.open(Create::No).await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
