//! How [`Admin::raw`](crate::Admin::raw) shows stored values.

use crate::admin::RawRecord;

/// `bytes` as text when they are printable UTF-8, else as `0x` and hex: how
/// [`Admin::raw`](crate::Admin::raw) shows a stored value.
///
/// ```
/// assert_eq!(idem_core::raw::raw_text(b"in_progress"), "in_progress");
/// assert_eq!(idem_core::raw::raw_text(&[0, 255]), "0x00ff");
/// ```
pub fn raw_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_owned(),
        _ => {
            let mut out = String::with_capacity(2 + bytes.len() * 2);
            out.push_str("0x");
            for byte in bytes {
                out.push_str(&format!("{byte:02x}"));
            }
            out
        }
    }
}

/// A decoded record's fields in [`Admin::raw`](crate::Admin::raw)'s form, for stores that hold records
/// decoded (the memory store) and for tests.
pub fn raw_of(record: &crate::Record) -> RawRecord {
    let mut fields = vec![
        (
            "fingerprint".to_owned(),
            raw_text(record.fingerprint.as_bytes()),
        ),
        ("state".to_owned(), record.state.as_str().to_owned()),
        ("token".to_owned(), record.token.to_string()),
        ("attempt".to_owned(), raw_text(record.attempt.as_bytes())),
        (
            "lease_until".to_owned(),
            record.lease_until.as_unix_millis().to_string(),
        ),
        (
            "created_at".to_owned(),
            record.created_at.as_unix_millis().to_string(),
        ),
        (
            "expires_at".to_owned(),
            record.expires_at.as_unix_millis().to_string(),
        ),
    ];
    if let Some(response) = &record.response {
        fields.push(("response".to_owned(), format!("{} bytes", response.len())));
    }
    for (name, value) in &record.steps {
        fields.push((format!("step {name}"), format!("{} bytes", value.len())));
    }
    fields
}
