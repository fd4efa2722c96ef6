//! What makes two HTTP requests "the same request".

mod json_canonical;
mod json_parser;
#[cfg(test)]
mod tests;
mod urlencoded;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, header};
use idem_core::Fingerprint;

use crate::request_body::Content;

use json_canonical::{remove, write_canonical};
use json_parser::Parser;
use urlencoded::{FORM, form_pairs, framed_pairs};

type Custom = Arc<dyn Fn(&Parts, &Bytes) -> Fingerprint + Send + Sync>;

/// How the layer fingerprints a request.
#[derive(Clone)]
pub(crate) enum FingerprintRule {
    /// Method, path, query pairs in name order, and body: JSON canonicalised and form pairs
    /// in name order, with these fields left out (form fields by name only).
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

/// The media type of the body, lowercased, without parameters.
fn media_type(headers: &HeaderMap) -> Option<Cow<'_, str>> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(|mime| {
            let mime = mime.trim();
            if mime.bytes().any(|b| b.is_ascii_uppercase()) {
                Cow::Owned(mime.to_ascii_lowercase())
            } else {
                Cow::Borrowed(mime)
            }
        })
}

fn is_json(mime: &str) -> bool {
    mime == "application/json" || mime.ends_with("+json")
}

impl FingerprintRule {
    /// The fingerprint of a request whose body is plain bytes.
    #[cfg(test)]
    pub(crate) fn fingerprint(&self, parts: &Parts, body: &Bytes) -> Fingerprint {
        self.fingerprint_of(parts, body, &Content::Plain(body.clone()))
    }

    /// Whether the rule reads what a body says (decoded, by its parts), rather than the
    /// bytes as they came (a custom function).
    pub(crate) fn reads_content(&self) -> bool {
        matches!(self, FingerprintRule::Default { .. })
    }

    /// The fingerprint of a request: `raw` is its body as it came (what a custom function
    /// gets), `content` what it says (decoded, or split into its multipart parts).
    pub(crate) fn fingerprint_of(
        &self,
        parts: &Parts,
        raw: &Bytes,
        content: &Content,
    ) -> Fingerprint {
        let ignored = match self {
            FingerprintRule::Custom(custom) => return custom(parts, raw),
            FingerprintRule::Default { ignored } => ignored,
        };
        let query = parts.uri.query().unwrap_or_default();
        let builder = Fingerprint::builder()
            .field(parts.method.as_str())
            .field(crate::scope::path(parts))
            .field(framed_pairs(form_pairs(query.as_bytes())));
        let body = match content {
            Content::Plain(body) => body,
            Content::Multipart(form) => {
                // By its parts, in order; form fields left out by name, as for forms.
                let mut builder = builder.field("multipart");
                for part in form {
                    let name = part.name.as_deref().unwrap_or_default();
                    if ignored
                        .iter()
                        .any(|field| !field.starts_with('/') && *field == name)
                    {
                        continue;
                    }
                    let optional = |value: &Option<String>| match value {
                        Some(value) => [b"+", value.as_bytes()].concat(),
                        None => b"-".to_vec(),
                    };
                    builder = builder
                        .field(optional(&part.name))
                        .field(optional(&part.file_name))
                        .field(optional(&part.content_type))
                        .field(&part.bytes);
                }
                return builder.finish();
            }
        };
        let mime = media_type(&parts.headers);
        if mime.as_deref() == Some(FORM) {
            let mut pairs = form_pairs(body);
            // JSON Pointers are for JSON bodies; a form's fields go by name.
            pairs.retain(|(name, _)| {
                !ignored
                    .iter()
                    .any(|field| !field.starts_with('/') && field.as_bytes() == name)
            });
            return builder.field("form").field(framed_pairs(pairs)).finish();
        }
        let json = mime
            .as_deref()
            .is_some_and(is_json)
            .then(|| Parser::parse(body))
            .flatten();
        match json {
            Some(mut value) => {
                for field in ignored.iter() {
                    remove(&mut value, field);
                }
                let mut canonical = Vec::with_capacity(body.len());
                write_canonical(&value, &mut canonical);
                builder
                    .field("json")
                    .field(Fingerprint::of_bytes(&canonical).as_bytes())
                    .finish()
            }
            None => builder.field("bytes").field(body).finish(),
        }
    }
}
