//! JSON written canonically for the fingerprint (names sorted, numbers by their exact
//! digits), ignored fields removed first.

use std::borrow::Cow;

use super::json_parser::Json;

/// A number as the fingerprint writes it: as serde_json prints it when that print is
/// exactly the number's value (so a body fingerprints as it did when numbers went through
/// serde_json), else as its own text.
///
/// Two numbers are written alike only when serde_json printed them alike and both are
/// exactly that value; serde_json's print tells an integer (`1`) from a float (`1.0`).
pub(super) fn canonical_number(text: &str) -> Cow<'_, str> {
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
pub(super) fn write_canonical(value: &Json<'_>, out: &mut Vec<u8>) {
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
pub(super) fn remove(value: &mut Json<'_>, field: &str) {
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
