//! How stores name a record in a flat key space: one injective encoding, shared by every
//! backend that needs one (Redis keys, DynamoDB partition keys).
//!
//! A record's name is `<scope length>:<scope>:<key>`, lengths in bytes, in decimal. A
//! namespace (a key prefix several applications or tenants share a server under) is
//! written the same way in front: `<namespace length>:<namespace>`. Because every part
//! that could be confused with its neighbour is length-prefixed, no two different
//! (namespace, scope, key) triples ever meet in one name, whatever bytes they hold, and
//! the names of one namespace are exactly those that begin with its
//! [`namespace_prefix`]: a namespace that is a prefix of another (`tenant` and
//! `tenant1`) shares no name with it, and a scan by prefix reaches only its own records.
//!
//! ```
//! use idem_core::{Key, raw::storage_name};
//!
//! let key = Key::new("acct_42/payments.create", "order-1187")?;
//! assert_eq!(storage_name::key_name(&key), "23:acct_42/payments.create:order-1187");
//! assert_eq!(
//!     storage_name::namespaced_key_name("billing", &key),
//!     "7:billing23:acct_42/payments.create:order-1187",
//! );
//! assert_eq!(storage_name::parse_key_name(&storage_name::key_name(&key))?, key);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt::Write as _;

use crate::{Key, key::KeyError};

/// Why a stored name could not be read back as a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StorageNameError {
    /// The name does not have the shape `<length>:<text>...` where a length was expected.
    #[error("a stored record name is malformed: {what}")]
    Malformed {
        /// What was wrong with it.
        what: &'static str,
    },
    /// The name belongs to another namespace.
    #[error("a stored record name belongs to another namespace")]
    OtherNamespace,
    /// The scope or key it holds breaks the key rules.
    #[error("a stored record name holds an invalid key")]
    InvalidKey(#[from] KeyError),
}

fn push_part(out: &mut String, part: &str) {
    // Writing to a String cannot fail.
    let _ = write!(out, "{}:", part.len());
    out.push_str(part);
}

/// `<scope length>:<scope>:<key>`: the record's name inside its store or namespace.
pub fn key_name(key: &Key) -> String {
    let mut out = String::with_capacity(key.scope().len() + key.key().len() + 6);
    push_part(&mut out, key.scope());
    out.push(':');
    out.push_str(key.key());
    out
}

/// `<namespace length>:<namespace>`: what every record name of `namespace` begins with,
/// and nothing else does.
pub fn namespace_prefix(namespace: &str) -> String {
    let mut out = String::with_capacity(namespace.len() + 4);
    push_part(&mut out, namespace);
    out
}

/// [`namespace_prefix`] followed by [`key_name`].
pub fn namespaced_key_name(namespace: &str, key: &Key) -> String {
    let mut out = namespace_prefix(namespace);
    out.push_str(&key_name(key));
    out
}

/// Splits `<length>:<text><rest>` into `text` and `rest`.
fn split_part(name: &str) -> Result<(&str, &str), StorageNameError> {
    let malformed = |what| StorageNameError::Malformed { what };
    let (digits, rest) = name
        .split_once(':')
        .ok_or(malformed("no length before a ':'"))?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed("a length that is not a decimal number"));
    }
    let len: usize = digits
        .parse()
        .map_err(|_| malformed("a length out of range"))?;
    if rest.len() < len || !rest.is_char_boundary(len) {
        return Err(malformed("a length longer than what follows"));
    }
    Ok(rest.split_at(len))
}

/// Reads a name written by [`key_name`] back as the key.
///
/// # Errors
/// [`StorageNameError`] when the name was not written by [`key_name`].
pub fn parse_key_name(name: &str) -> Result<Key, StorageNameError> {
    let (scope, rest) = split_part(name)?;
    let key = rest.strip_prefix(':').ok_or(StorageNameError::Malformed {
        what: "no ':' between scope and key",
    })?;
    Ok(Key::new(scope, key)?)
}

/// Reads a name written by [`namespaced_key_name`] for `namespace` back as the key.
///
/// # Errors
/// [`StorageNameError::OtherNamespace`] for a name of another namespace, and the errors of
/// [`parse_key_name`].
pub fn parse_namespaced_key_name(namespace: &str, name: &str) -> Result<Key, StorageNameError> {
    let rest = name
        .strip_prefix(&namespace_prefix(namespace))
        .ok_or(StorageNameError::OtherNamespace)?;
    parse_key_name(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(scope: &str, key: &str) -> Key {
        Key::new(scope, key).unwrap()
    }

    #[test]
    fn the_collision_of_issue_11_cannot_happen() {
        // Prefixes `tenantX1` and `tenantX` used to meet in `tenantX11:x:y:zzzzzzz:w`.
        let a = namespaced_key_name("tenantX1", &key("x", "y:zzzzzzz:w"));
        let b = namespaced_key_name("tenantX", &key("x:y:zzzzzzz", "w"));
        assert_ne!(a, b);
        assert!(!a.starts_with(&namespace_prefix("tenantX")));
        assert!(!b.starts_with(&namespace_prefix("tenantX1")));
    }

    #[test]
    fn names_are_injective_over_awkward_parts() {
        let parts = [
            "a", "ab", "b", "1", "11", "1:", ":", "::", "a:b", "1:a", "9", "10:", "é", "{", "}",
        ];
        let mut seen = std::collections::HashMap::new();
        for ns in ["", "a", "a1", "1", "1:", ":"] {
            for scope in parts {
                for k in parts {
                    let name = namespaced_key_name(ns, &key(scope, k));
                    let triple = (ns.to_owned(), scope.to_owned(), k.to_owned());
                    if let Some(other) = seen.insert(name.clone(), triple.clone()) {
                        panic!("{triple:?} and {other:?} both map to {name:?}");
                    }
                    assert_eq!(parse_namespaced_key_name(ns, &name), Ok(key(scope, k)));
                    // Exactly its own namespace begins the name.
                    for other in ["", "a", "a1", "1", "1:", ":"] {
                        assert_eq!(
                            name.starts_with(&namespace_prefix(other)),
                            other == ns,
                            "{name:?} and namespace {other:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn malformed_names_are_errors_not_panics() {
        for bad in [
            "", "x", ":", "5:ab", "a:b:c", "2:ab", "1:é:k", "-1:a:b", "2:ab:",
        ] {
            assert!(parse_key_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_namespaced_key_name("b", "1:a1:x:y"),
            Err(StorageNameError::OtherNamespace)
        );
    }
}
