//! The item layout: attribute names, and converting between items and records.

use std::collections::HashMap;

use std::time::Duration;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use idem_core::{Key, Record, StoreError, Timestamp, raw::storage_name};

/// Partition key: `<prefix length>:<prefix><scope length>:<scope>:<key>` (string; see
/// [`idem_core::raw::storage_name`]).
pub const PK: &str = "pk";
/// Fingerprint (binary, 32 bytes).
pub const FINGERPRINT: &str = "fp";
/// State: `in_progress`, `completed` or `failed` (string).
pub const STATE: &str = "st";
/// Fencing token (number).
pub const TOKEN: &str = "tk";
/// Attempt id of the current owner (binary, 16 bytes).
pub const ATTEMPT: &str = "at";
/// Lease end, milliseconds since the epoch on the client's clock (number).
pub const LEASE_UNTIL: &str = "lu";
/// Creation time, milliseconds (number).
pub const CREATED_AT: &str = "ca";
/// Expiry, milliseconds (number); from then on the record counts as absent.
pub const EXPIRES_AT: &str = "ea";
/// Stored response (binary; absent while in progress).
pub const RESPONSE: &str = "rs";
/// Checkpoints: step name to value (map of binaries).
pub const STEPS: &str = "stp";
/// Whether the last claim took over from another attempt (boolean).
pub const RESUMED: &str = "rz";
/// DynamoDB's TTL attribute: epoch *seconds* after which the item may be deleted, the later
/// of expiry and lease end plus the skew margin (number).
pub const TTL: &str = "ttl";

/// Expression attribute names for every attribute (several are reserved words).
pub(crate) const NAMES: [(&str, &str); 12] = [
    ("#pk", PK),
    ("#fp", FINGERPRINT),
    ("#st", STATE),
    ("#tk", TOKEN),
    ("#at", ATTEMPT),
    ("#lu", LEASE_UNTIL),
    ("#ca", CREATED_AT),
    ("#ea", EXPIRES_AT),
    ("#rs", RESPONSE),
    ("#stp", STEPS),
    ("#rz", RESUMED),
    ("#ttl", TTL),
];

/// The item's partition key: injective over (prefix, scope, key), and exactly the keys of
/// one prefix begin with [`storage_name::namespace_prefix`] of it.
pub(crate) fn partition_key(prefix: &str, key: &Key) -> String {
    storage_name::namespaced_key_name(prefix, key)
}

pub(crate) fn n(value: u64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

pub(crate) fn b(bytes: &[u8]) -> AttributeValue {
    AttributeValue::B(Blob::new(bytes))
}

pub(crate) fn s(text: &str) -> AttributeValue {
    AttributeValue::S(text.to_owned())
}

/// The TTL for a record expiring at `expires_at` whose lease ends at `lease_until`: epoch
/// seconds, rounded up, of the later of the expiry and the lease end plus `margin`. No
/// DynamoDB deletion can then come before the record is absent on any client whose clock
/// is within the margin.
pub(crate) fn ttl_seconds(expires_at: Timestamp, lease_until: Timestamp, margin: Duration) -> u64 {
    expires_at
        .max(lease_until.saturating_add(margin))
        .as_unix_millis()
        .div_ceil(1000)
}

fn corrupt(what: &'static str) -> StoreError {
    StoreError::Corrupt {
        what,
        key: None,
        source: None,
    }
}

fn number(item: &HashMap<String, AttributeValue>, name: &str) -> Option<u64> {
    match item.get(name) {
        Some(AttributeValue::N(text)) => text.parse().ok(),
        _ => None,
    }
}

fn binary<'i>(item: &'i HashMap<String, AttributeValue>, name: &str) -> &'i [u8] {
    match item.get(name) {
        Some(AttributeValue::B(blob)) => blob.as_ref(),
        _ => &[],
    }
}

