//! The key of one logical operation, and how it travels in `Idempotency-Key`.

use std::fmt;

use std::sync::OnceLock;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header that carries the key (IETF draft "The Idempotency-Key HTTP Header Field").
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The most bytes a key may have: what idem's servers accept, and more than any UUID.
pub const MAX_KEY_LEN: usize = 255;

/// Why a key was refused before anything was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key was empty.
    #[error("an idempotency key cannot be empty")]
    Empty,
    /// The key was longer than [`MAX_KEY_LEN`].
    #[error("an idempotency key is at most {MAX_KEY_LEN} bytes, this one is {len}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The key held a byte a Structured Field string cannot carry (only printable ASCII,
    /// space to `~`).
    #[error("an idempotency key holds printable ASCII only (space to `~`); byte {position} is not")]
    NotPrintable {
        /// Where the first such byte is.
        position: usize,
    },
}

/// The key of one logical operation: made once, when the user acts, and sent on every
/// retry of that operation, never on another.
///
/// Attach it to a request with `with_extension`; the middleware sends it as the
/// `Idempotency-Key` header (a Structured Field string) on every attempt. `Debug` shows a
/// short hash, never the key.
///
/// ```
/// use idem_client::IdempotencyKey;
///
/// let key = IdempotencyKey::new("order-1187")?;
/// assert_eq!(key.as_str(), "order-1187");
/// assert_eq!(key.header_value(), "\"order-1187\"");
/// assert!(IdempotencyKey::new("").is_err());
/// assert_eq!(IdempotencyKey::random().as_str().len(), 36);
/// # Ok::<(), idem_client::KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The caller's own key (an order id, a message id).
    ///
    /// # Errors
    /// [`KeyError`] for an empty key, one over [`MAX_KEY_LEN`] bytes, or one holding a
    /// byte outside printable ASCII.
    pub fn new(key: impl Into<String>) -> Result<Self, KeyError> {
        let key = key.into();
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong { len: key.len() });
        }
        if let Some(position) = key.bytes().position(|byte| !(b' '..=b'~').contains(&byte)) {
            return Err(KeyError::NotPrintable { position });
        }
        Ok(Self(key))
    }

    /// A fresh UUIDv4 key, for an operation the caller did not name.
    pub fn random() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }

    /// The key.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The header's value: the key as a Structured Field string (RFC 8941), quoted, with
    /// `"` and `\` escaped.
    pub fn header_value(&self) -> String {
        let mut value = String::with_capacity(self.0.len() + 2);
        value.push('"');
        for c in self.0.chars() {
            if c == '"' || c == '\\' {
                value.push('\\');
            }
            value.push(c);
        }
        value.push('"');
        value
    }

    /// The header's value as a bare token, for servers that do not parse Structured
    /// Fields and would store the quotes as part of the key (Stripe-style APIs). `None`
    /// when the key holds a character a token cannot (only letters, digits and
    /// ``!#$%&'*+-.^_`|~:/`` can): such a key goes quoted or not at all.
    ///
    /// ```
    /// use idem_client::IdempotencyKey;
    ///
    /// assert_eq!(IdempotencyKey::new("order-1187")?.bare_header_value(), Some("order-1187"));
    /// assert_eq!(IdempotencyKey::new("order 1187")?.bare_header_value(), None);
    /// # Ok::<(), idem_client::KeyError>(())
    /// ```
    pub fn bare_header_value(&self) -> Option<&str> {
        self.0.chars().all(is_token_char).then_some(self.0.as_str())
    }

    /// The key a header value set by the caller carries: a Structured Field string, or a
    /// bare value as it is (surrounding spaces trimmed). `None` when it is no valid key.
    pub(crate) fn from_header(value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?.trim_matches(' ');
        let Some(quoted) = text.strip_prefix('"') else {
            return Self::new(text).ok();
        };
        let mut key = String::with_capacity(quoted.len());
        let mut chars = quoted.chars();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => key.push(chars.next().filter(|c| matches!(c, '"' | '\\'))?),
                c => key.push(c),
            }
        }
        if chars.next().is_some() {
            return None;
        }
        Self::new(key).ok()
    }

    /// A short hash of the key, for logs: keyed with a secret drawn once per process, so
    /// the tries of one key match in logs while a guessable key (`order-1187`) cannot be
    /// found from its hash.
    pub fn short_hash(&self) -> ShortKey {
        short_hash(self.0.as_bytes())
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey(#{})", self.short_hash())
    }
}

