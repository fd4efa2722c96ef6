//! The codec every stored byte goes through: results, stored failures and step
//! checkpoints. The default stores bytes as they are; [`Aes256GcmCodec`] encrypts them.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};

use crate::record::ValuePart;
use crate::{Fingerprint, Key};

/// Where a value is stored: the record (scope and key), the request it answers (its
/// fingerprint) and which of the record's values it is. A [`Codec`] binds its output to
/// it.
#[derive(Clone, Debug)]
pub struct StoredAt<'a> {
    /// The record's key.
    pub key: &'a Key,
    /// The fingerprint of the request the record answers: a value stored for one request
    /// must not decode as the answer to another request under the same key (an earlier
    /// lifetime of the key, copied into a later record).
    pub fingerprint: &'a Fingerprint,
    /// Which value of the record. Bound into every ciphertext, so a stored failure
    /// cannot be replayed as a result, nor one step's value as another's.
    pub part: ValuePart,
}

impl StoredAt<'_> {
    /// The bytes a codec authenticates for this place: an unambiguous encoding of scope,
    /// key, part (each length-prefixed) and fingerprint, under a version tag.
    pub fn associated_data(&self) -> Vec<u8> {
        let (tag, step) = match &self.part {
            ValuePart::Result => (b'r', ""),
            ValuePart::Failure => (b'f', ""),
            ValuePart::Step(step) => (b's', step.as_str()),
        };
        let mut out = Vec::with_capacity(64 + self.key.scope().len() + self.key.key().len());
        out.extend_from_slice(b"idem/aad/2");
        out.push(tag);
        for part in [self.key.scope(), self.key.key(), step] {
            out.extend_from_slice(&(part.len() as u32).to_be_bytes());
            out.extend_from_slice(part.as_bytes());
        }
        out.extend_from_slice(self.fingerprint.as_bytes());
        out
    }
}

/// Why a codec could not encode or decode a stored value. The driver never treats such a
/// value as absent (which would run the work again) nor replays it: it answers
/// [`Error::Codec`](crate::Error::Codec).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The ciphertext names a key id this codec does not hold: the key was retired while
    /// records it encrypted are still kept.
    #[error(
        "was encrypted with key id {id}, which this codec does not hold; add it back as an old key until the records it encrypted expire"
    )]
    UnknownKeyId {
        /// The key id the ciphertext names.
        id: u32,
    },
    /// The ciphertext does not authenticate: it was altered, or copied from another record
    /// or another value of this one.
    #[error(
        "does not authenticate under key id {id}: altered at rest, or copied from another record; inspect the record and delete it if it cannot be trusted"
    )]
    Unauthentic {
        /// The key id the ciphertext names.
        id: u32,
    },
    /// The bytes are not in the codec's format (too short, another version, plaintext
    /// written before encryption was turned on).
    #[error(
        "is not in the encrypted format ({reason}); records written before encryption was turned on need Aes256GcmCodec::allow_plaintext_reads"
    )]
    Malformed {
        /// What is wrong with them.
        reason: &'static str,
    },
    /// The system's random number generator failed, so no nonce could be drawn. Nothing
    /// was stored.
    #[error("could not be encrypted: no randomness for a nonce ({reason})")]
    Randomness {
        /// The generator's error.
        reason: String,
    },
}

