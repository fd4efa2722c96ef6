//! Request fingerprints: what makes two requests under one key "the same request".

use std::fmt;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A SHA-256 over the request's significant fields.
///
/// A retry under the same key must carry the same fingerprint; a different one is a
/// mismatch (the client reused a key for a different request), never a replay.
///
/// Equality is constant time. `Debug` shows only the first four bytes.
///
/// ```
/// use idem_core::Fingerprint;
/// use serde_json::json;
///
/// // Reordered JSON is the same request.
/// let a = Fingerprint::of_json(&json!({"amount": 500, "currency": "EUR"}))?;
/// let b = Fingerprint::of_json(&json!({"currency": "EUR", "amount": 500}))?;
/// assert_eq!(a, b);
///
/// // Fields are length-prefixed, so ("ab", "c") and ("a", "bc") differ.
/// let x = Fingerprint::builder().field("ab").field("c").finish();
/// let y = Fingerprint::builder().field("a").field("bc").finish();
/// assert_ne!(x, y);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Copy)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The SHA-256 of raw bytes, such as a request body you already canonicalised.
    pub fn of_bytes(bytes: impl AsRef<[u8]>) -> Self {
        Self(Sha256::digest(bytes.as_ref()).into())
    }

    /// The SHA-256 of a value's canonical JSON form: object keys sorted at every depth, no
    /// insignificant whitespace. Two values that differ only in key order match.
    ///
    /// # Errors
    /// When `value` cannot be serialised to JSON (a map with non-string keys, say).
    pub fn of_json<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        let value = serde_json::to_value(value)?;
        let mut hasher = Sha256::new();
        write_canonical(&value, &mut hasher)?;
        Ok(Self(hasher.finalize().into()))
    }

    /// Starts a fingerprint over a sequence of fields.
    pub fn builder() -> FingerprintBuilder {
        FingerprintBuilder(Sha256::new())
    }

    /// Rebuilds a fingerprint read back from storage.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The 32 bytes, for storage.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl PartialEq for Fingerprint {
    fn eq(&self, other: &Self) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

impl Eq for Fingerprint {}

impl std::hash::Hash for Fingerprint {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Fingerprint({:02x}{:02x}{:02x}{:02x}…)",
            self.0[0], self.0[1], self.0[2], self.0[3]
        )
    }
}

/// Builds a [`Fingerprint`] from fields, each length-prefixed so that field boundaries
/// count: `("ab", "c")` and `("a", "bc")` give different fingerprints.
///
/// ```
/// use idem_core::Fingerprint;
///
/// let fp = Fingerprint::builder()
///     .field("POST")
///     .field("/v1/payments")
///     .field(500_u64.to_be_bytes())
///     .finish();
/// # let _ = fp;
/// ```
#[derive(Clone)]
pub struct FingerprintBuilder(Sha256);

impl FingerprintBuilder {
    /// Adds one field.
    pub fn field(mut self, bytes: impl AsRef<[u8]>) -> Self {
        let bytes = bytes.as_ref();
        self.0.update((bytes.len() as u64).to_be_bytes());
        self.0.update(bytes);
        self
    }

    /// Finishes the fingerprint.
    pub fn finish(self) -> Fingerprint {
        Fingerprint(self.0.finalize().into())
    }
}

impl fmt::Debug for FingerprintBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FingerprintBuilder")
    }
}

/// Writes `value` as JSON with object keys sorted, whatever map order serde_json uses.
fn write_canonical(value: &Value, out: &mut Sha256) -> Result<(), serde_json::Error> {
    match value {
        Value::Array(items) => {
            out.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.update(b",");
                }
                write_canonical(item, out)?;
            }
            out.update(b"]");
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.update(b"{");
            for (i, (name, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.update(b",");
                }
                out.update(serde_json::to_vec(name)?);
                out.update(b":");
                write_canonical(item, out)?;
            }
            out.update(b"}");
        }
        scalar => out.update(serde_json::to_vec(scalar)?),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn canonical_at_every_depth() {
        let a = json!({"b": {"y": 1, "x": [{"q": 1, "p": 2}]}, "a": null});
        let b = json!({"a": null, "b": {"x": [{"p": 2, "q": 1}], "y": 1}});
        assert_eq!(
            Fingerprint::of_json(&a).unwrap(),
            Fingerprint::of_json(&b).unwrap()
        );
        let c = json!({"a": null, "b": {"x": [{"p": 2, "q": 2}], "y": 1}});
        assert_ne!(
            Fingerprint::of_json(&a).unwrap(),
            Fingerprint::of_json(&c).unwrap()
        );
        // Array order is significant.
        assert_ne!(
            Fingerprint::of_json(&json!([1, 2])).unwrap(),
            Fingerprint::of_json(&json!([2, 1])).unwrap()
        );
    }

    #[test]
    fn canonical_form_is_compact_sorted_json() {
        let fp = Fingerprint::of_json(&json!({"b": "x", "a": [1, {"d": true, "c": 1.5}]}));
        let expected = Fingerprint::of_bytes(br#"{"a":[1,{"c":1.5,"d":true}],"b":"x"}"#);
        assert_eq!(fp.unwrap(), expected);
    }

    #[test]
    fn fields_are_length_prefixed() {
        let ab_c = Fingerprint::builder().field("ab").field("c").finish();
        let a_bc = Fingerprint::builder().field("a").field("bc").finish();
        assert_ne!(ab_c, a_bc);
        assert_ne!(ab_c, Fingerprint::of_bytes("abc"));
        assert_eq!(ab_c, Fingerprint::builder().field("ab").field("c").finish());
    }

    #[test]
    fn debug_is_short() {
        let fp = Fingerprint::from_bytes([0xab; 32]);
        assert_eq!(format!("{fp:?}"), "Fingerprint(abababab…)");
        assert_eq!(fp.as_bytes(), &[0xab; 32]);
    }
}

#[cfg(test)]
mod number_tests {
    use super::*;

    /// Found by the fuzzing: without serde_json's `float_roundtrip`, this integer parsed
    /// to an f64 that printed and parsed back as another, so the same value had two
    /// fingerprints.
    #[test]
    fn a_number_has_one_fingerprint_whatever_its_spelling() {
        let long = format!("40250600002530333{}", "0".repeat(161));
        for text in [
            long.as_str(),
            "0.30000000000000004",
            "1.7976931348623157e308",
            "123456789012345678901234567890e-10",
        ] {
            let value: serde_json::Value = serde_json::from_str(text).unwrap();
            let printed = serde_json::to_string(&value).unwrap();
            let again: serde_json::Value = serde_json::from_str(&printed).unwrap();
            assert_eq!(
                Fingerprint::of_json(&value).unwrap(),
                Fingerprint::of_json(&again).unwrap(),
                "{text} printed as {printed}"
            );
        }
    }
}
