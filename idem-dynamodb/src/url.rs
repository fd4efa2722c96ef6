//! Opening a store from a `dynamodb://TABLE?region=...&endpoint=...` URL: this crate's
//! side of [`idem_core::connect`] (feature `url`). Parsed by hand: a table name is not a
//! host name (case and `.` matter), and the query holds two parameters.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::{Client, Config};
use idem_core::connect::{Backend, ConnectOptions, Create, Location, OpenError, UrlError};
use idem_core::{Admin, StoreError, store::Operation};

use crate::builder::check_prefix;
use crate::table::TableName;
use crate::{DynamoDbStore, PrefixError, TableNameError, attributes, create_table};

/// The URL schemes this crate opens.
///
/// ```
/// assert_eq!(idem_dynamodb::URL_SCHEMES, ["dynamodb"]);
/// ```
pub const URL_SCHEMES: &[&str] = &["dynamodb"];

/// The backend's name in messages.
const NAME: &str = "DynamoDB";

/// The SDK's connect timeout per attempt, at most: the SDK tries a failed connection
/// again by itself, so a long wait per attempt would multiply.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one attempt of a request may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

/// `dynamodb://TABLE?region=...&endpoint=...` URLs, for
/// [`idem_core::connect::parse_url`]. The key prefix is
/// the prefix of the [`ConnectOptions`] (default none); the table is in the URL.
///
/// ```
/// use idem_core::connect::{self, ConnectOptions};
///
/// let location = connect::parse_url(
///     "dynamodb://idem?region=eu-west-1",
///     &ConnectOptions::default().prefix("billing#"),
///     &[&idem_dynamodb::BACKEND],
/// )?;
/// assert_eq!(location.to_string(), "DynamoDB table idem prefix \"billing#\" in eu-west-1");
/// # Ok::<(), connect::UrlError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DynamoDbBackend;

/// The backend, for a program's list of backends (`&idem_dynamodb::BACKEND`).
///
/// ```
/// use idem_core::connect::Backend;
///
/// assert_eq!(idem_dynamodb::BACKEND.name(), "DynamoDB");
/// ```
pub const BACKEND: DynamoDbBackend = DynamoDbBackend;

impl Backend for DynamoDbBackend {
    fn schemes(&self) -> &'static [&'static str] {
        URL_SCHEMES
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn parse(&self, url: &str, options: &ConnectOptions) -> Result<Box<dyn Location>, UrlError> {
        Ok(Box::new(DynamoDbLocation::parse(url, options)?))
    }
}

/// Why a `dynamodb://` URL or its prefix was refused: the source of [`UrlError::Invalid`].
///
/// ```
/// use idem_core::connect::{ConnectOptions, UrlError};
/// use idem_dynamodb::{DynamoDbLocation, DynamoDbUrlError};
///
/// let Err(UrlError::Invalid { source, .. }) = DynamoDbLocation::parse("dynamodb://idem?regoin=x", &ConnectOptions::default()) else {
///     panic!("a misspelt parameter is refused");
/// };
/// assert_eq!(
///     source.downcast_ref::<DynamoDbUrlError>(),
///     Some(&DynamoDbUrlError::UnknownParameter("regoin".into()))
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DynamoDbUrlError {
    /// The URL does not start with `dynamodb://`.
    #[error("a DynamoDB URL starts with dynamodb://, as in dynamodb://idem?region=eu-west-1")]
    NotDynamoDb,
    /// Nothing between `dynamodb://` and the query.
    #[error("a dynamodb URL needs a table name, as in dynamodb://idem?region=eu-west-1")]
    NoTable,
    /// A table name DynamoDB would refuse.
    #[error("{0}")]
    Table(#[from] TableNameError),
    /// A query parameter other than `region` and `endpoint`.
    #[error("`{0}` is not a parameter of a dynamodb URL: use region, endpoint")]
    UnknownParameter(String),
    /// `region=` or `endpoint=` with nothing after it.
    #[error("`{0}=` needs a value, as in dynamodb://idem?region=eu-west-1")]
    EmptyParameter(&'static str),
    /// An endpoint that is not an `http://` or `https://` URL with a host (shown with
    /// anything before an `@` hidden).
    #[error(
        "the endpoint `{0}` is not an http:// or https:// URL with a host, as in endpoint=http://127.0.0.1:8000"
    )]
    BadEndpoint(String),
    /// The prefix option is not one the store accepts.
    #[error("the prefix option: {0}")]
    Prefix(#[from] PrefixError),
}

/// A DynamoDB table a `dynamodb://` URL names, with the prefix option, checked but not
/// opened. The region, when the URL has none, and the credentials come from the
/// environment when it is opened (`AWS_REGION` or `AWS_DEFAULT_REGION`,
/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`).
///
/// ```
/// use idem_core::connect::{ConnectOptions, Location};
/// use idem_dynamodb::DynamoDbLocation;
///
/// let url = "dynamodb://Idem.Records?region=us-east-1&endpoint=http://127.0.0.1:8000";
/// let location = DynamoDbLocation::parse(url, &ConnectOptions::default())?;
/// assert_eq!(location.table(), "Idem.Records");
/// assert_eq!(location.region(), Some("us-east-1"));
/// assert_eq!(location.endpoint(), Some("http://127.0.0.1:8000"));
/// assert_eq!(location.prefix(), "");
/// assert_eq!(location.backend(), "DynamoDB");
/// # Ok::<(), idem_core::connect::UrlError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynamoDbLocation {
    /// Checked by `TableName::parse`.
    table: String,
    region: Option<String>,
    endpoint: Option<String>,
    /// Checked by `check_prefix`.
    prefix: Option<String>,
    connect_timeout: Duration,
}

