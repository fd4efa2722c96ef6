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
}
