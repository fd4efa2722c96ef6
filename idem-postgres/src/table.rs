//! The configurable table name, validated so it can be spliced into SQL safely.

use std::fmt;

/// The table name used when none is configured.
pub const DEFAULT_TABLE: &str = "idem_records";

/// Why a table name was refused. Reserved words are accepted: every name is quoted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TableNameError {
    /// The name (or its schema part) was empty.
    #[error("the table name is empty; use a name such as `idem_records` or `app.idem_records`")]
    Empty,
    /// A part was longer than PostgreSQL's 63-byte identifier limit (index names built
    /// from it need room too, so the table part is held to 40 bytes).
    #[error("`{part}` is {len} bytes long, over the limit of {max} bytes")]
    TooLong {
        /// The offending part.
        part: String,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A part held something other than ASCII letters, digits and underscores, or began
    /// with a digit.
    #[error(
        "`{part}` is not a plain identifier: use ASCII letters, digits and underscores, not starting with a digit"
    )]
    NotAnIdentifier {
        /// The offending part.
        part: String,
    },
}

/// A table name: `table` or `schema.table`, each part a plain identifier, folded to lower
/// case as PostgreSQL folds unquoted names, and always written quoted, so that reserved
/// words (`order`, `user`) are names like any other.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct TableName {
    /// `"schema"."table"` or `"table"`.
    qualified: String,
    /// The schema part, quoted (`"schema"`) and as stored in `pg_namespace`, when the
    /// name has one.
    schema: Option<(String, String)>,
    /// The table part, unquoted.
    table: String,
}

fn check(part: &str, max: usize) -> Result<(), TableNameError> {
    if part.is_empty() {
        return Err(TableNameError::Empty);
    }
    if part.len() > max {
        return Err(TableNameError::TooLong {
            part: part.to_owned(),
            len: part.len(),
            max,
        });
    }
    let mut chars = part.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(TableNameError::NotAnIdentifier {
            part: part.to_owned(),
        });
    }
    Ok(())
}

impl TableName {
    pub(crate) fn parse(name: &str) -> Result<Self, TableNameError> {
        let (schema, table) = match name.split_once('.') {
            Some((schema, table)) => (Some(schema), table),
            None => (None, name),
        };
        if let Some(schema) = schema {
            check(schema, 63)?;
        }
        check(table, 40)?;
        // Validated parts hold no quote, so wrapping them in quotes is all quoting needs.
        let quote = |part: &str| format!("\"{}\"", part.to_ascii_lowercase());
        let qualified = match schema {
            Some(schema) => format!("{}.{}", quote(schema), quote(table)),
            None => quote(table),
        };
        Ok(Self {
            qualified,
            schema: schema.map(|schema| (quote(schema), schema.to_ascii_lowercase())),
            table: table.to_ascii_lowercase(),
        })
    }

    /// The name to write in SQL, quoted: `"schema"."table"` or `"table"`.
    pub(crate) fn qualified(&self) -> &str {
        &self.qualified
    }

    /// The schema part, quoted, when the name has one.
    pub(crate) fn schema(&self) -> Option<&str> {
        self.schema.as_ref().map(|(quoted, _)| quoted.as_str())
    }

    /// The schema part as `pg_namespace.nspname` holds it, when the name has one.
    pub(crate) fn schema_name(&self) -> Option<&str> {
        self.schema.as_ref().map(|(_, name)| name.as_str())
    }

    /// An index of this table named `<table>-<what>`, quoted. The `-` cannot appear in a
    /// table name idem accepts, so an index name never equals another idem table's name
    /// (tables and indexes share one namespace per schema), and two tables' indexes
    /// never meet.
    pub(crate) fn index(&self, what: &str) -> String {
        format!("\"{}-{what}\"", self.table)
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.qualified)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_qualified_and_reserved_names_and_quotes_them() {
        assert_eq!(
            TableName::parse("idem_records").unwrap().qualified(),
            "\"idem_records\""
        );
        let qualified = TableName::parse("Billing.Idem_2").unwrap();
        assert_eq!(qualified.qualified(), "\"billing\".\"idem_2\"");
        assert_eq!(qualified.index("expires_at"), "\"idem_2-expires_at\"");
        for reserved in ["order", "user", "select.table"] {
            assert!(TableName::parse(reserved).is_ok(), "{reserved}");
        }
    }

    #[test]
    fn refuses_anything_that_could_be_sql() {
        for bad in [
            "",
            "a;drop table x",
            "1abc",
            "a b",
            "a.b.c",
            "\"q\"",
            "a-b",
            "é",
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            TableName::parse(&"t".repeat(41)),
            Err(TableNameError::TooLong {
                len: 41,
                max: 40,
                ..
            })
        ));
        // The longest of each part is accepted.
        let longest = format!("{}.{}", "s".repeat(63), "t".repeat(40));
        assert!(TableName::parse(&longest).is_ok(), "{longest}");
        assert!(matches!(
            TableName::parse(&format!("{}.t", "s".repeat(64))),
            Err(TableNameError::TooLong {
                len: 64,
                max: 63,
                ..
            })
        ));
    }
}