impl DynamoDbLocation {
    /// Reads a `dynamodb://` URL with the prefix option (the table is in the URL, so
    /// the table option does not apply).
    ///
    /// ```
    /// use idem_core::connect::{ConnectOptions, UrlError};
    /// use idem_dynamodb::DynamoDbLocation;
    ///
    /// let refused = DynamoDbLocation::parse("dynamodb://idem", &ConnectOptions::default().table("other"));
    /// assert!(matches!(refused, Err(UrlError::OptionDoesNotApply { option: "table", .. })));
    /// ```
    ///
    /// # Errors
    /// [`UrlError::OptionDoesNotApply`] for a table, and [`UrlError::Invalid`] with a
    /// [`DynamoDbUrlError`] for a URL or a prefix the store cannot use.
    pub fn parse(url: &str, options: &ConnectOptions) -> Result<Self, UrlError> {
        if options.table.as_deref().is_some_and(|t| !t.is_empty()) {
            return Err(UrlError::OptionDoesNotApply {
                option: "table",
                backend: NAME,
            });
        }
        let invalid = |source: DynamoDbUrlError| UrlError::Invalid {
            backend: NAME,
            source: source.into(),
        };
        if let Some(prefix) = &options.prefix {
            check_prefix(prefix).map_err(|err| invalid(err.into()))?;
        }
        let rest = match url.trim().split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("dynamodb") => rest,
            _ => return Err(invalid(DynamoDbUrlError::NotDynamoDb)),
        };
        let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
        let table = table.trim_end_matches('/');
        if table.is_empty() {
            return Err(invalid(DynamoDbUrlError::NoTable));
        }
        TableName::parse(table).map_err(|err| invalid(err.into()))?;
        let (mut region, mut endpoint) = (None, None);
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (key, value) = (decode(key), decode(value));
            let (name, slot) = match key.as_str() {
                "region" => ("region", &mut region),
                "endpoint" => ("endpoint", &mut endpoint),
                _ => {
                    let key = key.chars().take(40).collect();
                    return Err(invalid(DynamoDbUrlError::UnknownParameter(key)));
                }
            };
            if value.is_empty() {
                return Err(invalid(DynamoDbUrlError::EmptyParameter(name)));
            }
            *slot = Some(value);
        }
        if let Some(endpoint) = &endpoint {
            check_endpoint(endpoint).map_err(invalid)?;
        }
        Ok(Self {
            table: table.to_owned(),
            region,
            endpoint,
            prefix: options.prefix.clone(),
            connect_timeout: options.connect_timeout,
        })
    }

    /// The table.
    ///
    /// ```
    /// # use idem_core::connect::ConnectOptions;
    /// let location = idem_dynamodb::DynamoDbLocation::parse("dynamodb://idem/", &ConnectOptions::default())?;
    /// assert_eq!(location.table(), "idem");
    /// # Ok::<(), idem_core::connect::UrlError>(())
    /// ```
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The key prefix (default none: the empty prefix).
    ///
    /// ```
    /// # use idem_core::connect::ConnectOptions;
    /// let options = ConnectOptions::default().prefix("billing#");
    /// let location = idem_dynamodb::DynamoDbLocation::parse("dynamodb://idem", &options)?;
    /// assert_eq!(location.prefix(), "billing#");
    /// # Ok::<(), idem_core::connect::UrlError>(())
    /// ```
    pub fn prefix(&self) -> &str {
        self.prefix.as_deref().unwrap_or("")
    }

    /// The URL's `region=`; none leaves it to `AWS_REGION` or `AWS_DEFAULT_REGION`.
    ///
    /// ```
    /// # use idem_core::connect::ConnectOptions;
    /// let location = idem_dynamodb::DynamoDbLocation::parse("dynamodb://idem", &ConnectOptions::default())?;
    /// assert_eq!(location.region(), None);
    /// # Ok::<(), idem_core::connect::UrlError>(())
    /// ```
    pub fn region(&self) -> Option<&str> {
        self.region.as_deref()
    }

    /// The URL's `endpoint=` (DynamoDB Local, say); none is AWS's endpoint for the region.
    ///
    /// ```
    /// # use idem_core::connect::ConnectOptions;
    /// let url = "dynamodb://idem?endpoint=http%3A%2F%2F127.0.0.1%3A8000";
    /// let location = idem_dynamodb::DynamoDbLocation::parse(url, &ConnectOptions::default())?;
    /// assert_eq!(location.endpoint(), Some("http://127.0.0.1:8000"));
    /// # Ok::<(), idem_core::connect::UrlError>(())
    /// ```
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// A client for the URL's region and endpoint, with the credentials of the standard
    /// AWS environment variables. Sends nothing.
    fn client(&self) -> Result<Client, OpenError> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let region = self
            .region
            .clone()
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .ok_or(OpenError::MissingSetting {
                what: "no AWS region: add ?region=... to the dynamodb URL or set AWS_REGION",
            })?;
        let (Some(id), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"))
        else {
            return Err(OpenError::MissingSetting {
                what: "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), for example with `eval \"$(aws configure export-credentials --format env)\"`",
            });
        };
        let credentials =
            Credentials::new(id, secret, env("AWS_SESSION_TOKEN"), None, "environment");
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(self.connect_timeout.min(MAX_CONNECT_TIMEOUT))
            .operation_attempt_timeout(ATTEMPT_TIMEOUT)
            .build();
        let mut config = Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(region))
            .credentials_provider(credentials)
            .timeout_config(timeouts);
        if let Some(endpoint) = &self.endpoint {
            config = config.endpoint_url(endpoint);
        }
        Ok(Client::from_conf(config.build()))
    }
}

