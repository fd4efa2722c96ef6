//! Idempotency keys: a validated scope plus key, and validated step names.

pub use crate::derived_key::derive_key;

use std::fmt;
use std::sync::{Arc, OnceLock};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The keyed hash for [`Key::short_hash`], once [`set_log_hash_secret`] ran.
static LOG_HASH: OnceLock<Hmac<Sha256>> = OnceLock::new();

/// The shortest secret [`set_log_hash_secret`] accepts.
pub const MIN_LOG_HASH_SECRET: usize = 16;

/// Why [`set_log_hash_secret`] refused a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LogHashSecretError {
    /// The secret is too short to resist guessing.
    #[error("the log hash secret is {len} bytes; use at least {min} random bytes")]
    TooShort {
        /// Its length.
        len: usize,
        /// [`MIN_LOG_HASH_SECRET`].
        min: usize,
    },
    /// A secret was set already; hashes already logged would stop matching new ones.
    #[error("the log hash secret is set already; set it once, at startup")]
    AlreadySet,
}

/// Makes every [`Key::short_hash`] (in `Debug`, `Display`, spans, errors and metrics) a
/// keyed hash: the first 4 bytes of HMAC-SHA-256 under `secret`, instead of SHA-256.
///
/// Why: the default short hash is 8 hex digits of an unkeyed SHA-256 of scope and key.
/// Anyone holding a log line and a guess at the key space (order numbers, dates, small
/// counters) can hash every candidate and find the key. Under a secret they cannot,
/// while log lines still correlate with each other. Set it once per process, at startup,
/// from your secret manager, the same on every instance whose logs you correlate (and in
/// the `idem` command's `IDEM_LOG_HASH_SECRET`).
///
/// ```
/// use idem_core::{key::set_log_hash_secret, Key};
///
/// let before = Key::new("acct_42/payments.create", "order-1187")?.short_hash();
/// set_log_hash_secret(b"a secret of 16 bytes or more")?;
/// let after = Key::new("acct_42/payments.create", "order-1187")?.short_hash();
/// assert_ne!(before, after);
/// assert!(set_log_hash_secret(b"another secret, 16+ bytes").is_err(), "once per process");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`LogHashSecretError`] for a secret under [`MIN_LOG_HASH_SECRET`] bytes, or a second
/// call.
pub fn set_log_hash_secret(secret: &[u8]) -> Result<(), LogHashSecretError> {
    if secret.len() < MIN_LOG_HASH_SECRET {
        return Err(LogHashSecretError::TooShort {
            len: secret.len(),
            min: MIN_LOG_HASH_SECRET,
        });
    }
    // HMAC takes a key of any length: this cannot fail.
    let mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).map_err(|_| {
        LogHashSecretError::TooShort {
            len: secret.len(),
            min: MIN_LOG_HASH_SECRET,
        }
    })?;
    LOG_HASH
        .set(mac)
        .map_err(|_| LogHashSecretError::AlreadySet)
}

/// The most bytes a scope, a key or a step name may hold.
pub const MAX_PART_LEN: usize = 255;

/// Which part of an identifier broke a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyPart {
    /// The scope: the owner plus the operation, such as `acct_42/payments.create`.
    Scope,
    /// The key the client sent, such as the `Idempotency-Key` header.
    Key,
    /// The name of a step checkpointed inside one execution.
    Step,
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyPart::Scope => "scope",
            KeyPart::Key => "key",
            KeyPart::Step => "step name",
        })
    }
}

