//! What the application accepts as an idempotency key, checked before anything is stored.

use std::fmt;
use std::sync::Arc;

/// Which client keys the driver accepts (see
/// [`IdempotencyBuilder::key_policy`](crate::IdempotencyBuilder::key_policy)).
///
/// Checked on the key part of a [`Key`](crate::Key) (not the scope, which the application
/// builds) before any store call: a refused key costs nothing and stores nothing. Short or
/// guessable keys let one client collide with another's retries within a scope, or replay
/// them; a policy makes clients send keys worth their name.
///
/// ```
/// use idem_core::KeyPolicy;
///
/// let uuid = KeyPolicy::uuid();
/// assert!(uuid.check("3f1c9a8e-7d41-4b8e-9a51-0c2f9d4e6b17").is_ok());
/// assert!(uuid.check("order-1").is_err());
///
/// let strong = KeyPolicy::min_entropy_bits(64);
/// assert!(strong.check("1").is_err());
/// assert!(strong.check("k7QpZ2mX9vL4wR8t").is_ok());
/// ```
#[derive(Clone)]
pub struct KeyPolicy(Rule);

#[derive(Clone)]
enum Rule {
    Any,
    MinLength(usize),
    Uuid,
    MinEntropy(u32),
    Custom {
        rule: &'static str,
        check: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    },
}

/// Why a key was refused by a [`KeyPolicy`]. Nothing was stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyPolicyError {
    /// Shorter than the policy's minimum.
    #[error("the key is {len} characters long; this service wants at least {min}")]
    TooShort {
        /// The key's length in characters.
        len: usize,
        /// The minimum.
        min: usize,
    },
    /// Not a UUID in its 36-character text form.
    #[error(
        "the key is not a UUID (like 3f1c9a8e-7d41-4b8e-9a51-0c2f9d4e6b17); send a fresh UUID per operation"
    )]
    NotAUuid,
    /// Its estimated entropy is under the minimum.
    #[error(
        "the key carries about {bits} bits of entropy; this service wants at least {min}: send a random key such as a UUID"
    )]
    TooLittleEntropy {
        /// The estimate ([`KeyPolicy::estimate_entropy_bits`]).
        bits: u32,
        /// The minimum.
        min: u32,
    },
    /// Refused by the application's own rule.
    #[error("the key breaks this service's rule: {rule}")]
    Refused {
        /// The rule, as the application described it.
        rule: &'static str,
    },
}

impl KeyPolicy {
    /// Every valid key (the default).
    pub fn any() -> Self {
        Self(Rule::Any)
    }

    /// Keys of at least `min` characters.
    pub fn min_length(min: usize) -> Self {
        Self(Rule::MinLength(min))
    }

    /// UUIDs in their hyphenated text form, any version, any case.
    pub fn uuid() -> Self {
        Self(Rule::Uuid)
    }

    /// Keys whose estimated entropy ([`KeyPolicy::estimate_entropy_bits`]) is at least
    /// `bits`. 64 refuses counters, dates and order numbers; a UUIDv4 scores 128.
    pub fn min_entropy_bits(bits: u32) -> Self {
        Self(Rule::MinEntropy(bits))
    }

    /// The application's own rule: `check` answers whether a key is acceptable, and
    /// `rule` describes it in the error a client sees.
    ///
    /// ```
    /// use idem_core::KeyPolicy;
    ///
    /// let prefixed = KeyPolicy::custom("keys start with `ik_`", |key| key.starts_with("ik_"));
    /// assert!(prefixed.check("ik_8c1e").is_ok());
    /// assert!(prefixed.check("8c1e").is_err());
    /// ```
    pub fn custom(
        rule: &'static str,
        check: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self(Rule::Custom {
            rule,
            check: Arc::new(check),
        })
    }

    /// Whether `key` is acceptable.
    ///
    /// # Errors
    /// [`KeyPolicyError`] naming the rule it broke.
    pub fn check(&self, key: &str) -> Result<(), KeyPolicyError> {
        match &self.0 {
            Rule::Any => Ok(()),
            Rule::MinLength(min) => {
                let len = key.chars().count();
                if len < *min {
                    return Err(KeyPolicyError::TooShort { len, min: *min });
                }
                Ok(())
            }
            Rule::Uuid => is_uuid(key).then_some(()).ok_or(KeyPolicyError::NotAUuid),
            Rule::MinEntropy(min) => {
                let bits = Self::estimate_entropy_bits(key);
                if bits < *min {
                    return Err(KeyPolicyError::TooLittleEntropy { bits, min: *min });
                }
                Ok(())
            }
            Rule::Custom { rule, check } => check(key)
                .then_some(())
                .ok_or(KeyPolicyError::Refused { rule }),
        }
    }