/// `text` with `%XX` escapes and `+` decoded, as in a form-encoded query.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |at: usize| {
            bytes
                .get(at)
                .and_then(|b| char::from(*b).to_digit(16))
                .and_then(|d| u8::try_from(d).ok())
        };
        if bytes[i] == b'%'
            && let (Some(high), Some(low)) = (hex(i + 1), hex(i + 2))
        {
            out.push(high << 4 | low);
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `endpoint` is `http://` or `https://` with a host and no user part (which
/// could hold a password, and which DynamoDB does not take).
fn check_endpoint(endpoint: &str) -> Result<(), DynamoDbUrlError> {
    let authority = endpoint
        .split_once("://")
        .filter(|(scheme, _)| {
            scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")
        })
        .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or(""));
    let host = authority.map(|authority| {
        // `[::1]:8000` or `host:8000`: the host is what comes before the port.
        match authority.strip_prefix('[') {
            Some(v6) => v6.split_once(']').map_or("", |(host, _)| host),
            None => authority.split(':').next().unwrap_or(""),
        }
    });
    match (authority, host) {
        (Some(authority), Some(host)) if !host.is_empty() && !authority.contains('@') => Ok(()),
        _ => Err(DynamoDbUrlError::BadEndpoint(
            match endpoint.split_once('@') {
                Some((before, after)) => {
                    let scheme = before.split_once("://").map_or("", |(scheme, _)| scheme);
                    format!("{scheme}://***@{after}")
                }
                None => endpoint.to_owned(),
            },
        )),
    }
}

/// `DynamoDB table <table>[ prefix "<prefix>"][ in <region>][ at <endpoint>]`.
impl fmt::Display for DynamoDbLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DynamoDB table {}", self.table)?;
        if let Some(prefix) = &self.prefix {
            write!(f, " prefix {prefix:?}")?;
        }
        if let Some(region) = &self.region {
            write!(f, " in {region}")?;
        }
        if let Some(endpoint) = &self.endpoint {
            write!(f, " at {endpoint}")?;
        }
        Ok(())
    }
}