/// Why a scope, key or step name was refused. Nothing is stored for a refused input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The part was the empty string.
    #[error("the {part} is empty; send a non-empty {part}")]
    Empty {
        /// The part that was empty.
        part: KeyPart,
    },
    /// The part was longer than [`MAX_PART_LEN`] bytes.
    #[error("the {part} is {len} bytes long, over the limit of {max} bytes; hash or shorten it")]
    TooLong {
        /// The part that was too long.
        part: KeyPart,
        /// Its length in bytes.
        len: usize,
        /// The limit, [`MAX_PART_LEN`].
        max: usize,
    },
    /// The name starts with a prefix idem keeps for its own records.
    #[error(
        "the {part} starts with `{prefix}`, which idem keeps for its own checkpoints; rename it"
    )]
    Reserved {
        /// The part concerned.
        part: KeyPart,
        /// The reserved prefix.
        prefix: &'static str,
    },
    /// The part held a control character (such as a newline or NUL).
    #[error("the {part} holds a control character at byte {index}; remove control characters")]
    ControlCharacter {
        /// The part that held the character.
        part: KeyPart,
        /// Byte offset of the first control character.
        index: usize,
    },
}

fn validate(part: KeyPart, value: &str) -> Result<(), KeyError> {
    if value.is_empty() {
        return Err(KeyError::Empty { part });
    }
    if value.len() > MAX_PART_LEN {
        return Err(KeyError::TooLong {
            part,
            len: value.len(),
            max: MAX_PART_LEN,
        });
    }
    if let Some((index, _)) = value.char_indices().find(|(_, c)| c.is_control()) {
        return Err(KeyError::ControlCharacter { part, index });
    }
    Ok(())
}

/// A validated idempotency key: the scope it lives in plus the key itself.
///
/// Two scopes never see each other's records, so the same client key used for two
/// operations (or by two accounts) is two independent records.
///
/// Rules, checked by [`Key::new`]: each part is non-empty, at most [`MAX_PART_LEN`]
/// bytes, and free of control characters. Any UTF-8 text is accepted otherwise.
///
/// `Debug` and `Display` never print the key: they print a short hash
/// ([`Key::short_hash`]) that is enough to correlate log lines.
///
/// ```
/// use idem_core::Key;
///
/// let key = Key::new("acct_42/payments.create", "3f1c9a8e-order-1187")?;
/// assert_eq!(key.scope(), "acct_42/payments.create");
/// assert!(!format!("{key:?}").contains("order-1187"));
/// assert!(Key::new("acct_42/payments.create", "").is_err());
/// # Ok::<(), idem_core::key::KeyError>(())
/// ```
#[derive(Clone)]
pub struct Key {
    // Scope then key in one shared allocation, so the many copies a key goes through
    // (lease, record, map entry) cost a reference count, and making one costs one
    // allocation. `split` is where the key begins.
    text: Arc<str>,
    split: usize,
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.split == other.split && self.text == other.text
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.scope().hash(state);
        self.key().hash(state);
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// By scope, then by key.
impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.scope(), self.key()).cmp(&(other.scope(), other.key()))
    }
}

impl Key {
    /// Validates and builds a key.
    ///
    /// # Errors
    /// [`KeyError`] naming the part and the rule it broke.
    pub fn new(scope: impl Into<String>, key: impl Into<String>) -> Result<Self, KeyError> {
        let (mut scope, key): (String, String) = (scope.into(), key.into());
        validate(KeyPart::Scope, &scope)?;
        validate(KeyPart::Key, &key)?;
        let split = scope.len();
        scope.push_str(&key);
        Ok(Self {
            text: scope.into(),
            split,
        })
    }

    /// The scope: the owner plus the operation.
    pub fn scope(&self) -> &str {
        &self.text[..self.split]
    }

    /// The key within the scope.
    pub fn key(&self) -> &str {
        &self.text[self.split..]
    }

    /// A short, stable hash of scope and key for logs and metrics labels: 8 hex digits of
    /// SHA-256, or of HMAC-SHA-256 once [`set_log_hash_secret`] ran (do that when keys
    /// are guessable).
    ///
    /// ```
    /// # use idem_core::Key;
    /// let key = Key::new("s", "k")?;
    /// assert_eq!(key.short_hash().to_string().len(), 8);
    /// # Ok::<(), idem_core::key::KeyError>(())
    /// ```
    pub fn short_hash(&self) -> ShortHash {
        let scope_len = (self.split as u64).to_be_bytes();
        short_hash_of(&[
            &scope_len[..],
            self.scope().as_bytes(),
            self.key().as_bytes(),
        ])
    }
}