    /// An upper estimate of a key's entropy: its length (hyphens aside) times the bits of
    /// the smallest alphabet it fits: decimal digits (3.3 bits), hex digits of one case
    /// (4), or the union of the classes it uses (lower case 26, upper case 26, digits 10,
    /// other ASCII 33, anything else 1000). A key of one repeated character scores 0.
    ///
    /// It cannot see structure (`"order-0000000001"` scores high); it stops counters,
    /// dates and short codes, which is what a flood of guessable keys is made of.
    ///
    /// ```
    /// use idem_core::KeyPolicy;
    ///
    /// assert_eq!(KeyPolicy::estimate_entropy_bits("3f1c9a8e-7d41-4b8e-9a51-0c2f9d4e6b17"), 128);
    /// assert_eq!(KeyPolicy::estimate_entropy_bits("123456"), 19);
    /// assert_eq!(KeyPolicy::estimate_entropy_bits("aaaaaaaa"), 0);
    /// ```
    pub fn estimate_entropy_bits(key: &str) -> u32 {
        let chars: Vec<char> = key.chars().filter(|c| *c != '-').collect();
        let Some(first) = chars.first() else {
            return 0;
        };
        if chars.iter().all(|c| c == first) {
            return 0;
        }
        let all = |class: fn(&char) -> bool| chars.iter().all(class);
        let alphabet: u32 = if all(char::is_ascii_digit) {
            10
        } else if all(|c| c.is_ascii_digit() || ('a'..='f').contains(c))
            || all(|c| c.is_ascii_digit() || ('A'..='F').contains(c))
        {
            16
        } else {
            let any = |class: fn(&char) -> bool| chars.iter().any(class);
            [
                (any(char::is_ascii_lowercase), 26),
                (any(char::is_ascii_uppercase), 26),
                (any(char::is_ascii_digit), 10),
                (any(char::is_ascii_punctuation) || any(|c| *c == ' '), 33),
                (any(|c| !c.is_ascii()), 1000),
            ]
            .iter()
            .filter(|(used, _)| *used)
            .map(|(_, size)| size)
            .sum()
        };
        let bits = chars.len() as f64 * f64::from(alphabet).log2();
        bits.floor().min(f64::from(u32::MAX)) as u32
    }
}

fn is_uuid(key: &str) -> bool {
    let bytes = key.as_bytes();
    bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

impl Default for KeyPolicy {
    fn default() -> Self {
        Self::any()
    }
}

impl fmt::Debug for KeyPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Rule::Any => f.write_str("KeyPolicy::any()"),
            Rule::MinLength(min) => write!(f, "KeyPolicy::min_length({min})"),
            Rule::Uuid => f.write_str("KeyPolicy::uuid()"),
            Rule::MinEntropy(bits) => write!(f, "KeyPolicy::min_entropy_bits({bits})"),
            Rule::Custom { rule, .. } => write!(f, "KeyPolicy::custom({rule:?})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rule_names_what_it_refused() {
        assert_eq!(
            KeyPolicy::min_length(8).check("short"),
            Err(KeyPolicyError::TooShort { len: 5, min: 8 })
        );
        assert!(KeyPolicy::min_length(8).check("long enough").is_ok());
        assert!(
            KeyPolicy::uuid()
                .check("3F1C9A8E-7D41-4B8E-9A51-0C2F9D4E6B17")
                .is_ok()
        );
        for bad in [
            "3f1c9a8e7d414b8e9a510c2f9d4e6b17",
            "3f1c9a8e-7d41-4b8e-9a51-0c2f9d4e6b1g",
            "",
        ] {
            assert_eq!(KeyPolicy::uuid().check(bad), Err(KeyPolicyError::NotAUuid));
        }
        assert_eq!(
            KeyPolicy::min_entropy_bits(64).check("2026-11-30"),
            Err(KeyPolicyError::TooLittleEntropy { bits: 26, min: 64 })
        );
        assert!(KeyPolicy::any().check("1").is_ok());
        assert_eq!(KeyPolicy::estimate_entropy_bits("é"), 0);
        assert_eq!(KeyPolicy::estimate_entropy_bits(""), 0);
        assert_eq!(KeyPolicy::estimate_entropy_bits("ab"), 8);
        assert_eq!(
            format!("{:?}", KeyPolicy::custom("r", |_| true)),
            "KeyPolicy::custom(\"r\")"
        );
    }

    /// Each rule's edge passes, and each alphabet of the entropy estimate counts.
    #[test]
    fn edges_pass_and_each_alphabet_counts() {
        assert!(KeyPolicy::min_length(5).check("exact").is_ok());
        let bits = KeyPolicy::estimate_entropy_bits("xk2Qz9");
        assert!(KeyPolicy::min_entropy_bits(bits).check("xk2Qz9").is_ok());
        for (key, bits) in [
            ("3f1c9a8e", 32), // hex, lower case: 8 × 4
            ("3F1C9A8E", 32), // hex, upper case
            ("abcdefgh", 37), // lower case letters: 8 × log2(26)
            ("ab cd", 29),    // and a space: 5 × log2(26 + 33)
            ("ab.cd", 29),    // and punctuation
            ("éa", 20),       // and beyond ASCII: 2 × log2(1000 + 26)
        ] {
            assert_eq!(KeyPolicy::estimate_entropy_bits(key), bits, "{key}");
        }
    }
}