/// Turns the bytes the driver stores into the bytes the store keeps, and back.
///
/// The driver passes every stored value through it: results, stored failures (including
/// its own markers) and step checkpoints, on [`Idempotency::execute`](crate::Idempotency::execute)
/// and [`Idempotency::execute_bytes`](crate::Idempotency::execute_bytes) alike.
///
/// - `encode` then `decode` at the same [`StoredAt`] gives the bytes back.
/// - `decode` at another place (another record, another part) must fail rather than
///   return bytes that would replay there.
/// - A failure is a [`CodecError`], never a panic.
/// - Size limits apply to what `encode` returns: the driver checks the stored size.
///
/// ```
/// use idem_core::{Aes256GcmCodec, Codec, Fingerprint, Key, codec::StoredAt, record::ValuePart};
///
/// let codec = Aes256GcmCodec::new(1, [7; 32]);
/// let key = Key::new("acct_42/payments.create", "order-1")?;
/// let fingerprint = Fingerprint::of_bytes("amount=500");
/// let at = StoredAt { key: &key, fingerprint: &fingerprint, part: ValuePart::Result };
/// let stored = codec.encode(&at, b"ch_1".to_vec())?;
/// assert_eq!(&*codec.decode(&at, &stored)?, b"ch_1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Codec: fmt::Debug + Send + Sync + 'static {
    /// The stored form of `plain`, for the value at `at`.
    ///
    /// # Errors
    /// [`CodecError`] when nothing can be produced; the driver then stores nothing.
    /// Takes the bytes by value, so a codec that keeps them as they are copies nothing.
    fn encode(&self, at: &StoredAt<'_>, plain: Vec<u8>) -> Result<Vec<u8>, CodecError>;

    /// The plain bytes of `stored`, read from the value at `at`.
    ///
    /// # Errors
    /// [`CodecError`] when `stored` is not a value this codec wrote for `at`.
    /// Borrows from `stored` when the plain bytes are there as they are.
    fn decode<'a>(&self, at: &StoredAt<'_>, stored: &'a [u8]) -> Result<Cow<'a, [u8]>, CodecError>;
}

/// The default codec: stores bytes exactly as they are.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainCodec;

impl Codec for PlainCodec {
    fn encode(&self, _: &StoredAt<'_>, plain: Vec<u8>) -> Result<Vec<u8>, CodecError> {
        Ok(plain)
    }

    fn decode<'a>(&self, _: &StoredAt<'_>, stored: &'a [u8]) -> Result<Cow<'a, [u8]>, CodecError> {
        Ok(Cow::Borrowed(stored))
    }
}

/// The first byte of every ciphertext: format version 1. Never the first byte of JSON
/// (it is not valid UTF-8 on its own), so plaintext records are told apart.
const FORMAT_V1: u8 = 0xA1;
const KEY_ID_LEN: usize = 4;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
const HEADER_LEN: usize = 1 + KEY_ID_LEN + NONCE_LEN;

/// A setting of [`Aes256GcmCodec`] that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyringError {
    /// Two keys were given the same id: a ciphertext could not say which one made it.
    #[error("key id {id} is given twice; give every key its own id")]
    DuplicateKeyId {
        /// The id given twice.
        id: u32,
    },
}

/// AES-256-GCM encryption of every stored value, with key rotation.
///
/// - Stored form: a version byte, the 4-byte id of the key that encrypted it, a random
///   96-bit nonce, then the ciphertext and its 16-byte tag (33 bytes over the plaintext).
/// - Associated data: scope, key, the request's fingerprint and which value
///   ([`StoredAt::associated_data`]), so a ciphertext copied into another record, into a
///   later record of the same key for another request, or from a failure into a result,
///   does not decode ([`CodecError::Unauthentic`]). A copy from an earlier lifetime of the
///   same key *for the same request* (same fingerprint) does decode: it is that request's
///   own answer, as a replay would give it.
/// - Rotation without a migration: encrypt with the newest key, keep older ones for
///   decoding ([`Aes256GcmCodec::with_old_key`]) until the records they encrypted expire
///   (the retention).
/// - Random nonces: keep under 2^32 values encrypted per key (NIST SP 800-38D), that is,
///   rotate well before four billion stored values.
///
/// What it does not protect: the scope and key (the lookup key, stored in clear), the
/// fingerprint (already a SHA-256), step names, states, tokens and times. Keys are held in
/// memory for the life of the codec; its `Debug` prints only their ids.
///
/// ```
/// use idem_core::{Aes256GcmCodec, Fingerprint, Idempotency, Key, MemoryStore, done};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// // Load the keys from your secret manager; never from source code.
/// let (old, new) = ([1u8; 32], [2u8; 32]);
/// let codec = Aes256GcmCodec::new(2, new).with_old_key(1, old)?;
/// let idem = Idempotency::builder(MemoryStore::new()).codec(codec).build()?;
/// let key = Key::new("acct_42/payments.create", "order-1")?;
/// let outcome = idem
///     .execute(&key, Fingerprint::of_bytes("req"), |_ctx| async {
///         done("card 4242, Ada Lovelace".to_string())
///     })
///     .await?;
/// assert_eq!(outcome.value().as_deref(), Some("card 4242, Ada Lovelace"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct Aes256GcmCodec {
    current: u32,
    keys: BTreeMap<u32, Aes256Gcm>,
    allow_plaintext: bool,
}