/// A short, stable hash of a scope alone, for metric labels and logs where the scope may
/// hold an account id: 8 hex digits, keyed like [`Key::short_hash`] once
/// [`set_log_hash_secret`] ran, and never equal to a key's hash of the same text.
///
/// ```
/// use idem_core::key::scope_short_hash;
///
/// let label = scope_short_hash("acct_42/payments.create").to_string();
/// assert_eq!(label.len(), 8);
/// assert_eq!(label, scope_short_hash("acct_42/payments.create").to_string());
/// ```
pub fn scope_short_hash(scope: &str) -> ShortHash {
    // The marker keeps a scope's hash apart from any key's: a key's hash starts with the
    // scope's length, never with u64::MAX.
    short_hash_of(&[&u64::MAX.to_be_bytes()[..], b"scope", scope.as_bytes()])
}

fn short_hash_of(parts: &[&[u8]]) -> ShortHash {
    let digest: [u8; 32] = match LOG_HASH.get() {
        Some(keyed) => {
            let mut mac = keyed.clone();
            parts.iter().for_each(|part| mac.update(part));
            mac.finalize().into_bytes().into()
        }
        None => {
            let mut hash = Sha256::new();
            parts.iter().for_each(|part| hash.update(part));
            hash.finalize().into()
        }
    };
    ShortHash([digest[0], digest[1], digest[2], digest[3]])
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key(#{})", self.short_hash())
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.short_hash())
    }
}

/// The first four bytes of a SHA-256, printed as eight hex digits: safe to log.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ShortHash([u8; 4]);

impl fmt::Display for ShortHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// A validated step name, as used by checkpoints: same rules as a key part.
///
/// ```
/// use idem_core::key::StepName;
///
/// let step = StepName::new("charge")?;
/// assert_eq!(step.as_str(), "charge");
/// assert!(StepName::new("bad\nname").is_err());
/// # Ok::<(), idem_core::key::KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct StepName(String);

impl StepName {
    /// Validates and builds a step name.
    ///
    /// # Errors
    /// [`KeyError`] with [`KeyPart::Step`] naming the rule it broke.
    pub fn new(name: impl Into<String>) -> Result<Self, KeyError> {
        let name = name.into();
        validate(KeyPart::Step, &name)?;
        Ok(Self(name))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StepName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_limits_and_unicode() {
        let long = "k".repeat(MAX_PART_LEN);
        assert!(Key::new(long.clone(), long).is_ok());
        assert!(Key::new("bestellung/zahlung", "schlüssel-✓-鍵").is_ok());
    }

    #[test]
    fn names_the_broken_rule() {
        assert_eq!(
            Key::new("", "k"),
            Err(KeyError::Empty {
                part: KeyPart::Scope
            })
        );
        assert_eq!(
            Key::new("s", "k".repeat(256)),
            Err(KeyError::TooLong {
                part: KeyPart::Key,
                len: 256,
                max: 255
            })
        );
        assert_eq!(
            Key::new("s", "ab\u{0}"),
            Err(KeyError::ControlCharacter {
                part: KeyPart::Key,
                index: 2
            })
        );
        // 128 two-byte characters are 256 bytes: the limit is in bytes, not characters.
        assert!(matches!(
            Key::new("é".repeat(128), "k"),
            Err(KeyError::TooLong { len: 256, .. })
        ));
        let message = Key::new("s", "a\tb").unwrap_err().to_string();
        assert!(message.contains("control character"), "{message}");
    }

    #[test]
    fn never_prints_the_key() {
        let key = Key::new("scope-secret", "key-secret").unwrap();
        for shown in [format!("{key:?}"), format!("{key}")] {
            assert!(!shown.contains("secret"), "{shown}");
        }
        assert_ne!(
            Key::new("ab", "c").unwrap().short_hash(),
            Key::new("a", "bc").unwrap().short_hash()
        );
    }
}
