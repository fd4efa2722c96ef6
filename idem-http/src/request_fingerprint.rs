//! What makes two HTTP requests "the same request".

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, header};
use idem_core::Fingerprint;

use crate::request_body::Content;

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

const FORM: &str = "application/x-www-form-urlencoded";

/// `application/x-www-form-urlencoded` pairs, percent-decoded to bytes, split as
/// `form_urlencoded::parse` splits them. Not `form_urlencoded::parse` itself: it decodes
/// bytes that are not UTF-8 to U+FFFD, so `a=%FF` and `a=%FE` would be one request.
fn form_pairs(input: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    fn decode(input: &[u8]) -> Vec<u8> {
        let plus_as_space: Vec<u8> = input
            .iter()
            .map(|&b| if b == b'+' { b' ' } else { b })
            .collect();
        percent_encoding::percent_decode(&plus_as_space).collect()
    }
    input
        .split(|&b| b == b'&')
        .filter(|sequence| !sequence.is_empty())
        .map(|sequence| match sequence.iter().position(|&b| b == b'=') {
            Some(at) => (decode(&sequence[..at]), decode(&sequence[at + 1..])),
            None => (decode(sequence), Vec::new()),
        })
        .collect()
}

/// The pairs sorted by name, repeated names in their order (a stable sort), each name and
/// value length-prefixed. No pairs give no bytes, as an absent query did before pairs
/// were sorted.
fn framed_pairs(mut pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<u8> {
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    for (name, value) in &pairs {
        for part in [name, value] {
            out.extend_from_slice(&(part.len() as u64).to_be_bytes());
            out.extend_from_slice(part);
        }
    }
    out
}

/// A JSON value as the fingerprint reads it: a number keeps its text, since serde_json
/// (without `arbitrary_precision`, which would change every crate's `Value`) parses
/// numbers beyond 64 bits and beyond an f64's precision to an f64, so two amounts could
/// be one.
#[derive(Debug)]
enum Json<'a> {
    Null,
    Bool(bool),
    Number(&'a str),
    /// Borrowed from the body unless it has escapes.
    String(Cow<'a, str>),
    Array(Vec<Json<'a>>),
    /// Sorted as `idem_core::Fingerprint::of_json` sorts; a repeated name keeps its last
    /// value, as serde_json does.
    Object(BTreeMap<Cow<'a, str>, Json<'a>>),
}

/// Containers nested deeper than this are refused, as serde_json refuses them (its
/// recursion limit of 128 admits 127 levels), which bounds the recursion here too.
const MAX_DEPTH: usize = 127;

/// One pass over the body (linear in its length, whatever its depth) accepting what
/// serde_json accepts, except numbers out of an f64's range, which serde_json refuses and
/// this keeps as text.
struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Parser<'a> {
    fn parse(body: &'a [u8]) -> Option<Json<'a>> {
        // serde_json refuses a body that is not UTF-8 all through: outside strings only
        // ASCII is valid, and strings are checked.
        let text = std::str::from_utf8(body).ok()?;
        let mut parser = Parser { text, at: 0 };
        let value = parser.value(MAX_DEPTH)?;
        parser.skip_whitespace();
        (parser.at == text.len()).then_some(value)
    }

    fn rest(&self) -> &'a [u8] {
        self.text.as_bytes().get(self.at..).unwrap_or_default()
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.at += 1;
        }
        found
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn literal(&mut self, word: &str, value: Json<'a>) -> Option<Json<'a>> {
        let found = self.rest().starts_with(word.as_bytes());
        self.at += word.len();
        found.then_some(value)
    }

    fn value(&mut self, depth: usize) -> Option<Json<'a>> {
        self.skip_whitespace();
        match self.peek()? {
            b'n' => self.literal("null", Json::Null),
            b't' => self.literal("true", Json::Bool(true)),
            b'f' => self.literal("false", Json::Bool(false)),
            b'"' => self.string().map(Json::String),
            b'-' | b'0'..=b'9' => self.number().map(Json::Number),
            b'[' => {
                let depth = depth.checked_sub(1)?;
                self.at += 1;
                let mut items = Vec::new();
                self.skip_whitespace();
                if self.eat(b']') {
                    return Some(Json::Array(items));
                }
                loop {
                    items.push(self.value(depth)?);
                    self.skip_whitespace();
                    if self.eat(b']') {
                        return Some(Json::Array(items));
                    }
                    if !self.eat(b',') {
                        return None;
                    }
                }
            }
            b'{' => {
                let depth = depth.checked_sub(1)?;
                self.at += 1;
                let mut members = BTreeMap::new();
                self.skip_whitespace();
                if self.eat(b'}') {
                    return Some(Json::Object(members));
                }
                loop {
                    self.skip_whitespace();
                    if self.peek() != Some(b'"') {
                        return None;
                    }
                    let name = self.string()?;
                    self.skip_whitespace();
                    if !self.eat(b':') {
                        return None;
                    }
                    members.insert(name, self.value(depth)?);
                    self.skip_whitespace();
                    if self.eat(b'}') {
                        return Some(Json::Object(members));
                    }
                    if !self.eat(b',') {
                        return None;
                    }
                }
            }
            _ => None,
        }
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, as its text.
    fn number(&mut self) -> Option<&'a str> {
        let start = self.at;
        self.eat(b'-');
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return None,
        }
        if self.eat(b'.') && !self.digits() {
            return None;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if !self.digits() {
                return None;
            }
        }
        self.text.get(start..self.at)
    }

    /// Skips digits; whether there was one.
    fn digits(&mut self) -> bool {
        let start = self.at;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        self.at > start
    }

    /// A string, its escapes decoded; a lone surrogate is refused, as serde_json does.
    fn string(&mut self) -> Option<Cow<'a, str>> {
        self.at += 1;
        let mut out = String::new();
        loop {
            let start = self.at;
            while matches!(self.peek(), Some(b) if b != b'"' && b != b'\\' && b >= 0x20) {
                self.at += 1;
            }
            // `at` stops on an ASCII byte or the end, a character boundary.
            let run = self.text.get(start..self.at)?;
            match self.peek()? {
                b'"' => {
                    self.at += 1;
                    // Most strings have no escape: the body's own text, no copy.
                    if out.is_empty() {
                        return Some(Cow::Borrowed(run));
                    }
                    out.push_str(run);
                    return Some(Cow::Owned(out));
                }
                b'\\' => {
                    out.push_str(run);
                    self.at += 1;
                    let escape = self.peek()?;
                    self.at += 1;
                    out.push(match escape {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return None,
                    });
                }
                // A control character.
                _ => return None,
            }
        }
    }

    /// After `\u`: one code point, or a surrogate pair `\uD83D\uDE00`.
    fn unicode_escape(&mut self) -> Option<char> {
        let high = self.hex4()?;
        if !(0xD800..0xDC00).contains(&high) {
            // A low surrogate alone is no `char`.
            return char::from_u32(high);
        }
        if !self.rest().starts_with(b"\\u") {
            return None;
        }
        self.at += 2;
        let low = self.hex4()?;
        if !(0xDC00..0xE000).contains(&low) {
            return None;
        }
        char::from_u32(0x1_0000 + ((high - 0xD800) << 10) + (low - 0xDC00))
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.text.as_bytes().get(self.at..self.at + 4)?;
        self.at += 4;
        digits.iter().try_fold(0, |n, &b| {
            let digit = char::from(b).to_digit(16)?;
            Some(n * 16 + digit)
        })
    }
}

