//! What makes two HTTP requests "the same request".

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, header};
use idem_core::Fingerprint;
use serde_json::Value;

type Custom = Arc<dyn Fn(&Parts, &Bytes) -> Fingerprint + Send + Sync>;

/// How the layer fingerprints a request.
#[derive(Clone)]
pub(crate) enum FingerprintRule {
    /// Method, path, query and body; JSON bodies canonicalised, with these fields left out.
    Default { ignored: Arc<[String]> },
    /// The application's own function.
    Custom(Custom),
}

impl Default for FingerprintRule {
    fn default() -> Self {
        FingerprintRule::Default {
            ignored: Arc::from([]),
        }
    }
}

impl fmt::Debug for FingerprintRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FingerprintRule::Default { ignored } => f
                .debug_struct("Default")
                .field("ignored_json_fields", ignored)
                .finish(),
            FingerprintRule::Custom(_) => f.write_str("Custom"),
        }
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(|mime| mime.trim().to_ascii_lowercase())
        .is_some_and(|mime| mime == "application/json" || mime.ends_with("+json"))
}

/// Removes `field` from `value`: a top-level member by name, or any member by JSON
/// Pointer (`/meta/trace_id`).
fn remove(value: &mut Value, field: &str) {
    let Some(pointer) = field.strip_prefix('/') else {
        if let Value::Object(map) = value {
            map.remove(field);
        }
        return;
    };
    let (parent, last) = match pointer.rsplit_once('/') {
        Some((parent, last)) => (format!("/{parent}"), last),
        None => (String::new(), pointer),
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    match value.pointer_mut(&parent) {
        Some(Value::Object(map)) => {
            map.remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Ok(index) = last.parse::<usize>() {
                if index < items.len() {
                    items.remove(index);
                }
            }
        }
        _ => {}
    }
}

impl FingerprintRule {
    pub(crate) fn fingerprint(&self, parts: &Parts, body: &Bytes) -> Fingerprint {
        let ignored = match self {
            FingerprintRule::Custom(custom) => return custom(parts, body),
            FingerprintRule::Default { ignored } => ignored,
        };
        let builder = Fingerprint::builder()
            .field(parts.method.as_str())
            .field(parts.uri.path())
            .field(parts.uri.query().unwrap_or_default());
        let json = is_json(&parts.headers)
            .then(|| serde_json::from_slice::<Value>(body).ok())
            .flatten();
        match json {
            Some(mut value) => {
                for field in ignored.iter() {
                    remove(&mut value, field);
                }
                // A parsed Value always serialises.
                let canonical =
                    Fingerprint::of_json(&value).unwrap_or_else(|_| Fingerprint::of_bytes(body));
                builder.field("json").field(canonical.as_bytes()).finish()
            }
            None => builder.field("bytes").field(body).finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, uri: &str, content_type: &str) -> Parts {
        let (parts, ()) = http::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", content_type)
            .body(())
            .unwrap()
            .into_parts();
        parts
    }

    fn fp(rule: &FingerprintRule, method: &str, uri: &str, body: &str) -> Fingerprint {
        rule.fingerprint(
            &parts(method, uri, "application/json; charset=utf-8"),
            &Bytes::copy_from_slice(body.as_bytes()),
        )
    }

    #[test]
    fn json_key_order_does_not_matter_and_everything_else_does() {
        let rule = FingerprintRule::default();
        let a = fp(
            &rule,
            "POST",
            "/pay?x=1",
            r#"{"amount":500,"currency":"EUR"}"#,
        );
        assert_eq!(
            a,
            fp(
                &rule,
                "POST",
                "/pay?x=1",
                r#"{ "currency": "EUR", "amount": 500 }"#
            )
        );
        assert_ne!(
            a,
            fp(
                &rule,
                "POST",
                "/pay?x=1",
                r#"{"amount":501,"currency":"EUR"}"#
            )
        );
        assert_ne!(
            a,
            fp(
                &rule,
                "PATCH",
                "/pay?x=1",
                r#"{"amount":500,"currency":"EUR"}"#
            )
        );
        assert_ne!(
            a,
            fp(
                &rule,
                "POST",
                "/pay?x=2",
                r#"{"amount":500,"currency":"EUR"}"#
            )
        );
        assert_ne!(
            a,
            fp(
                &rule,
                "POST",
                "/other?x=1",
                r#"{"amount":500,"currency":"EUR"}"#
            )
        );
    }

    #[test]
    fn ignored_fields_by_name_and_by_pointer() {
        let rule = FingerprintRule::Default {
            ignored: Arc::from(["sent_at".to_string(), "/meta/trace_id".to_string()]),
        };
        let a = fp(
            &rule,
            "POST",
            "/pay",
            r#"{"amount":5,"sent_at":"10:00","meta":{"trace_id":"a","v":1}}"#,
        );
        let b = fp(
            &rule,
            "POST",
            "/pay",
            r#"{"amount":5,"sent_at":"10:01","meta":{"trace_id":"b","v":1}}"#,
        );
        assert_eq!(a, b);
        let c = fp(
            &rule,
            "POST",
            "/pay",
            r#"{"amount":5,"sent_at":"10:01","meta":{"trace_id":"b","v":2}}"#,
        );
        assert_ne!(a, c, "fields not ignored still count");
    }

    #[test]
    fn other_bodies_count_as_bytes() {
        let rule = FingerprintRule::default();
        let text = |body: &str| {
            rule.fingerprint(
                &parts("POST", "/x", "text/plain"),
                &Bytes::copy_from_slice(body.as_bytes()),
            )
        };
        assert_ne!(text("{\"a\":1,\"b\":2}"), text("{\"b\":2,\"a\":1}"));
        assert_eq!(text("same"), text("same"));
    }
}
