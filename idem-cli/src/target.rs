//! Which store a URL names, checked before anything connects. Each backend crate reads
//! its own schemes; this is only the list of them.

use idem_core::connect::{self, Backend, ConnectOptions, Location, UrlError};

/// The backends this command opens, one line each.
const BACKENDS: &[&dyn Backend] = &[
    &idem_sqlite::BACKEND,
    &idem_postgres::BACKEND,
    &idem_redis::BACKEND,
    &idem_dynamodb::BACKEND,
];

/// The store `url` names, with the `--table` and `--prefix` flags it takes.
pub(crate) fn parse(
    url: Option<&str>,
    table: Option<&str>,
    prefix: Option<&str>,
) -> Result<Box<dyn Location>, UrlError> {
    parse_with(url, table, prefix, ConnectOptions::default())
}

/// [`parse`], starting from `options` (a pool's size, say).
pub(crate) fn parse_with(
    url: Option<&str>,
    table: Option<&str>,
    prefix: Option<&str>,
    mut options: ConnectOptions,
) -> Result<Box<dyn Location>, UrlError> {
    // An empty IDEM_TABLE (exported, then cleared) means none; no table is named "".
    if let Some(table) = table.filter(|table| !table.is_empty()) {
        options = options.table(table);
    }
    if let Some(prefix) = prefix {
        options = options.prefix(prefix);
    }
    connect::parse_url(url.unwrap_or(""), &options, BACKENDS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheme_has_its_backend() {
        for (url, backend) in [
            ("sqlite:///var/lib/idem.db", "SQLite"),
            ("postgres://u@127.0.0.1/db", "PostgreSQL"),
            ("postgresql://u@127.0.0.1/db", "PostgreSQL"),
            ("redis://127.0.0.1:6379/0", "Redis"),
            ("redis+cluster://127.0.0.1:7001", "Redis Cluster"),
            ("dynamodb://idem?region=eu-west-1", "DynamoDB"),
        ] {
            assert_eq!(
                parse(Some(url), None, None).unwrap().backend(),
                backend,
                "{url}"
            );
        }
        // No two backends claim a scheme.
        let mut schemes: Vec<_> = BACKENDS.iter().flat_map(|b| b.schemes()).collect();
        let all = schemes.len();
        schemes.sort();
        schemes.dedup();
        assert_eq!(schemes.len(), all);
    }

    #[test]
    fn bad_urls_and_flags_are_refused() {
        assert!(matches!(parse(None, None, None), Err(UrlError::Missing)));
        assert!(matches!(
            parse(Some("  "), None, None),
            Err(UrlError::Missing)
        ));
        assert!(matches!(
            parse(Some("mysql://x"), None, None),
            Err(UrlError::UnknownScheme { scheme, .. }) if scheme == "mysql"
        ));
        assert!(matches!(
            parse(Some("idem.db"), None, None),
            Err(UrlError::UnknownScheme { .. })
        ));
        assert!(matches!(
            parse(Some("redis://127.0.0.1"), Some("t"), None),
            Err(UrlError::OptionDoesNotApply {
                option: "table",
                ..
            })
        ));
        // An exported but empty IDEM_TABLE names no table.
        assert!(parse(Some("redis://127.0.0.1"), Some(""), None).is_ok());
    }
}