impl Aes256GcmCodec {
    /// A codec that encrypts with `key`, named `id` in every ciphertext.
    pub fn new(id: u32, key: [u8; 32]) -> Self {
        let mut keys = BTreeMap::new();
        keys.insert(id, Aes256Gcm::new(&key.into()));
        Self {
            current: id,
            keys,
            allow_plaintext: false,
        }
    }

    /// Also decodes values encrypted with an older `key` under `id`; never encrypts with
    /// it.
    ///
    /// # Errors
    /// [`KeyringError::DuplicateKeyId`] when `id` is taken.
    pub fn with_old_key(mut self, id: u32, key: [u8; 32]) -> Result<Self, KeyringError> {
        if self.keys.contains_key(&id) {
            return Err(KeyringError::DuplicateKeyId { id });
        }
        self.keys.insert(id, Aes256Gcm::new(&key.into()));
        Ok(self)
    }

    /// Reads values that are not in the encrypted format as plaintext, for the time it
    /// takes records written before encryption was turned on to expire. Off by default:
    /// while on, anyone who can write to the store can plant a plaintext value.
    pub fn allow_plaintext_reads(mut self) -> Self {
        self.allow_plaintext = true;
        self
    }

    /// The bytes encryption adds to every value: version, key id, nonce and tag.
    pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;

    /// The id of the key new values are encrypted with.
    pub fn current_key_id(&self) -> u32 {
        self.current
    }
}

impl fmt::Debug for Aes256GcmCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Aes256GcmCodec")
            .field("current_key_id", &self.current)
            .field("key_ids", &self.keys.keys().collect::<Vec<_>>())
            .field("allow_plaintext", &self.allow_plaintext)
            .finish()
    }
}