/// A number as the fingerprint writes it: as serde_json prints it when that print is
/// exactly the number's value (so a body fingerprints as it did when numbers went through
/// serde_json), else as its own text.
///
/// Two numbers are written alike only when serde_json printed them alike and both are
/// exactly that value; serde_json's print tells an integer (`1`) from a float (`1.0`).
fn canonical_number(text: &str) -> Cow<'_, str> {
    // The common case, without parsing: an integer of at most 18 digits (within i64 and
    // u64 both) that serde_json prints digit for digit. "-0" is not one: it prints as "0".
    let digits = text.strip_prefix('-').unwrap_or(text);
    if (1..=18).contains(&digits.len())
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" && digits.len() == text.len() || !digits.starts_with('0'))
    {
        return Cow::Borrowed(text);
    }
    let Ok(number) = serde_json::from_str::<serde_json::Number>(text) else {
        // Out of an f64's range.
        return Cow::Borrowed(text);
    };
    let printed = number.to_string();
    if printed == text || Decimal::of(&printed) == Decimal::of(text) {
        Cow::Owned(printed)
    } else {
        Cow::Borrowed(text)
    }
}

/// A decimal number's exact value: sign, significant digits, power of ten.
#[derive(PartialEq, Eq)]
struct Decimal {
    negative: bool,
    digits: Vec<u8>,
    exponent: i64,
}

