//! The crate docs' permissions list every DynamoDB action the crate sends, and only those:
//! a new call to the SDK without its line there fails here, so an IAM policy written from
//! the docs is never short of an action.

use std::collections::BTreeSet;
use std::path::Path;

/// DynamoDB's operations, as the SDK's client names them (its fluent builders).
const OPERATIONS: &[&str] = &[
    "batch_execute_statement",
    "batch_get_item",
    "batch_write_item",
    "create_backup",
    "create_global_table",
    "create_table",
    "delete_backup",
    "delete_item",
    "delete_resource_policy",
    "delete_table",
    "describe_backup",
    "describe_continuous_backups",
    "describe_endpoints",
    "describe_table",
    "describe_time_to_live",
    "execute_statement",
    "execute_transaction",
    "get_item",
    "get_resource_policy",
    "list_tables",
    "put_item",
    "put_resource_policy",
    "query",
    "scan",
    "tag_resource",
    "transact_get_items",
    "transact_write_items",
    "untag_resource",
    "update_continuous_backups",
    "update_item",
    "update_table",
    "update_time_to_live",
];

/// `update_time_to_live` as IAM names it: `UpdateTimeToLive`.
fn action(operation: &str) -> String {
    operation
        .split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

fn sources(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("the crate's sources are readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(std::fs::read_to_string(&path).expect("a source file"));
        }
    }
}

/// The operations the crate's sources call: `.get_item()` and the like, across lines.
fn called() -> BTreeSet<String> {
    let mut texts = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut texts,
    );
    let mut found = BTreeSet::new();
    for text in texts {
        let joined: String = text.split_whitespace().collect();
        for operation in OPERATIONS {
            if joined.contains(&format!(".{operation}()")) {
                found.insert(action(operation));
            }
        }
    }
    found
}

/// The actions the crate docs' "Permissions" section names.
fn documented() -> BTreeSet<String> {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("lib.rs");
    let section = lib
        .split("//! ## Permissions")
        .nth(1)
        .and_then(|rest| rest.split("//! ## ").next())
        .expect("the crate docs have a Permissions section");
    section
        .split("dynamodb:")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(char::is_ascii_alphanumeric)
                .collect::<String>()
        })
        // An action's name, not an ARN's region or placeholder (`dynamodb:eu-west-1`,
        // `dynamodb:REGION`).
        .filter(|name| {
            name.starts_with(|c: char| c.is_ascii_uppercase())
                && name.contains(|c: char| c.is_ascii_lowercase())
        })
        .collect()
}

#[test]
fn the_documented_actions_are_the_ones_the_crate_sends() {
    let called = called();
    // The scan would find nothing if the SDK's calls were written another way: the
    // crate is known to claim with `UpdateItem` and to create its table.
    assert!(
        called.contains("UpdateItem") && called.contains("CreateTable"),
        "{called:?}"
    );
    assert_eq!(
        documented(),
        called,
        "the crate docs' Permissions section must name exactly the actions the sources send"
    );
}

#[test]
fn an_action_is_named_as_iam_names_it() {
    assert_eq!(action("update_time_to_live"), "UpdateTimeToLive");
    assert_eq!(action("scan"), "Scan");
}
