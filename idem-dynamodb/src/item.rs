//! The item layout: attribute names, and converting between items and records.

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use idem_core::{AttemptId, Fingerprint, Key, Record, State, Steps, StoreError, Timestamp};

/// Partition key: `<prefix><scope length>:<scope>:<key>` (string).
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
/// of expiry and lease end (number).
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

pub(crate) fn partition_key(prefix: &str, key: &Key) -> String {
    format!(
        "{prefix}{}:{}:{}",
        key.scope().len(),
        key.scope(),
        key.key()
    )
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

/// Epoch seconds, rounded up, of the later of two instants.
pub(crate) fn ttl_seconds(a: Timestamp, b: Timestamp) -> u64 {
    a.max(b).as_unix_millis().div_ceil(1000)
}

fn corrupt(what: &'static str) -> StoreError {
    StoreError::Corrupt { what, source: None }
}

fn number(
    item: &HashMap<String, AttributeValue>,
    name: &str,
    what: &'static str,
) -> Result<u64, StoreError> {
    match item.get(name) {
        Some(AttributeValue::N(text)) => text.parse().map_err(|_| corrupt(what)),
        _ => Err(corrupt(what)),
    }
}

fn binary<'i>(
    item: &'i HashMap<String, AttributeValue>,
    name: &str,
    what: &'static str,
) -> Result<&'i [u8], StoreError> {
    match item.get(name) {
        Some(AttributeValue::B(blob)) => Ok(blob.as_ref()),
        _ => Err(corrupt(what)),
    }
}

/// A record from an item, and whether its last claim was a takeover.
pub(crate) fn decode(
    key: &Key,
    item: &HashMap<String, AttributeValue>,
) -> Result<(Record, bool), StoreError> {
    let state = match item.get(STATE) {
        Some(AttributeValue::S(text)) => {
            State::parse(text).ok_or_else(|| corrupt("an unknown state"))?
        }
        _ => return Err(corrupt("a missing state")),
    };
    let mut steps = Steps::new();
    if let Some(AttributeValue::M(map)) = item.get(STEPS) {
        for (name, value) in map {
            let AttributeValue::B(blob) = value else {
                return Err(corrupt("a step value that is not binary"));
            };
            steps.insert(name.clone(), blob.as_ref().to_vec());
        }
    }
    let response = match item.get(RESPONSE) {
        Some(AttributeValue::B(blob)) => Some(blob.as_ref().to_vec()),
        Some(_) => return Err(corrupt("a response that is not binary")),
        None => None,
    };
    let record = Record {
        key: key.clone(),
        fingerprint: Fingerprint::from_bytes(
            binary(item, FINGERPRINT, "a missing fingerprint")?
                .try_into()
                .map_err(|_| corrupt("a fingerprint that is not 32 bytes"))?,
        ),
        state,
        token: number(item, TOKEN, "a missing token")?,
        attempt: AttemptId::from_bytes(
            binary(item, ATTEMPT, "a missing attempt id")?
                .try_into()
                .map_err(|_| corrupt("an attempt id that is not 16 bytes"))?,
        ),
        lease_until: Timestamp::from_unix_millis(number(item, LEASE_UNTIL, "a missing lease end")?),
        created_at: Timestamp::from_unix_millis(number(
            item,
            CREATED_AT,
            "a missing creation time",
        )?),
        expires_at: Timestamp::from_unix_millis(number(item, EXPIRES_AT, "a missing expiry")?),
        response,
        steps,
    };
    let resumed = matches!(item.get(RESUMED), Some(AttributeValue::Bool(true)));
    Ok((record, resumed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_keys_are_unambiguous() {
        let a = partition_key("p#", &Key::new("ab", "c").unwrap());
        let b = partition_key("p#", &Key::new("a", "bc").unwrap());
        assert_ne!(a, b);
        assert_eq!(a, "p#2:ab:c");
    }

    #[test]
    fn ttl_is_the_later_instant_rounded_up() {
        let t = |ms| Timestamp::from_unix_millis(ms);
        assert_eq!(ttl_seconds(t(1_001), t(500)), 2);
        assert_eq!(ttl_seconds(t(1_000), t(2_000)), 2);
    }
}