impl Decimal {
    /// Of a JSON number's text (or serde_json's print of one).
    fn of(text: &str) -> Decimal {
        // Beyond any exponent a 1 MiB body's digits can shift: a saturated exponent is
        // never one of serde_json's prints, whose exponents are below 400.
        const LIMIT: i64 = 1 << 50;
        let (negative, text) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (mantissa, exponent) = match text.find(['e', 'E']) {
            Some(at) => (&text[..at], &text[at + 1..]),
            None => (text, ""),
        };
        let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let (exponent_negative, exponent) = match exponent.as_bytes().first() {
            Some(b'-') => (true, &exponent[1..]),
            Some(b'+') => (false, &exponent[1..]),
            _ => (false, exponent),
        };
        let mut exponent = exponent.bytes().fold(0_i64, |n, b| {
            (n * 10 + i64::from(b.wrapping_sub(b'0'))).min(LIMIT)
        });
        if exponent_negative {
            exponent = -exponent;
        }
        let all = whole.bytes().chain(fraction.bytes());
        let mut digits: Vec<u8> = all.skip_while(|&b| b == b'0').collect();
        exponent -= fraction.len() as i64;
        while digits.last() == Some(&b'0') {
            digits.pop();
            exponent += 1;
        }
        if digits.is_empty() {
            exponent = 0;
        }
        Decimal {
            negative,
            digits,
            exponent,
        }
    }
}

/// Writes `value` as `idem_core::Fingerprint::of_json` does (compact, names sorted,
/// strings escaped by serde_json), numbers by [`canonical_number`].
fn write_canonical(value: &Json<'_>, out: &mut Vec<u8>) {
    match value {
        Json::Null => out.extend_from_slice(b"null"),
        Json::Bool(true) => out.extend_from_slice(b"true"),
        Json::Bool(false) => out.extend_from_slice(b"false"),
        Json::Number(text) => out.extend_from_slice(canonical_number(text).as_bytes()),
        Json::String(text) => write_string(text, out),
        Json::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Json::Object(members) => {
            out.push(b'{');
            for (i, (name, item)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(name, out);
                out.push(b':');
                write_canonical(item, out);
            }
            out.push(b'}');
        }
    }
}

fn write_string(text: &str, out: &mut Vec<u8>) {
    // A `str` always serialises, and a `Vec` always takes the bytes.
    let _ = serde_json::to_writer(&mut *out, text);
}

