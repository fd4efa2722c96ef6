//! The `Store` trait's docs are the contract a store author writes against, and
//! idem-testkit's conformance suite is what holds a store to it: the two must say the
//! same. (A test of the workspace, here in the unpublished guide crate: it reads
//! idem-core's source, which a published crate would not find.) Each bullet of each method's
//! docs ends with "Checked by `case`, `other_case`." naming the conformance cases that
//! check it, and every case that checks the store itself (not the driver) is named by
//! some bullet, so a new case needs a bullet too.

use std::collections::HashSet;

use idem_testkit::Case;

const STORE_DOCS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../idem-core/src/store/mod.rs"
);

/// One bullet of a method's docs, its lines joined.
struct Bullet {
    method: String,
    text: String,
}

/// The bullets of every method of `pub trait Store` in `source`: lines starting with
/// `    /// - `, each with its continuation lines (`    ///   `).
fn bullets(source: &str) -> Vec<Bullet> {
    let body = source
        .split_once("pub trait Store")
        .map_or("", |(_, body)| body);
    let mut found = Vec::new();
    // The bullets of the doc comment being read; the method comes after them.
    let mut pending: Vec<String> = Vec::new();
    let mut in_bullet = false;
    for line in body.lines() {
        if let Some(start) = line.strip_prefix("    /// - ") {
            pending.push(start.trim().to_owned());
            in_bullet = true;
            continue;
        }
        if let (true, Some(more), Some(last)) = (
            in_bullet,
            line.strip_prefix("    ///   "),
            pending.last_mut(),
        ) {
            last.push(' ');
            last.push_str(more.trim());
            continue;
        }
        in_bullet = false;
        let code = line.trim_start();
        if let Some(signature) = code
            .strip_prefix("async fn ")
            .or_else(|| code.strip_prefix("fn "))
        {
            let method = signature.split('(').next().unwrap_or(signature);
            found.extend(pending.drain(..).map(|text| Bullet {
                method: method.to_owned(),
                text,
            }));
        } else if line == "}" {
            break; // the end of the trait
        }
    }
    found
}

/// The methods of `pub trait Store` in `source`.
fn methods(source: &str) -> Vec<String> {
    let body = source
        .split_once("pub trait Store")
        .map_or("", |(_, body)| body);
    let body = body.split_once("\n}").map_or(body, |(body, _)| body);
    body.lines()
        .filter_map(|line| {
            let code = line.trim_start();
            let signature = code
                .strip_prefix("async fn ")
                .or_else(|| code.strip_prefix("fn "))?;
            Some(signature.split('(').next().unwrap_or(signature).to_owned())
        })
        .collect()
}

/// The cases a bullet names in the sentence it must end with, "Checked by `a`, `b`.";
/// `None` when it does not end so.
fn named_cases(text: &str) -> Option<Vec<&str>> {
    let (_, list) = text.rsplit_once("Checked by ")?;
    list.strip_suffix('.')?
        .split(", ")
        .map(|name| name.strip_prefix('`')?.strip_suffix('`'))
        .collect()
}

/// Every way the docs in `source` and the suite disagree, one message each.
fn problems(source: &str) -> Vec<String> {
    let cases: HashSet<&str> = Case::ALL.iter().map(|case| case.name()).collect();
    let mut named: HashSet<String> = HashSet::new();
    let mut problems = Vec::new();
    let bullets = bullets(source);
    for method in methods(source) {
        if !bullets.iter().any(|bullet| bullet.method == method) {
            problems.push(format!(
                "`Store::{method}` has no bullet: list what it does, each with its cases"
            ));
        }
    }
    for Bullet { method, text } in bullets {
        let opening: Vec<&str> = text.split_whitespace().take(6).collect();
        let bullet = format!("`Store::{method}`: the bullet \"{}…\"", opening.join(" "));
        let Some(names) = named_cases(&text) else {
            problems.push(format!(
                "{bullet} names no case: end it with \"Checked by `case`.\""
            ));
            continue;
        };
        // An unknown name is reported below, with every "Checked by" of the file.
        named.extend(names.into_iter().map(str::to_owned));
    }
    // The trait-level paragraphs name their cases too; a name there must be a case.
    let docs: Vec<&str> = source
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("///"))
        .map(str::trim)
        .collect();
    let docs = docs.join(" ");
    for sentence in docs.split("Checked by ").skip(1) {
        let list = sentence.split_once('.').map_or(sentence, |(list, _)| list);
        for name in list.split(", ") {
            let name = name.trim_matches('`');
            if !cases.contains(name) {
                problems.push(format!("\"Checked by\" names `{name}`, which is no case"));
            }
        }
    }
    // Driver cases check what the driver does with a store, not a method's contract.
    for case in Case::ALL {
        if !case.description().starts_with("Driver") && !named.contains(case.name()) {
            problems.push(format!(
                "the case `{}` is named by no bullet of the `Store` trait: say there what it \
                 checks",
                case.name()
            ));
        }
    }
    problems
}

#[test]
fn every_store_bullet_names_the_cases_that_check_it() {
    let source = std::fs::read_to_string(STORE_DOCS)
        .unwrap_or_else(|err| panic!("cannot read {STORE_DOCS}: {err}"));
    let problems = problems(&source);
    assert!(
        problems.is_empty(),
        "the `Store` trait's docs (idem-core/src/store/mod.rs) and the conformance suite \
         disagree:\n{}",
        problems.join("\n")
    );
}

#[test]
fn a_bullet_without_a_case_is_reported() {
    let docs = "\
/// The contract. Checked by `matches_the_state_machine`, `no_such_paragraph_case`.
pub trait Store: Send + Sync {
    /// Claims a key.
    ///
    /// - A bullet that ends with its case. Checked by
    ///   `absent_key_is_claimed_fresh`.
    /// - A bullet that names none, its case forgotten
    ///   on the way.
    /// - A bullet that names a case the suite lacks. Checked by `no_such_case`.
    async fn claim(&self);

    /// A method whose docs list nothing.
    async fn renew(&self);
}
";
    let problems = problems(docs);
    let reported = |words: &str| problems.iter().any(|problem| problem.contains(words));
    assert!(
        reported("`Store::claim`: the bullet \"A bullet that names none, its…\" names no case"),
        "{problems:#?}"
    );
    assert!(
        reported("names `no_such_case`, which is no case"),
        "{problems:#?}"
    );
    assert!(
        reported("names `no_such_paragraph_case`, which is no case"),
        "{problems:#?}"
    );
    assert!(
        !reported("`matches_the_state_machine`, which"),
        "{problems:#?}"
    );
    assert!(reported("`Store::renew` has no bullet"), "{problems:#?}");
    assert!(!reported("`Store::claim` has no bullet"), "{problems:#?}");
    assert!(!reported("ends with its case"), "{problems:#?}");
    assert!(
        reported("`live_lease_is_in_flight` is named by no bullet"),
        "{problems:#?}"
    );
    assert!(
        !reported("steps_run_once_across_takeovers"),
        "a driver case needs no bullet: {problems:#?}"
    );
}
