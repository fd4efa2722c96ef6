//! Opening a database: what a path may be, and what a file from another idem gets.

mod common;

use idem_core::StoreError;
use idem_sqlite::{SCHEMA_VERSION, SqliteStore, rusqlite};

#[test]
fn a_database_from_a_newer_idem_is_refused_and_left_as_it_is() {
    let path = common::fresh_db_path();
    drop(SqliteStore::open(&path).expect("a fresh database opens"));
    let newer = SCHEMA_VERSION + 1;
    let connection = rusqlite::Connection::open(&path).expect("open the file directly");
    connection
        .execute("INSERT INTO idem_schema (version) VALUES (?1)", [newer])
        .expect("record a newer schema version");
    drop(connection);

    let err = SqliteStore::open(&path).expect_err("a newer schema must be refused");
    assert!(
        matches!(err, StoreError::Misconfigured { .. }),
        "a newer schema answered {err:?}, not Misconfigured"
    );
    let message = format!("{err} {:?}", std::error::Error::source(&err));
    assert!(
        message.contains(&format!("version {newer}")) && message.contains("upgrade idem-sqlite"),
        "the error names the version found and what to do: {message}"
    );
    let connection = rusqlite::Connection::open(&path).expect("open the file directly");
    let versions: Vec<i64> = connection
        .prepare("SELECT version FROM idem_schema ORDER BY version")
        .and_then(|mut statement| {
            statement
                .query_map([], |row| row.get(0))?
                .collect::<Result<_, _>>()
        })
        .expect("read the schema versions");
    assert_eq!(
        versions,
        vec![SCHEMA_VERSION, newer],
        "the refusal wrote nothing"
    );
}

#[test]
fn a_database_of_this_version_opens_again() {
    let path = common::fresh_db_path();
    drop(SqliteStore::open(&path).expect("a fresh database opens"));
    SqliteStore::open(&path).expect("the same version opens again");
}

/// A path that starts with `file:` is an SQLite URI: the file is the URI's path, not a
/// file named after the whole string.
#[test]
fn a_file_uri_names_the_file() {
    let path = common::fresh_db_path();
    let uri = format!("file:{}?cache=private", path.display());
    drop(SqliteStore::open(&uri).expect("a file: URI opens"));
    assert!(
        path.exists(),
        "the URI's path {} was created",
        path.display()
    );

    assert!(
        !std::path::Path::new(&uri).exists(),
        "no file is named after the whole URI"
    );
}

/// A store and its builder print where the database is and their settings (in logs and
/// panics), and nothing of what it holds.
#[test]
fn a_store_and_its_builder_print_their_location() {
    let path = common::fresh_db_path();
    let builder = SqliteStore::builder(&path).busy_timeout(std::time::Duration::from_secs(7));
    let printed = format!("{builder:?}");
    assert!(
        printed.starts_with("SqliteStoreBuilder")
            && printed.contains(&path.display().to_string())
            && printed.contains("7s"),
        "{printed}"
    );
    let store = builder.build().expect("the database opens");
    let printed = format!("{store:?}");
    assert!(
        printed.starts_with("SqliteStore") && printed.contains(&path.display().to_string()),
        "{printed}"
    );
    let printed = format!("{:?}", SqliteStore::open_in_memory().expect("in memory"));
    assert!(printed.contains(":memory:"), "{printed}");
}
