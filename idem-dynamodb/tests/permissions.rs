//! The crate docs' permissions name, for each role, the DynamoDB actions that role's code
//! sends, and only those; the policy shown for a service is the service's row. A new call
//! to the SDK without its action in the docs fails here, so an IAM policy written from
//! them is not short of an action the crate's own calls need.
//!
//! What it reads: the crate's sources, for calls written as `.operation()` (as every call
//! in the crate is), outside comments. A call written another way (`Client::get_item(&c)`)
//! would not be seen.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Every operation of the SDK's DynamoDB client (aws-sdk-dynamodb 1.136), as it names
/// its fluent builders.
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
    "describe_contributor_insights",
    "describe_endpoints",
    "describe_export",
    "describe_global_table",
    "describe_global_table_settings",
    "describe_import",
    "describe_kinesis_streaming_destination",
    "describe_limits",
    "describe_table",
    "describe_table_replica_auto_scaling",
    "describe_time_to_live",
    "disable_kinesis_streaming_destination",
    "enable_kinesis_streaming_destination",
    "execute_statement",
    "execute_transaction",
    "export_table_to_point_in_time",
    "get_item",
    "get_resource_policy",
    "import_table",
    "list_backups",
    "list_contributor_insights",
    "list_exports",
    "list_global_tables",
    "list_imports",
    "list_tables",
    "list_tags_of_resource",
    "put_item",
    "put_resource_policy",
    "query",
    "restore_table_from_backup",
    "restore_table_to_point_in_time",
    "scan",
    "search_vectors",
    "tag_resource",
    "transact_get_items",
    "transact_write_items",
    "untag_resource",
    "update_continuous_backups",
    "update_contributor_insights",
    "update_global_table",
    "update_global_table_settings",
    "update_item",
    "update_kinesis_streaming_destination",
    "update_table",
    "update_table_replica_auto_scaling",
    "update_time_to_live",
];

/// `update_time_to_live` as IAM names it: `UpdateTimeToLive`.
fn action(operation: &str) -> String {
    // PartiQL's operations are authorised by other actions (`PartiQLSelect` and the like):
    // a call to one needs its actions mapped by hand here and in the docs.
    assert!(
        ![
            "execute_statement",
            "batch_execute_statement",
            "execute_transaction"
        ]
        .contains(&operation),
        "{operation}: map this PartiQL operation to its IAM actions"
    );
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

fn source(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// Every `.rs` file under `dir`, recursively.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the crate's sources are readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The code of a source, without its comments, whitespace taken out, so that a call
/// split over lines (`self.client\n.get_item()`) reads as one. A line is cut at its first
/// `//`, inside a string too (a URL): no file that sends a request has one before a call.
fn code(text: &str) -> String {
    text.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .flat_map(str::split_whitespace)
        .collect()
}

/// The IAM actions of the SDK operations `text` calls.
fn actions_called(text: &str) -> BTreeSet<String> {
    let code = code(text);
    OPERATIONS
        .iter()
        .filter(|operation| code.contains(&format!(".{operation}()")))
        .map(|operation| action(operation))
        .collect()
}

/// The crate's own helpers that send a request, and the action each sends: a file that
/// calls one needs that action without naming the SDK's call itself.
const HELPERS: &[(&str, &str)] = &[
    (".read(", "GetItem"),
    (".update(", "UpdateItem"),
    (".fenced(", "UpdateItem"),
    (".expiry_write(", "UpdateItem"),
    (".delete_if_purgeable(", "DeleteItem"),
];

/// Each role's row (how it starts in the docs' table) and the files its code runs.
const ROLES: &[(&str, &[&str])] = &[
    (
        "a service",
        &[
            "store.rs",
            "store/claim.rs",
            "store/finish.rs",
            "store/release.rs",
            "store/renew.rs",
            "store/checkpoint.rs",
        ],
    ),
    ("a purger", &["store/purge.rs"]),
    ("an operator", &["admin.rs"]),
    ("whoever creates the table", &["table.rs"]),
];

/// What the code of `text` sends: its SDK calls, and those of the helpers it calls.
fn sent(text: &str) -> BTreeSet<String> {
    let mut actions = actions_called(text);
    let code = code(text);
    for (helper, action) in HELPERS {
        if code.contains(helper) {
            actions.insert((*action).to_owned());
        }
    }
    actions
}

/// What a role's files send.
fn role_actions(files: &[&str]) -> BTreeSet<String> {
    files.iter().flat_map(|file| sent(&source(file))).collect()
}

/// The crate docs' "Permissions" section.
fn section() -> String {
    let lib = source("lib.rs");
    lib.split("//! ## Permissions")
        .nth(1)
        .and_then(|rest| rest.split("//! ## ").next())
        .expect("the crate docs have a Permissions section")
        .to_owned()
}

/// The `dynamodb:` actions `text` names (not an ARN's region or placeholder).
fn named(text: &str) -> BTreeSet<String> {
    text.split("dynamodb:")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(char::is_ascii_alphanumeric)
                .collect::<String>()
        })
        .filter(|name| {
            name.starts_with(|c: char| c.is_ascii_uppercase())
                && name.contains(|c: char| c.is_ascii_lowercase())
        })
        .collect()
}

/// The actions the row of the role table that starts with `who` names.
fn row(section: &str, who: &str) -> BTreeSet<String> {
    let line = section
        .lines()
        .find(|line| line.starts_with(&format!("//! | {who}")))
        .unwrap_or_else(|| panic!("a row for {who}"));
    named(line.split('|').nth(2).expect("an actions cell"))
}

#[test]
fn each_role_is_documented_with_the_actions_its_code_sends() {
    let section = section();
    for (who, files) in ROLES {
        assert_eq!(row(&section, who), role_actions(files), "the row of {who}");
    }
    // The scan would find nothing if the calls were written another way: a claim is
    // known to be an `UpdateItem`.
    let service = role_actions(ROLES[0].1);
    assert!(service.contains("UpdateItem"), "{service:?}");
    // The policy shown for a service is its row.
    let policy = section
        .split("```json")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a service's policy");
    assert_eq!(named(policy), service, "the service's policy");
}

#[test]
fn every_file_that_sends_a_request_belongs_to_a_documented_role() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    files(&root, &mut paths);
    let in_a_role: BTreeSet<&str> = ROLES
        .iter()
        .flat_map(|(_, files)| files.iter().copied())
        .collect();
    let mut called = BTreeSet::new();
    for path in &paths {
        let text = std::fs::read_to_string(path).unwrap();
        let sends = sent(&text);
        let relative = path
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if !actions_called(&text).is_empty() || !sends.is_empty() {
            assert!(
                in_a_role.contains(relative.as_str()),
                "{relative} sends {sends:?} but belongs to no role in this test and the docs"
            );
        }
        called.extend(actions_called(&text));
    }
    assert!(called.contains("CreateTable"), "{called:?}");
    assert_eq!(
        named(&section()),
        called,
        "the Permissions section must name exactly the actions the sources send"
    );
}

#[test]
fn an_action_is_named_as_iam_names_it() {
    assert_eq!(action("update_time_to_live"), "UpdateTimeToLive");
    assert_eq!(action("scan"), "Scan");
    assert!(std::panic::catch_unwind(|| action("execute_statement")).is_err());
    assert_eq!(
        code("a // .get_item()\n  b.\n scan()"),
        "ab.scan()",
        "comments left out, lines joined"
    );
}
