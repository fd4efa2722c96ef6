//! Creating and versioning idem's tables.

use idem_core::{StoreError, store::Operation};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use crate::errors::map;

const SCHEMA: &str = include_str!("../sql/schema.sql");

/// The schema version this crate writes. Bump it with a migration step below.
pub const SCHEMA_VERSION: i64 = 1;

/// Creates the tables when missing and checks the recorded version, in one transaction so
/// that processes opening the same file at once do not race.
pub(crate) fn migrate(connection: &mut Connection) -> Result<(), StoreError> {
    let setup = |err| map(Operation::Setup, err);
    let tx = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(setup)?;
    tx.execute_batch(SCHEMA).map_err(setup)?;
    let found: Option<i64> = tx
        .query_row("SELECT max(version) FROM idem_schema", [], |row| row.get(0))
        .optional()
        .map_err(setup)?
        .flatten();
    match found {
        None => {
            tx.execute(
                "INSERT INTO idem_schema (version) VALUES (?1)",
                [SCHEMA_VERSION],
            )
            .map_err(setup)?;
        }
        Some(version) if version == SCHEMA_VERSION => {}
        Some(version) => {
            return Err(StoreError::Misconfigured {
                operation: Operation::Setup,
                source: format!(
                    "the database holds idem schema version {version}, and this build of \
                     idem-sqlite knows version {SCHEMA_VERSION}; upgrade idem-sqlite"
                )
                .into(),
            });
        }
    }
    tx.commit().map_err(setup)
}