impl Codec for Aes256GcmCodec {
    fn encode(&self, at: &StoredAt<'_>, plain: Vec<u8>) -> Result<Vec<u8>, CodecError> {
        let cipher = &self.keys[&self.current];
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|err| CodecError::Randomness {
            reason: err.to_string(),
        })?;
        let aad = at.associated_data();
        let sealed = cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: &plain,
                    aad: &aad,
                },
            )
            // Encryption fails only for inputs over 64 GiB, far beyond any record.
            .map_err(|_| CodecError::Malformed {
                reason: "the value is too large to encrypt",
            })?;
        let mut out = Vec::with_capacity(HEADER_LEN + sealed.len());
        out.push(FORMAT_V1);
        out.extend_from_slice(&self.current.to_be_bytes());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    fn decode<'a>(&self, at: &StoredAt<'_>, stored: &'a [u8]) -> Result<Cow<'a, [u8]>, CodecError> {
        if stored.first() != Some(&FORMAT_V1) {
            if self.allow_plaintext {
                return Ok(Cow::Borrowed(stored));
            }
            return Err(CodecError::Malformed {
                reason: "no encryption header",
            });
        }
        if stored.len() < HEADER_LEN + TAG_LEN {
            return Err(CodecError::Malformed {
                reason: "shorter than an encryption header and tag",
            });
        }
        let (header, sealed) = stored.split_at(HEADER_LEN);
        let id = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
        let cipher = self.keys.get(&id).ok_or(CodecError::UnknownKeyId { id })?;
        let aad = at.associated_data();
        cipher
            .decrypt(
                Nonce::from_slice(&header[1 + KEY_ID_LEN..]),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .map(Cow::Owned)
            .map_err(|_| CodecError::Unauthentic { id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FINGERPRINT: Fingerprint = Fingerprint::from_bytes([5; 32]);

    fn at(key: &Key, part: ValuePart) -> StoredAt<'_> {
        StoredAt {
            key,
            fingerprint: &FINGERPRINT,
            part,
        }
    }

    #[test]
    fn round_trips_and_hides_the_plaintext() {
        let codec = Aes256GcmCodec::new(9, [3; 32]);
        let key = Key::new("s", "k").unwrap();
        let plain = b"Ada Lovelace, 4242";
        let stored = codec
            .encode(&at(&key, ValuePart::Result), plain.to_vec())
            .unwrap();
        assert_eq!(stored.len(), plain.len() + Aes256GcmCodec::OVERHEAD);
        assert!(!stored.windows(plain.len()).any(|w| w == plain));
        let again = codec
            .encode(&at(&key, ValuePart::Result), plain.to_vec())
            .unwrap();
        assert_ne!(stored, again, "a fresh nonce every time");
        assert_eq!(
            &*codec.decode(&at(&key, ValuePart::Result), &stored).unwrap(),
            plain
        );
    }

    #[test]
    fn refuses_other_places_tampering_and_unknown_keys() {
        let codec = Aes256GcmCodec::new(1, [3; 32]);
        let key = Key::new("s", "k").unwrap();
        let other = Key::new("s", "k2").unwrap();
        let stored = codec
            .encode(&at(&key, ValuePart::Result), b"v".to_vec())
            .unwrap();
        // The same key for another request: a later lifetime of the key.
        let another_request = Fingerprint::from_bytes([6; 32]);
        for wrong in [
            at(&other, ValuePart::Result),
            at(&key, ValuePart::Failure),
            at(&key, ValuePart::Step("charge".into())),
            StoredAt {
                key: &key,
                fingerprint: &another_request,
                part: ValuePart::Result,
            },
        ] {
            assert_eq!(
                codec.decode(&wrong, &stored),
                Err(CodecError::Unauthentic { id: 1 })
            );
        }
        let mut flipped = stored.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(
            codec.decode(&at(&key, ValuePart::Result), &flipped),
            Err(CodecError::Unauthentic { id: 1 })
        );
        let rotated_away = Aes256GcmCodec::new(2, [4; 32]);
        assert_eq!(
            rotated_away.decode(&at(&key, ValuePart::Result), &stored),
            Err(CodecError::UnknownKeyId { id: 1 })
        );
        let rotated = Aes256GcmCodec::new(2, [4; 32])
            .with_old_key(1, [3; 32])
            .unwrap();
        assert_eq!(
            &*rotated
                .decode(&at(&key, ValuePart::Result), &stored)
                .unwrap(),
            b"v"
        );
        assert_eq!(
            rotated
                .encode(&at(&key, ValuePart::Result), b"v".to_vec())
                .unwrap()[1..5],
            2u32.to_be_bytes()
        );
        assert!(matches!(
            codec.decode(&at(&key, ValuePart::Result), b"{\"plain\":1}"),
            Err(CodecError::Malformed { .. })
        ));
        assert!(matches!(
            codec.decode(&at(&key, ValuePart::Result), &stored[..20]),
            Err(CodecError::Malformed { .. })
        ));
        assert_eq!(
            Aes256GcmCodec::new(1, [0; 32])
                .with_old_key(1, [1; 32])
                .unwrap_err(),
            KeyringError::DuplicateKeyId { id: 1 }
        );
        let lenient = Aes256GcmCodec::new(1, [3; 32]).allow_plaintext_reads();
        assert_eq!(
            &*lenient
                .decode(&at(&key, ValuePart::Result), b"{\"plain\":1}")
                .unwrap(),
            b"{\"plain\":1}"
        );
        assert!(!format!("{codec:?}").contains("[3"));
    }

    #[test]
    fn associated_data_is_unambiguous() {
        let a = Key::new("ab", "c").unwrap();
        let b = Key::new("a", "bc").unwrap();
        assert_ne!(
            at(&a, ValuePart::Result).associated_data(),
            at(&b, ValuePart::Result).associated_data()
        );
    }
}