/// How the key is written in the header.
///
/// ```
/// use idem_client::{HeaderForm, IdempotencyMiddleware};
///
/// // For a server that reads the header's bytes as the key, without parsing quotes.
/// let middleware = IdempotencyMiddleware::new().header_form(HeaderForm::Bare);
/// # let _ = middleware;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderForm {
    /// A Structured Field string (`"order-1187"`), as the IETF draft defines the header;
    /// idem-http reads both forms.
    #[default]
    Quoted,
    /// The key as it is (`order-1187`), for servers that take the header's bytes as the
    /// key (Stripe-style APIs store the quotes otherwise). Keys that are not a token are
    /// refused with [`ClientError::KeyNotAToken`](crate::ClientError::KeyNotAToken).
    Bare,
}

/// Whether `c` may appear in a bare key (what idem-http reads as an unquoted token).
fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~:/".contains(c)
}

/// The process's secret for log hashes.
static LOG_SECRET: OnceLock<[u8; 32]> = OnceLock::new();

/// Four bytes of the keyed hash of `key` (HMAC-SHA-256 under the process's secret).
pub(crate) fn short_hash(key: &[u8]) -> ShortKey {
    let secret = LOG_SECRET.get_or_init(|| {
        let mut secret = [0u8; 32];
        // Without randomness the hash is still short; it is then only unkeyed.
        let _ = getrandom::fill(&mut secret);
        secret
    });
    let digest = Hmac::<Sha256>::new_from_slice(secret)
        .map(|mac| mac.chain_update(key).finalize().into_bytes())
        .unwrap_or_default();
    ShortKey([digest[0], digest[1], digest[2], digest[3]])
}

/// Four bytes of a key's keyed hash, in hex: what logs show of a key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ShortKey([u8; 4]);

impl fmt::Display for ShortKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_structured_field_rules() {
        assert_eq!(
            IdempotencyKey::new("a\"b\\c").unwrap().header_value(),
            r#""a\"b\\c""#
        );
        assert_eq!(
            IdempotencyKey::new("é"),
            Err(KeyError::NotPrintable { position: 0 })
        );
        assert_eq!(
            IdempotencyKey::new("x\ny"),
            Err(KeyError::NotPrintable { position: 1 })
        );
        assert_eq!(
            IdempotencyKey::new("k".repeat(256)),
            Err(KeyError::TooLong { len: 256 })
        );
        assert!(IdempotencyKey::new("k".repeat(255)).is_ok());
        let key = IdempotencyKey::new("secret-order").unwrap();
        assert!(!format!("{key:?}").contains("secret"));
        assert_ne!(IdempotencyKey::random(), IdempotencyKey::random());
    }

    #[test]
    fn a_header_set_by_hand_reads_back_as_its_key() {
        for key in ["order-1", "a\"b\\c", "with space", "x"] {
            let key = IdempotencyKey::new(key).unwrap();
            assert_eq!(
                IdempotencyKey::from_header(key.header_value().as_bytes()),
                Some(key.clone())
            );
            if let Some(bare) = key.bare_header_value() {
                assert_eq!(IdempotencyKey::from_header(bare.as_bytes()), Some(key));
            }
        }
        for bad in [&b"\"open"[..], b"\"a\\x\"", b"\"a\" tail", b"", b"\xff"] {
            assert_eq!(IdempotencyKey::from_header(bad), None, "{bad:?}");
        }
    }
}