/// A store error for a check `parse` already passed: a bug, reported as setup.
fn setup(err: impl std::error::Error + Send + Sync + 'static) -> OpenError {
    OpenError::Store(StoreError::Misconfigured {
        operation: Operation::Setup,
        source: err.into(),
    })
}

#[async_trait]
impl Location for DynamoDbLocation {
    fn backend(&self) -> &'static str {
        NAME
    }

    /// Builds the client and the store; sends nothing, so a missing table or a wrong
    /// endpoint shows at the first request. Creates nothing (the table is `migrate`'s).
    ///
    /// # Errors
    /// [`OpenError::MissingSetting`] for no region or no credentials.
    async fn open(&self, _create: Create) -> Result<Arc<dyn Admin>, OpenError> {
        let mut builder = DynamoDbStore::builder(self.client()?, &self.table).map_err(setup)?;
        if let Some(prefix) = &self.prefix {
            builder = builder.prefix(prefix).map_err(setup)?;
        }
        Ok(Arc::new(builder.build()))
    }

    /// Creates the table when missing, with TTL on ([`create_table`]), and waits until it
    /// is active.
    async fn migrate(&self) -> Result<String, OpenError> {
        create_table(&self.client()?, &self.table).await?;
        Ok(format!(
            "{self} is active, with TTL on attribute `{}`",
            attributes::TTL
        ))
    }
}

#[cfg(test)]
mod tests {
    use idem_core::connect::parse_url;

    use super::*;

    fn parse(url: &str) -> Result<DynamoDbLocation, UrlError> {
        DynamoDbLocation::parse(url, &ConnectOptions::default())
    }

    /// The backend's own reason for refusing `url` with `options`.
    fn refusal_with(url: &str, options: ConnectOptions) -> DynamoDbUrlError {
        match DynamoDbLocation::parse(url, &options) {
            Err(UrlError::Invalid { backend, source }) => {
                assert_eq!(backend, "DynamoDB");
                *source.downcast().expect("a DynamoDbUrlError")
            }
            other => panic!("{url}: {other:?}"),
        }
    }

    fn refusal(url: &str) -> DynamoDbUrlError {
        refusal_with(url, ConnectOptions::default())
    }

    #[test]
    fn the_backend_is_named_for_messages() {
        assert_eq!(BACKEND.name(), "DynamoDB");
        assert_eq!(BACKEND.schemes(), URL_SCHEMES);
    }

    #[test]
    fn the_prefix_comes_from_the_options() {
        assert_eq!(parse("dynamodb://idem").unwrap().prefix(), "");
        let options = ConnectOptions::default().prefix("billing#");
        let location = DynamoDbLocation::parse("dynamodb://idem", &options).unwrap();
        assert_eq!(location.prefix(), "billing#");
    }

    /// What a child process of this test checks, with the environment its parent gave it:
    /// `set`, a region and credentials; `empty`, each of them set to "".
    const CHILD: &str = "IDEM_DYNAMODB_URL_TEST_CHILD";

