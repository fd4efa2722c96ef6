//! Where a record lives: one hash per key, under the configured prefix, with a hash tag.

use idem_core::{Key, raw::storage_name};

/// The prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "idem:";

/// Why a key prefix was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PrefixError {
    /// The prefix held `{` or `}`, which would change the key's cluster hash tag.
    #[error("the key prefix must not contain '{{' or '}}': they decide a key's cluster slot")]
    Braces,
    /// The prefix was longer than 128 bytes.
    #[error("the key prefix is {len} bytes long, over the limit of 128")]
    TooLong {
        /// Its length.
        len: usize,
    },
}

pub(crate) fn check_prefix(prefix: &str) -> Result<(), PrefixError> {
    if prefix.contains(['{', '}']) {
        return Err(PrefixError::Braces);
    }
    if prefix.len() > 128 {
        return Err(PrefixError::TooLong { len: prefix.len() });
    }
    Ok(())
}

/// `<prefix>{<scope length>:<scope>:<key>}` ([`storage_name::key_name`] inside braces).
///
/// - Injective over (prefix, scope, key): the prefix holds no `{`, so the first `{` ends
///   it, whatever the prefix; a prefix that is a prefix of another (`app` and `app1`)
///   never meets it (`app{...` against `app1{...`). The length keeps ("ab", "c") and
///   ("a", "bc") apart.
/// - The braces make the record one cluster hash tag. A `}` inside the scope or key only
///   shortens the tag; the key is still the same for every call.
pub(crate) fn record_key(prefix: &str, key: &Key) -> Vec<u8> {
    let name = storage_name::key_name(key);
    let mut out = Vec::with_capacity(prefix.len() + name.len() + 2);
    out.extend_from_slice(prefix.as_bytes());
    out.push(b'{');
    out.extend_from_slice(name.as_bytes());
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_held_to_128_bytes() {
        assert!(check_prefix(&"p".repeat(128)).is_ok());
        assert!(matches!(
            check_prefix(&"p".repeat(129)),
            Err(PrefixError::TooLong { len: 129 })
        ));
        assert!(matches!(check_prefix("a{b"), Err(PrefixError::Braces)));
    }

    #[test]
    fn keys_are_unambiguous_and_tagged() {
        let a = record_key("p:", &Key::new("ab", "c").unwrap());
        let b = record_key("p:", &Key::new("a", "bc").unwrap());
        assert_ne!(a, b);
        assert_eq!(a, b"p:{2:ab:c}");
        assert_eq!(check_prefix("app{1}"), Err(PrefixError::Braces));
        assert!(check_prefix("billing:idem:").is_ok());
    }

    #[test]
    fn prefixes_that_are_prefixes_of_each_other_never_meet() {
        let short = record_key("t", &Key::new("1x", "k").unwrap());
        let long = record_key("t1", &Key::new("x", "k").unwrap());
        assert_ne!(short, long);
        // What a scan of one prefix would match never reaches the other's keys.
        assert!(!long.starts_with(b"t{"));
    }
}
