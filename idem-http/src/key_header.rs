//! Reading the `Idempotency-Key` header: a Structured Field string, as the IETF draft
//! defines it, or a bare token, as many clients send.

/// Why a header value was refused: each variant names the rule it broke. The layer answers
/// 400 with this message in the problem's `detail`.
///
/// ```
/// use idem_http::KeyHeaderError;
///
/// let message = KeyHeaderError::BadToken.to_string();
/// assert!(message.contains("quote other values"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyHeaderError {
    /// The header appears more than once.
    #[error("the header appears more than once; send it once")]
    Repeated,
    /// The value is not visible ASCII.
    #[error("the value holds bytes outside visible ASCII; send a quoted string of printable ASCII")]
    NotAscii,
    /// A quoted string that does not end, or escapes something other than `"` and `\`.
    #[error(
        "the value is not a valid Structured Field string: quote it as \"...\", escaping only \\\" and \\\\"
    )]
    BadString,
    /// An unquoted value with a character a token cannot hold.
    #[error(
        "an unquoted value may hold only letters, digits and !#$%&'*+-.^_`|~:/; quote other values"
    )]
    BadToken,
    /// The key is empty, too long, or holds a control character ([`idem_core::Key`]'s rules).
    #[error(transparent)]
    Key(#[from] idem_core::key::KeyError),
}

/// The key a header value carries.
///
/// - `"..."`: a Structured Field string (RFC 8941 section 3.3.3): printable ASCII, with
///   `\"` and `\\` the only escapes. The draft's form.
/// - otherwise a bare token (letters, digits and `!#$%&'*+-.^_`|~:/`), for clients that
///   send a UUID unquoted.
/// - Surrounding spaces are ignored.
pub(crate) fn parse(value: &[u8]) -> Result<String, KeyHeaderError> {
    let text = visible(value)?;
    let Some(quoted) = text.strip_prefix('"') else {
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~:/".contains(c);
        if !text.chars().all(token) {
            return Err(KeyHeaderError::BadToken);
        }
        return Ok(text.to_owned());
    };
    let mut out = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    loop {
        match chars.next() {
            None => return Err(KeyHeaderError::BadString),
            Some('"') => break,
            Some('\\') => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => return Err(KeyHeaderError::BadString),
            },
            Some(c) => out.push(c),
        }
    }
    if chars.next().is_some() {
        // Something after the closing quote (parameters are not part of this field).
        return Err(KeyHeaderError::BadString);
    }
    Ok(out)
}

/// The key a header other than `Idempotency-Key` carries (`webhook-id`, a queue's message
/// id): its value as it is, with surrounding spaces trimmed. Such ids are opaque strings
/// (Standard Webhooks': base64 with `=`, addresses with `@`, lists, spaces, quotes); only
/// `Idempotency-Key` is a Structured Field.
pub(crate) fn opaque(value: &[u8]) -> Result<String, KeyHeaderError> {
    visible(value).map(str::to_owned)
}

/// The value, printable ASCII (tabs too), with surrounding spaces and tabs trimmed.
fn visible(value: &[u8]) -> Result<&str, KeyHeaderError> {
    let text = std::str::from_utf8(value).map_err(|_| KeyHeaderError::NotAscii)?;
    if !text
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) || b == b'\t')
    {
        return Err(KeyHeaderError::NotAscii);
    }
    Ok(text.trim_matches([' ', '\t']))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_field_strings_and_bare_tokens() {
        assert_eq!(
            parse(b"\"8e03978e-40d5-43e8-bc93-6894a57f9324\"").unwrap(),
            "8e03978e-40d5-43e8-bc93-6894a57f9324"
        );
        assert_eq!(
            parse(b"8e03978e-40d5-43e8-bc93-6894a57f9324").unwrap(),
            "8e03978e-40d5-43e8-bc93-6894a57f9324"
        );
        assert_eq!(
            parse(b" \"a \\\"quoted\\\" \\\\ key\" ").unwrap(),
            "a \"quoted\" \\ key"
        );
        assert_eq!(parse(b"\"with spaces\"").unwrap(), "with spaces");
    }

    #[test]
    fn other_headers_are_read_as_they_are() {
        for id in [
            "bXNn==",
            "a@b.example",
            "x,y;z",
            "with spaces",
            "\"quoted\"",
        ] {
            assert_eq!(opaque(id.as_bytes()).unwrap(), id);
        }
        assert_eq!(opaque(b"  padded\t").unwrap(), "padded");
        assert_eq!(
            opaque("schl\u{fc}ssel".as_bytes()),
            Err(KeyHeaderError::NotAscii)
        );
        assert_eq!(opaque(b"a\x01b"), Err(KeyHeaderError::NotAscii));
    }

    #[test]
    fn malformed_values_name_the_rule() {
        assert_eq!(parse(b"\"unterminated"), Err(KeyHeaderError::BadString));
        assert_eq!(parse(b"\"bad \\n escape\""), Err(KeyHeaderError::BadString));
        assert_eq!(parse(b"\"x\";param=1"), Err(KeyHeaderError::BadString));
        assert_eq!(parse(b"two words"), Err(KeyHeaderError::BadToken));
        assert_eq!(parse("schlüssel".as_bytes()), Err(KeyHeaderError::NotAscii));
        assert_eq!(parse(b"a\x01b"), Err(KeyHeaderError::NotAscii));
    }

    use proptest::prelude::Strategy;

    proptest::proptest! {
        #![proptest_config(idem_testkit::fuzz_config())]

        /// Any header bytes: an accepted key is printable ASCII without a control
        /// character; a refusal is one of the named rules.
        #[test]
        fn any_header_value(value in proptest::prop_oneof![
            proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            "[ -~]{0,300}".prop_map(String::into_bytes),
            "\"([ -~]|\\\\.){0,80}\"?( ;[a-z]=[0-9])?".prop_map(String::into_bytes),
        ]) {
            match parse(&value) {
                Ok(key) => proptest::prop_assert!(key.bytes().all(|b| (b' '..=b'~').contains(&b))),
                Err(err) => proptest::prop_assert!(matches!(
                    err,
                    KeyHeaderError::NotAscii
                        | KeyHeaderError::BadToken
                        | KeyHeaderError::BadString
                        | KeyHeaderError::Key(_)
                )),
            }
        }
    }
}