    /// The AWS variables fill in what the URL leaves out, and one set to "" counts as
    /// unset. The environment is the process's: each case runs in a child process (this
    /// test binary, running this test alone), so no other test sees it.
    #[test]
    fn the_aws_environment_fills_what_the_url_leaves_out() {
        let location = parse("dynamodb://idem").unwrap();
        match std::env::var(CHILD).as_deref() {
            Ok("set") => {
                let client = location.client().expect("a region and credentials");
                assert_eq!(
                    client.config().region().map(|r| r.as_ref()),
                    Some("eu-west-3")
                );
                return;
            }
            Ok("empty") => {
                assert!(matches!(
                    location.client(),
                    Err(OpenError::MissingSetting { what }) if what.contains("region")
                ));
                return;
            }
            _ => {}
        }
        for (case, value) in [("set", None), ("empty", Some(""))] {
            let mut child = std::process::Command::new(std::env::current_exe().unwrap());
            child
                .args([
                    "--exact",
                    "url::tests::the_aws_environment_fills_what_the_url_leaves_out",
                    "--test-threads=1",
                ])
                .env(CHILD, case)
                .env_remove("AWS_DEFAULT_REGION")
                .env_remove("AWS_SESSION_TOKEN");
            for (name, set) in [
                ("AWS_REGION", "eu-west-3"),
                ("AWS_ACCESS_KEY_ID", "id"),
                ("AWS_SECRET_ACCESS_KEY", "secret"),
            ] {
                child.env(name, value.unwrap_or(set));
            }
            let output = child.output().unwrap();
            let said = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success() && said.contains("1 passed"),
                "{case}: {said}{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }

    #[test]
    fn every_scheme_parses() {
        let url = "dynamodb://Idem.Records?region=eu-west-1&endpoint=http://127.0.0.1:8000";
        let location = parse_url(url, &ConnectOptions::default(), &[&BACKEND]).unwrap();
        assert_eq!(location.backend(), "DynamoDB");
        assert_eq!(
            location.to_string(),
            "DynamoDB table Idem.Records in eu-west-1 at http://127.0.0.1:8000"
        );
        let location = parse(url).unwrap();
        assert_eq!(location.table(), "Idem.Records");
        assert_eq!(location.region(), Some("eu-west-1"));
        assert_eq!(location.endpoint(), Some("http://127.0.0.1:8000"));
        let bare = parse("DynamoDB://idem/").unwrap();
        assert_eq!(
            (bare.table(), bare.region(), bare.endpoint()),
            ("idem", None, None)
        );
        for endpoint in [
            "https://dynamodb.eu-west-1.amazonaws.com",
            "http://[::1]:8000/",
        ] {
            assert!(
                parse(&format!("dynamodb://idem?endpoint={endpoint}")).is_ok(),
                "{endpoint}"
            );
        }
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        assert_eq!(refusal("dynamodb://?region=x"), DynamoDbUrlError::NoTable);
        assert_eq!(refusal("dynamodb://"), DynamoDbUrlError::NoTable);
        assert_eq!(refusal("dynamo://idem"), DynamoDbUrlError::NotDynamoDb);
        assert_eq!(
            refusal("dynamodb://idem?regoin=x"),
            DynamoDbUrlError::UnknownParameter("regoin".into())
        );
        assert_eq!(
            refusal("dynamodb://idem?region="),
            DynamoDbUrlError::EmptyParameter("region")
        );
        assert_eq!(
            refusal("dynamodb://ab"),
            DynamoDbUrlError::Table(TableNameError::Length { len: 2 })
        );
        assert!(matches!(
            refusal("dynamodb://idem;drop"),
            DynamoDbUrlError::Table(_)
        ));
        for endpoint in [
            "127.0.0.1:8000",
            "ftp://h",
            "http://",
            "http://:8000",
            "http:///x",
        ] {
            assert!(
                matches!(
                    refusal(&format!("dynamodb://idem?endpoint={endpoint}")),
                    DynamoDbUrlError::BadEndpoint(_)
                ),
                "{endpoint}"
            );
        }
        let long = "p".repeat(513);
        assert_eq!(
            refusal_with("dynamodb://idem", ConnectOptions::default().prefix(long)),
            DynamoDbUrlError::Prefix(PrefixError::TooLong { len: 513 })
        );
    }

    #[test]
    fn flags_must_fit_the_backend() {
        assert!(matches!(
            DynamoDbLocation::parse("dynamodb://idem", &ConnectOptions::default().table("t")),
            Err(UrlError::OptionDoesNotApply {
                option: "table",
                backend: "DynamoDB"
            })
        ));
        // An exported but empty table option names no table.
        assert!(
            DynamoDbLocation::parse("dynamodb://idem", &ConnectOptions::default().table(""))
                .is_ok()
        );
        let prefixed =
            DynamoDbLocation::parse("dynamodb://idem", &ConnectOptions::default().prefix("a#"))
                .unwrap();
        assert_eq!(prefixed.to_string(), "DynamoDB table idem prefix \"a#\"");
    }

    #[test]
    fn passwords_never_show() {
        let bad = refusal("dynamodb://idem?endpoint=http://user:hunter2@127.0.0.1:8000");
        assert!(!bad.to_string().contains("hunter2"), "{bad}");
        assert!(
            bad.to_string().contains("http://***@127.0.0.1:8000"),
            "{bad}"
        );
    }

    #[test]
    fn queries_decode_as_forms_do() {
        assert_eq!(decode("http%3A%2F%2Fh%3A8000"), "http://h:8000");
        assert_eq!(decode("a+b%2"), "a b%2");
        assert_eq!(decode("%zz%4"), "%zz%4");
    }
}
