//! `idem inspect SCOPE KEY`: one record in detail.

use std::io::Write;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use idem_core::connect::Location;
use idem_core::{Key, Record, StoreError, Timestamp};

use super::Store;
use crate::cli::InspectArgs;
use crate::failure::Failure;
use crate::render::{self, RecordJson};

pub(super) async fn run(
    store: &Store,
    target: &dyn Location,
    key: &Key,
    args: &InspectArgs,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let mut record = match store.get(key).await {
        Ok(Some(record)) => record,
        Ok(None) => return Err(not_found(target)),
        // A record idem did not write: show it as stored, then fail with why.
        Err(err @ StoreError::Corrupt { .. }) => {
            let raw = store.raw(key).await.map_err(Failure::store(target))?;
            if let Some(fields) = raw {
                show_raw(&err, &fields, args.json, out)?;
            }
            return Err(Failure::store(target)(err));
        }
        Err(err) => return Err(Failure::store(target)(err)),
    };
    // The store's clock would be better; reads do not return it, and a second of skew
    // only moves "in 20s" to "in 19s".
    let now = Timestamp::now();
    let response_len = record.response.as_ref().map(Vec::len);
    if !args.show_response {
        record.response = None;
    }
    let derived: Vec<(&str, String)> = args
        .derive
        .iter()
        .map(|label| (label.as_str(), record.derive(label)))
        .collect();
    if args.json {
        let mut json = serde_json::to_value(RecordJson::new(&record, response_len, true, now))
            .map_err(|err| Failure::Output(err.into()))?;
        if !derived.is_empty() {
            json["derived_keys"] = derived
                .iter()
                .map(|(label, key)| ((*label).to_owned(), serde_json::Value::from(key.as_str())))
                .collect::<serde_json::Map<_, _>>()
                .into();
        }
        serde_json::to_writer_pretty(&mut *out, &json)
            .map_err(|err| Failure::Output(err.into()))?;
        writeln!(out)?;
        return Ok(());
    }
    write!(out, "{}", details(&record, response_len, now))?;
    if args.show_steps {
        for (name, value) in &record.steps {
            writeln!(
                out,
                "{:<12} {name}: {}",
                "step value",
                text_or_base64(value)
            )?;
        }
    }
    for (label, key) in &derived {
        writeln!(out, "{:<12} {label}: {key}", "derived key")?;
    }
    if let Some(response) = &record.response {
        writeln!(out, "response body:\n{}", text_or_base64(response))?;
    }
    Ok(())
}

/// A record that does not decode, field by field as stored.
fn show_raw(
    err: &StoreError,
    fields: &[(String, String)],
    json: bool,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    if json {
        let stored: serde_json::Map<String, serde_json::Value> = fields
            .iter()
            .map(|(name, value)| (name.clone(), serde_json::Value::from(value.as_str())))
            .collect();
        let shown =
            serde_json::json!({"decodes": false, "error": err.to_string(), "stored": stored});
        serde_json::to_writer_pretty(&mut *out, &shown).map_err(|e| Failure::Output(e.into()))?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "this record does not decode: {err}")?;
    writeln!(out, "as stored:")?;
    for (name, value) in fields {
        writeln!(out, "  {name:<14} {value}")?;
    }
    Ok(())
}

/// Bytes as text when they are UTF-8, else as base64 (marked so).
fn text_or_base64(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => format!("(binary, base64) {}", BASE64.encode(bytes)),
    }
}

pub(super) fn not_found(target: &dyn Location) -> Failure {
    Failure::NotFound {
        what: format!(
            "no record for that key in {target}: never claimed, deleted, or expired (check the scope, the key and --table/--prefix)"
        ),
    }
}

/// The record as `key: value` lines. The key is shown in full: the operator typed it.
pub(super) fn details(record: &Record, response_len: Option<usize>, now: Timestamp) -> String {
    let mut lines = vec![
        ("scope", record.key.scope().to_owned()),
        ("key", record.key.key().to_owned()),
        ("state", record.state.as_str().to_owned()),
        ("lease", render::lease(record, now)),
        ("token", record.token.to_string()),
        ("attempt", render::hex(record.attempt.as_bytes())),
        ("fingerprint", render::fingerprint_prefix(record)),
        (
            "created",
            format!(
                "{} ({})",
                render::time(record.created_at),
                render::relative(record.created_at, now)
            ),
        ),
        (
            "expires",
            format!(
                "{} ({})",
                render::time(record.expires_at),
                render::relative(record.expires_at, now)
            ),
        ),
        ("lease until", render::time(record.lease_until)),
    ];
    let steps = if record.steps.is_empty() {
        "none".to_owned()
    } else {
        record
            .steps
            .iter()
            .map(|(name, value)| format!("{name} ({} B)", value.len()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    lines.push(("steps", steps));
    lines.push((
        "response",
        response_len.map_or_else(|| "none".to_owned(), |n| format!("{n} B")),
    ));
    lines
        .into_iter()
        .map(|(name, value)| format!("{name:<12} {value}\n"))
        .collect()
}
