//! `idem inspect SCOPE KEY`: one record in detail.

use std::io::Write;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use idem_core::connect::Location;
use idem_core::{Key, Record, StoreError, Timestamp};
use idem_http::StoredResponse;

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
        Ok(None) => return Err(not_found(target, key)),
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
        if let Some(http) = record
            .response
            .as_deref()
            .and_then(|r| StoredResponse::decode(r).ok())
        {
            json["http_response"] = http_json(&http);
        }
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
        match StoredResponse::decode(response) {
            Ok(http) => write!(out, "{}", http_response(&http))?,
            Err(_) => writeln!(out, "response body:\n{}", text_or_base64(response))?,
        }
    }
    Ok(())
}

/// An idem-http record's response as the client got it: status, headers, body, trailers.
fn http_response(response: &StoredResponse) -> String {
    let mut text = format!("response:    HTTP {}\n", response.status);
    for (name, value) in &response.headers {
        text += &format!("  {name}: {}\n", text_or_base64(value.as_bytes()));
    }
    if response.body_too_large {
        text += "  (body not stored: it was over the replay limit; retries get the status and headers)\n";
    } else if !response.body.is_empty() {
        text += &format!("\n{}\n", text_or_base64(&response.body));
    }
    for (name, value) in &response.trailers {
        text += &format!("  trailer {name}: {}\n", text_or_base64(value.as_bytes()));
    }
    text
}

/// An idem-http record's response for `--json`: text stays text, other bytes are base64.
fn http_json(response: &StoredResponse) -> serde_json::Value {
    let fields = |headers: &http::HeaderMap| {
        headers
            .iter()
            .map(|(name, value)| {
                serde_json::json!([name.as_str(), text_or_base64(value.as_bytes())])
            })
            .collect::<Vec<_>>()
    };
    // The body's encoding is a field of its own: a text body may start like a marker.
    let (body, encoding) = match std::str::from_utf8(&response.body) {
        Ok(text) => (text.to_owned(), "utf-8"),
        Err(_) => (BASE64.encode(&response.body), "base64"),
    };
    serde_json::json!({
        "status": response.status.as_u16(),
        "headers": fields(&response.headers),
        "body": body,
        "body_encoding": encoding,
        "body_stored": !response.body_too_large,
        "trailers": fields(&response.trailers),
    })
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

pub(super) fn not_found(target: &dyn Location, key: &Key) -> Failure {
    Failure::NotFound {
        what: format!(
            "no record for that key in {target}: never claimed, deleted, or expired (check the scope, the key and --table/--prefix){}",
            quoted_hint(key)
        ),
    }
}

/// A hint for a key or scope pasted with the quotes of an `Idempotency-Key` header: the
/// header's value is a Structured Field string, and idem-http stores it without them.
fn quoted_hint(key: &Key) -> String {
    let unquoted = |text: &str| {
        (text.len() >= 2 && text.starts_with('"') && text.ends_with('"'))
            .then(|| text[1..text.len() - 1].to_owned())
    };
    match (unquoted(key.scope()), unquoted(key.key())) {
        (_, Some(bare)) => format!(
            "; the key is in quotes, as in the Idempotency-Key header, but records keep it without them: try `{bare}`"
        ),
        (Some(bare), None) => format!("; the scope is in quotes: try `{bare}`"),
        (None, None) => String::new(),
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