/// A record from an item, and whether its last claim was a takeover.
pub(crate) fn decode(
    key: &Key,
    item: &HashMap<String, AttributeValue>,
) -> Result<(Record, bool), StoreError> {
    let state = match item.get(STATE) {
        Some(AttributeValue::S(text)) => text.as_str(),
        _ => "",
    };
    let response = match item.get(RESPONSE) {
        Some(AttributeValue::B(blob)) => Some(blob.as_ref().to_vec()),
        Some(_) => return Err(corrupt("a response that is not binary").for_key(key)),
        None => None,
    };
    // A number that is missing or does not parse is one core's builder refuses (-1).
    let n = |name| number(item, name).map_or(-1, i128::from);
    let mut parts = Record::parts(key.clone())
        .fingerprint(binary(item, FINGERPRINT))
        .state(state)
        .token(n(TOKEN))
        .attempt(binary(item, ATTEMPT))
        .lease_until_millis(n(LEASE_UNTIL))
        .created_at_millis(n(CREATED_AT))
        .expires_at_millis(n(EXPIRES_AT))
        .response(response);
    match item.get(STEPS) {
        Some(AttributeValue::M(map)) => {
            for (name, value) in map {
                let AttributeValue::B(blob) = value else {
                    return Err(corrupt("a step value that is not binary").for_key(key));
                };
                parts = parts.step(name.as_str(), blob.as_ref().to_vec());
            }
        }
        Some(_) => return Err(corrupt("steps that are not a map").for_key(key)),
        None => {}
    }
    let resumed = matches!(item.get(RESUMED), Some(AttributeValue::Bool(true)));
    Ok((parts.build()?, resumed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_keys_are_unambiguous() {
        let a = partition_key("p#", &Key::new("ab", "c").unwrap());
        let b = partition_key("p#", &Key::new("a", "bc").unwrap());
        assert_ne!(a, b);
        assert_eq!(a, "2:p#2:ab:c");
        // Prefixes `tenantX1` and `tenantX` met in `tenantX11:x:y:zzzzzzz:w`.
        let long = partition_key("tenantX1", &Key::new("x", "y:zzzzzzz:w").unwrap());
        let short = partition_key("tenantX", &Key::new("x:y:zzzzzzz", "w").unwrap());
        assert_ne!(long, short);
        assert!(!long.starts_with(&storage_name::namespace_prefix("tenantX")));
    }

    #[test]
    fn ttl_covers_expiry_and_the_lease_with_its_margin() {
        let t = |ms| Timestamp::from_unix_millis(ms);
        assert_eq!(ttl_seconds(t(1_001), t(500), Duration::ZERO), 2);
        assert_eq!(ttl_seconds(t(1_000), t(2_000), Duration::ZERO), 2);
        assert_eq!(ttl_seconds(t(1_000), t(2_000), Duration::from_secs(2)), 4);
    }

    #[test]
    fn a_malformed_item_is_corrupt_naming_the_field() {
        let key = Key::new("s", "k").unwrap();
        let err = decode(&key, &HashMap::new()).unwrap_err();
        assert!(
            matches!(err, StoreError::Corrupt { what, .. } if what.contains("fingerprint")),
            "{err:?}"
        );
    }

    proptest::proptest! {
        #![proptest_config(idem_testkit::fuzz_config())]

        /// Any item decodes to a record or answers `Corrupt` naming the key.
        #[test]
        fn any_item(
            picks in proptest::collection::vec((0usize..12, 0usize..5, proptest::prelude::any::<u64>(), proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)), 0..16)
        ) {
            use aws_sdk_dynamodb::primitives::Blob;
            let names = [PK, FINGERPRINT, STATE, TOKEN, ATTEMPT, LEASE_UNTIL, CREATED_AT, EXPIRES_AT, RESPONSE, STEPS, RESUMED, TTL];
            let mut item = HashMap::new();
            for (name, kind, number, bytes) in picks {
                let value = match kind {
                    0 => AttributeValue::N(number.to_string()),
                    1 => AttributeValue::S(String::from_utf8_lossy(&bytes).into_owned()),
                    2 => AttributeValue::B(Blob::new(bytes)),
                    3 => AttributeValue::Bool(number % 2 == 0),
                    _ => AttributeValue::M(HashMap::from([(
                        String::from_utf8_lossy(&bytes).into_owned(),
                        AttributeValue::B(Blob::new(number.to_be_bytes().to_vec())),
                    )])),
                };
                item.insert(names[name].to_owned(), value);
            }
            let key = Key::new("fuzz", "item").unwrap();
            if let Err(err) = decode(&key, &item) {
                let named = matches!(err, StoreError::Corrupt { key: Some(_), .. });
                proptest::prop_assert!(named, "{err:?}");
            }
        }
    }
}