/// serde_json's reading of an array index in a pointer: no sign, no leading zero.
fn pointer_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// Removes `field` from `value`: a top-level member by name, or any member by JSON
/// Pointer (`/meta/trace_id`), read as serde_json's `Value::pointer_mut` reads it.
fn remove(value: &mut Json<'_>, field: &str) {
    let Some(pointer) = field.strip_prefix('/') else {
        if let Json::Object(members) = value {
            members.remove(field);
        }
        return;
    };
    let (parent, last) = match pointer.rsplit_once('/') {
        Some((parent, last)) => (Some(parent), last),
        None => (None, pointer),
    };
    let mut target = value;
    for token in parent.into_iter().flat_map(|parent| parent.split('/')) {
        let token = unescape(token);
        let next = match target {
            Json::Object(members) => members.get_mut(token.as_str()),
            Json::Array(items) => pointer_index(&token).and_then(|index| items.get_mut(index)),
            _ => None,
        };
        let Some(next) = next else { return };
        target = next;
    }
    let last = unescape(last);
    match target {
        Json::Object(members) => {
            members.remove(last.as_str());
        }
        Json::Array(items) => {
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

    fn with_type(rule: &FingerprintRule, uri: &str, content_type: &str, body: &str) -> Fingerprint {
        rule.fingerprint(
            &parts("POST", uri, content_type),
            &Bytes::copy_from_slice(body.as_bytes()),
        )
    }

    const FORM: &str = "application/x-www-form-urlencoded";

    fn hex(fingerprint: Fingerprint) -> String {
        fingerprint
            .as_bytes()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect()
    }

    /// The fingerprints of a JSON, a form and a plain request, digit for digit: a record
    /// stored before an upgrade must match its retry after it, so any change to how a
    /// request is fingerprinted shows here first (and needs a way to read the old ones).
    #[test]
    fn fingerprints_are_pinned_digit_for_digit() {
        let rule = FingerprintRule::default();
        let json = fp(
            &rule,
            "POST",
            "/checkout?b=2&a=1",
            r#"{"currency":"EUR","amount":500,"items":[1.50,{"z":null,"y":true}]}"#,
        );
        let form = with_type(&rule, "/checkout", FORM, "b=2&a=%20x&a=y");
        let plain = with_type(&rule, "/upload", "application/octet-stream", "\x00raw");
        assert_eq!(
            [hex(json), hex(form), hex(plain)],
            [
                "a30413d5015f375bd371358cda89c077e7fb3042c17dce7f9fb71a075a33dad5",
                "cedf91fecbbd6aaa2f1a0b12d74bdbba1a32b19cbf56fc3742d7b16e1dd47388",
                "1449b6f683634f3bf1bc40ab37f0f0d3c680f49442211a87b5bae6042684696d",
            ]
            .map(String::from)
        );
    }

    #[test]
    fn query_pairs_in_any_order_are_the_same_request() {
        let rule = FingerprintRule::default();
        let q = |uri: &str| fp(&rule, "POST", uri, "{}");
        assert_eq!(q("/pay?a=1&b=2"), q("/pay?b=2&a=1"));
        assert_eq!(q("/pay?a=%20"), q("/pay?a=+"), "decoded alike");
        assert_eq!(q("/pay?a=x&&b=y"), q("/pay?b=y&a=x"));
        assert_eq!(q("/pay"), q("/pay?"));
        // A repeated name keeps its order.
        assert_ne!(q("/pay?a=1&a=2"), q("/pay?a=2&a=1"));
        assert_eq!(q("/pay?a=1&b=0&a=2"), q("/pay?b=0&a=1&a=2"));
        // Framing: one pair holding "&" and "=" is not two pairs.
        assert_ne!(q("/pay?a=1%26b%3D2"), q("/pay?a=1&b=2"));
        assert_ne!(q("/pay?a%3D1=2"), q("/pay?a=1%3D2"));
        // Bytes that are not UTF-8 are not merged into one replacement character.
        assert_ne!(q("/pay?a=%FF"), q("/pay?a=%FE"));
        assert_ne!(q("/pay?a=1"), q("/pay?a=2"));
        assert_ne!(q("/pay?a=1"), q("/pay"));
    }

    #[test]
    fn form_bodies_in_any_order_are_the_same_request() {
        let rule = FingerprintRule::Default {
            ignored: Arc::from(["sent_at".to_string(), "/amount".to_string()]),
        };
        let form = |body: &str| with_type(&rule, "/pay", FORM, body);
        assert_eq!(
            form("amount=500&currency=EUR"),
            form("currency=EUR&amount=500")
        );
        assert_eq!(
            form("amount=500&currency=EUR"),
            with_type(
                &rule,
                "/pay",
                "Application/X-WWW-Form-Urlencoded; charset=utf-8",
                "currency=EUR&amount=500"
            )
        );
        assert_eq!(form("a=%20&b=c"), form("b=c&a=+"));
        assert_ne!(form("a=1&a=2"), form("a=2&a=1"));
        assert_ne!(form("amount=500"), form("amount=501"));
        // A top-level name is left out; a JSON Pointer is for JSON only.
        assert_eq!(
            form("amount=5&sent_at=10%3A00"),
            form("sent_at=10%3A01&amount=5")
        );
        assert_eq!(form("amount=5&sent_at=1&sent_at=2"), form("amount=5"));
        assert_ne!(form("amount=5"), form("amount=6"));
        // Body kinds never collide.
        let body = "amount=500";
        assert_ne!(form(body), with_type(&rule, "/pay", "text/plain", body));
        assert_ne!(
            with_type(&rule, "/pay", FORM, "{}"),
            with_type(&rule, "/pay", "application/json", "{}")
        );
    }

    #[test]
    fn integers_read_without_parsing_print_as_serde_json_prints_them() {
        for text in [
            "0",
            "-0",
            "7",
            "-5",
            "500",
            "999999999999999999",
            "-999999999999999999",
            "1000000000000000000",
            "18446744073709551615",
        ] {
            let printed = serde_json::from_str::<serde_json::Number>(text)
                .unwrap()
                .to_string();
            assert_eq!(canonical_number(text), printed, "{text}");
        }
    }

    #[test]
    fn json_numbers_count_by_their_digits() {
        let rule = FingerprintRule::default();
        let json = |body: &str| fp(&rule, "POST", "/pay", body);
        assert_ne!(
            json(r#"{"amount":18446744073709551617}"#),
            json(r#"{"amount":18446744073709551618}"#)
        );
        assert_ne!(
            json(r#"{"amount":-9223372036854775809}"#),
            json(r#"{"amount":-9223372036854775810}"#)
        );
        assert_ne!(
            json(r#"{"rate":0.1000000000000000000001}"#),
            json(r#"{"rate":0.1}"#)
        );
        assert_ne!(json("[1e400]"), json("[2e400]"));
        // serde_json reads 1e-400 as 0.0.
        assert_ne!(json("[1e-400]"), json("[0.0]"));
        assert_ne!(json("1"), json("1.0"));
        // The same digits, however the body is laid out, are the same request.
        assert_eq!(
            json(r#"{"b":18446744073709551617,"a":[0.1000000000000000000001]}"#),
            json("{ \"a\" : [ 0.1000000000000000000001 ] ,\n \"b\":18446744073709551617 }")
        );
        assert_eq!(
            json(r#"{"s":"\u0041\u00e9\ud83d\ude00"}"#),
            json(r#"{"s":"Aé😀"}"#)
        );
        // Duplicate names: the last one counts, as serde_json has it.
        assert_eq!(json(r#"{"a":1,"a":2}"#), json(r#"{"a":2}"#));
    }

    /// The JSON fingerprint as it was before numbers kept their text, for a request
    /// without a query, with its `remove` on serde_json's `Value`.
    fn before(ignored: &[&str], body: &[u8]) -> Fingerprint {
        fn remove(value: &mut serde_json::Value, field: &str) {
            use serde_json::Value;
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
        let mut value: serde_json::Value = serde_json::from_slice(body).unwrap();
        for field in ignored {
            remove(&mut value, field);
        }
        Fingerprint::builder()
            .field("POST")
            .field("/pay")
            .field("")
            .field("json")
            .field(Fingerprint::of_json(&value).unwrap().as_bytes())
            .finish()
    }

    fn rule_of(ignored: &[&str]) -> FingerprintRule {
        FingerprintRule::Default {
            ignored: ignored.iter().map(|field| field.to_string()).collect(),
        }
    }

    const POINTERS: &[&str] = &[
        "a", "/b", "/a/0", "/b/c", "/c~1d", "/c~0d/1", "/0/a", "/", "//", "/a/01", "/a/+1", "/b/-",
        "/b/c/0/a",
    ];

    #[test]
    fn bodies_serde_json_reads_exactly_keep_their_fingerprint() {
        for body in [
            r#"{"amount":500,"currency":"EUR","meta":{"at":1.5,"n":-3,"z":-0}}"#,
            r#"[1e5, 100000.0, 12.50, 0.1, 1E-7, -0.0, 18446744073709552000]"#,
            r#"{"s":"\u0041\n\t\u001f\u007f\"\\\/é😀","":null,"t":[true,false]}"#,
            r#"{"a":[{"x":1},{"y":2},{"z":3}],"b":{"c":[1,2,3]},"c/d":4,"c~d":[5,6]}"#,
            r#"{"a":1,"a":2}"#,
            "  \n[]\t",
        ] {
            let parts = parts("POST", "/pay", "application/json");
            let body_bytes = Bytes::copy_from_slice(body.as_bytes());
            assert_eq!(
                rule_of(&[]).fingerprint(&parts, &body_bytes),
                before(&[], body.as_bytes()),
                "{body}"
            );
            assert_eq!(
                rule_of(POINTERS).fingerprint(&parts, &body_bytes),
                before(POINTERS, body.as_bytes()),
                "{body} without {POINTERS:?}"
            );
        }
    }

    #[test]
    fn ignored_pointers_with_escapes_and_indices() {
        let rule = rule_of(&["/a~1b/1", "/c~0d/x", "/list/0/id"]);
        let json = |body: &str| fp(&rule, "POST", "/pay", body);
        assert_eq!(
            json(r#"{"a/b":[1,2,3],"c~d":{"x":1,"y":2},"list":[{"id":7,"v":1}]}"#),
            json(r#"{"a/b":[1,9,3],"c~d":{"x":5,"y":2},"list":[{"id":8,"v":1}]}"#)
        );
        assert_ne!(
            json(r#"{"a/b":[1,2,3],"c~d":{"x":1,"y":2},"list":[{"id":7,"v":1}]}"#),
            json(r#"{"a/b":[1,2,4],"c~d":{"x":1,"y":2},"list":[{"id":7,"v":1}]}"#)
        );
    }

    #[test]
    fn nesting_beyond_serde_jsons_limit_counts_as_bytes() {
        for depth in [126, 127, 128, 129] {
            let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let serde = serde_json::from_str::<serde_json::Value>(&body).is_ok();
            assert_eq!(Parser::parse(body.as_bytes()).is_some(), serde, "{depth}");
            assert_eq!(serde, depth <= 127);
        }
    }

    #[test]
    fn what_serde_json_refuses_is_refused() {
        for body in [
            "",
            " ",
            "01",
            "-",
            "1.",
            ".5",
            "+1",
            "1e",
            "1e+",
            "[1,]",
            "{\"a\":1,}",
            "{a:1}",
            "[1 2]",
            "nul",
            "truex",
            "\"\\u12\"",
            "\"\\u+123\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud800\\u0041\"",
            "\"\\x\"",
            "\"a\u{1}\"",
            "\"abc",
            "[",
            "{\"a\"}",
            "\u{feff}{}",
            "NaN",
            "[Infinity]",
            "{}{}",
            "1 2",
        ] {
            assert!(
                serde_json::from_str::<serde_json::Value>(body).is_err(),
                "{body:?}"
            );
            assert!(Parser::parse(body.as_bytes()).is_none(), "{body:?}");
        }
        assert!(Parser::parse(b"\"\xff\"").is_none());
    }

    /// A JSON number's parts, written as one token.
    #[derive(Clone, Debug)]
    struct Number {
        negative: bool,
        whole: String,
        fraction: Option<String>,
        exponent: Option<String>,
    }

    impl Number {
        fn text(&self) -> String {
            let mut text = String::new();
            if self.negative {
                text.push('-');
            }
            text.push_str(&self.whole);
            if let Some(fraction) = &self.fraction {
                text.push('.');
                text.push_str(fraction);
            }
            if let Some(exponent) = &self.exponent {
                text.push_str(exponent);
            }
            text
        }

        /// Changes one digit of the significand, so the value changes.
        fn change_a_digit(&mut self, choice: usize) {
            let fraction_len = self.fraction.as_ref().map_or(0, String::len);
            let at = choice % (self.whole.len() + fraction_len);
            let (digits, at, leading) = if at < self.whole.len() {
                let leading = at == 0 && self.whole.len() > 1;
                (&mut self.whole, at, leading)
            } else {
                (
                    self.fraction.as_mut().unwrap(),
                    at - self.whole.len(),
                    false,
                )
            };
            let old = digits.as_bytes()[at] - b'0';
            let mut new = (old + 1 + (choice / 7 % 9) as u8) % 10;
            if leading && new == 0 {
                new = if old == 1 { 2 } else { 1 };
            }
            digits.replace_range(at..=at, &new.to_string());
        }
    }

    #[derive(Clone, Debug)]
    enum Tree {
        Null,
        Bool(bool),
        Number(Number),
        String(String),
        Array(Vec<Tree>),
        Object(Vec<(String, Tree)>),
    }

    /// A tiny generator driving the layout choices.
    struct Layout(u64);

    impl Layout {
        fn next(&mut self, below: usize) -> usize {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 33) % below as u64) as usize
        }

        fn space(&mut self, out: &mut String) {
            for _ in 0..self.next(3) {
                out.push([' ', '\t', '\n', '\r'][self.next(4)]);
            }
        }

        fn string(&mut self, text: &str, out: &mut String) {
            out.push('"');
            for c in text.chars() {
                let must = c == '"' || c == '\\' || c < ' ';
                if !must && self.next(3) > 0 {
                    out.push(c);
                    continue;
                }
                match (c, self.next(2)) {
                    ('"', 0) => out.push_str("\\\""),
                    ('\\', 0) => out.push_str("\\\\"),
                    ('\n', 0) => out.push_str("\\n"),
                    ('/', 0) => out.push_str("\\/"),
                    _ => {
                        let mut units = [0; 2];
                        for unit in c.encode_utf16(&mut units) {
                            if self.next(2) == 0 {
                                out.push_str(&format!("\\u{unit:04x}"));
                            } else {
                                out.push_str(&format!("\\u{unit:04X}"));
                            }
                        }
                    }
                }
            }
            out.push('"');
        }

        fn write(&mut self, tree: &Tree, out: &mut String) {
            self.space(out);
            match tree {
                Tree::Null => out.push_str("null"),
                Tree::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
                Tree::Number(number) => out.push_str(&number.text()),
                Tree::String(text) => self.string(text, out),
                Tree::Array(items) => {
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        self.write(item, out);
                    }
                    self.space(out);
                    out.push(']');
                }
                Tree::Object(members) => {
                    let mut order: Vec<usize> = (0..members.len()).collect();
                    for i in (1..order.len()).rev() {
                        order.swap(i, self.next(i + 1));
                    }
                    out.push('{');
                    for (i, &at) in order.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        self.space(out);
                        self.string(&members[at].0, out);
                        self.space(out);
                        out.push(':');
                        self.write(&members[at].1, out);
                    }
                    self.space(out);
                    out.push('}');
                }
            }
            self.space(out);
        }

        fn render(seed: u64, tree: &Tree) -> String {
            let mut out = String::new();
            Layout(seed).write(tree, &mut out);
            out
        }
    }

    fn numbers_of(tree: &mut Tree) -> Vec<&mut Number> {
        match tree {
            Tree::Number(number) => vec![number],
            Tree::Array(items) => items.iter_mut().flat_map(numbers_of).collect(),
            Tree::Object(members) => members
                .iter_mut()
                .flat_map(|(_, item)| numbers_of(item))
                .collect(),
            _ => Vec::new(),
        }
    }

    fn number() -> impl Strategy<Value = Number> {
        (
            any::<bool>(),
            prop_oneof![Just("0".to_string()), "[1-9][0-9]{0,25}"],
            proptest::option::of("[0-9]{1,25}"),
            proptest::option::of("[eE][+-]?[0-9]{1,3}"),
        )
            .prop_map(|(negative, whole, fraction, exponent)| Number {
                negative,
                whole,
                fraction,
                exponent,
            })
    }

    fn tree() -> impl Strategy<Value = Tree> {
        let text = "[a-c\"\\\\/\n\u{1}é😀]{0,4}";
        let leaf = prop_oneof![
            Just(Tree::Null),
            any::<bool>().prop_map(Tree::Bool),
            number().prop_map(Tree::Number),
            text.prop_map(Tree::String),
        ];
        leaf.prop_recursive(4, 32, 5, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Tree::Array),
                proptest::collection::btree_map(text, inner, 0..5)
                    .prop_map(|members| Tree::Object(members.into_iter().collect())),
            ]
        })
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            "\\PC{0,6}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 5, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::btree_map("[a-d/~0-1]{0,3}", inner, 0..5)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    fn json_fp(rule: &FingerprintRule, body: &str) -> Fingerprint {
        rule.fingerprint(
            &parts("POST", "/pay", "application/json"),
            &Bytes::copy_from_slice(body.as_bytes()),
        )
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(idem_testkit::fuzz_config())]

        /// Key order, whitespace and string escapes do not count; one number's digits do.
        #[test]
        fn json_layout_does_not_count_and_digits_do(
            mut tree in tree(),
            seeds in any::<[u64; 3]>(),
            choice in any::<usize>(),
        ) {
            let rule = FingerprintRule::default();
            let a = Layout::render(seeds[0], &tree);
            let b = Layout::render(seeds[1], &tree);
            prop_assert!(Parser::parse(a.as_bytes()).is_some(), "{}", a);
            prop_assert_eq!(json_fp(&rule, &a), json_fp(&rule, &b), "{} vs {}", a, b);
            let mut numbers = numbers_of(&mut tree);
            if !numbers.is_empty() {
                let count = numbers.len();
                numbers[choice % count].change_a_digit(choice / count);
                let c = Layout::render(seeds[2], &tree);
                prop_assert_ne!(json_fp(&rule, &a), json_fp(&rule, &c), "{} vs {}", a, c);
            }
        }

        /// A body serde_json reads exactly fingerprints as it did before, ignored fields
        /// and all.
        #[test]
        fn json_fingerprints_are_what_they_were(value in json_value()) {
            let body = serde_json::to_string(&value).unwrap();
            let parts = parts("POST", "/pay", "application/json");
            let bytes = Bytes::copy_from_slice(body.as_bytes());
            prop_assert_eq!(rule_of(&[]).fingerprint(&parts, &bytes), before(&[], body.as_bytes()));
            prop_assert_eq!(
                rule_of(POINTERS).fingerprint(&parts, &bytes),
                before(POINTERS, body.as_bytes())
            );
        }

        /// The parser takes what serde_json takes, but for numbers beyond an f64.
        #[test]
        fn parser_accepts_what_serde_json_accepts(
            body in prop_oneof![
                "[\\[\\]{}\",: \n0-9eE.+\\-tfnrulasx\\\\]{0,40}",
                proptest::collection::vec(any::<u8>(), 0..40)
                    .prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
                tree().prop_map(|tree| Layout::render(7, &tree)),
            ],
            cut in any::<usize>(),
        ) {
            let body = body.as_bytes();
            // Mangled by a cut, a valid body is a boundary case.
            for body in [body, &body[..cut % (body.len() + 1)]] {
                let serde = serde_json::from_slice::<serde_json::Value>(body);
                let ours = Parser::parse(body).is_some();
                match serde {
                    Ok(_) => prop_assert!(ours, "{:?}", String::from_utf8_lossy(body)),
                    Err(err) if err.to_string().starts_with("number out of range") => {}
                    Err(err) => prop_assert!(!ours, "{:?}: {}", String::from_utf8_lossy(body), err),
                }
            }
        }

        /// Pairs are split and decoded as form_urlencoded does, where it does not replace
        /// bytes that are not UTF-8.
        #[test]
        fn form_pairs_are_form_urlencodeds(
            input in prop_oneof![
                "[a-c=&+% 0-9A-F]{0,30}",
                "([a-c]|%[0-9A-Fa-f]{2}|[=&+%]){0,20}",
            ],
        ) {
            let ours = form_pairs(input.as_bytes());
            let theirs: Vec<_> = form_urlencoded::parse(input.as_bytes()).collect();
            prop_assert_eq!(ours.len(), theirs.len());
            for ((name, value), (their_name, their_value)) in ours.iter().zip(&theirs) {
                if let (Ok(name), Ok(value)) = (std::str::from_utf8(name), std::str::from_utf8(value)) {
                    prop_assert_eq!(name, their_name);
                    prop_assert_eq!(value, their_value);
                }
            }
        }

        /// Nothing panics, whatever the body, content type and query.
        #[test]
        fn any_request_fingerprints(
            body in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..200),
                "[\\[\\]{}\",: 0-9eE.\\-a-z\\\\=&%+]{0,100}".prop_map(String::into_bytes),
                tree().prop_map(|tree| Layout::render(1, &tree).into_bytes()),
            ],
            content_type in prop_oneof![
                Just("application/json".to_string()),
                Just("application/problem+json; charset=utf-8".to_string()),
                Just(FORM.to_string()),
                Just("text/plain".to_string()),
                "[ -~]{0,30}",
            ],
            query in "([a-z]|%[0-9A-Fa-f]{2}|[=&+%]){0,20}",
        ) {
            let rule = rule_of(POINTERS);
            let (mut parts, ()) = http::Request::builder()
                .method("POST")
                .uri(format!("/pay?{query}"))
                .body(())
                .unwrap()
                .into_parts();
            if let Ok(value) = http::HeaderValue::from_str(&content_type) {
                parts.headers.insert(header::CONTENT_TYPE, value);
            }
            let body = Bytes::from(body);
            prop_assert_eq!(rule.fingerprint(&parts, &body), rule.fingerprint(&parts, &body));
        }
    }
}
