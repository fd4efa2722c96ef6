//! The operator's side of the Redis store: `SCAN` over the store's prefix (on every
//! primary of a Cluster), one `HGETALL` per record, and a Lua script for the release.
//!
//! Cost: listing and counting read every record of the prefix (one round trip per record
//! after the scan): fine for an operator's occasional look at thousands of records; for
//! millions, count with the metrics instead.

use async_trait::async_trait;
use idem_core::{
    Admin, Key, Record, State, StoreError, Timestamp, admin::ListQuery, admin::Page,
    admin::ReleaseKeyOutcome, admin::Stats, raw::select_page, raw::storage_name, record::AttemptId,
    store::Operation,
};
use redis::Value;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use crate::errors::{map, unexpected};
use crate::layout;
use crate::store::{Connection, RedisStore};

/// How many keys one `SCAN` call asks for.
const SCAN_COUNT: usize = 1_000;

/// `prefix{*` with the glob characters of the prefix escaped.
fn pattern(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 3);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push_str("{*");
    out
}

fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.as_bytes()),
        _ => None,
    }
}

/// Every key of the store's prefix on one node (`route` a single node of a Cluster, or
/// `None` on a standalone server).
async fn scan_node(
    connection: &Connection,
    prefix: &str,
    route: Option<&SingleNodeRoutingInfo>,
    operation: Operation,
) -> Result<Vec<Vec<u8>>, StoreError> {
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern(prefix))
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let reply: Value = match (connection, route) {
            (Connection::Cluster(cluster), Some(route)) => cluster
                .clone()
                .route_command(cmd, RoutingInfo::SingleNode(route.clone()))
                .await
                .map_err(|err| map(operation, err))?,
            _ => connection
                .query(&cmd)
                .await
                .map_err(|err| map(operation, err))?,
        };
        let Value::Array(parts) = reply else {
            return Err(unexpected("a SCAN reply that is not an array"));
        };
        let [next, Value::Array(found)] = parts.as_slice() else {
            return Err(unexpected("a SCAN reply of another shape"));
        };
        keys.extend(found.iter().filter_map(bytes).map(<[u8]>::to_vec));
        cursor = bytes(next)
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| unexpected("a SCAN cursor that is not a number"))?;
        if cursor == 0 {
            return Ok(keys);
        }
    }
}

/// The addresses of a Cluster's primaries, from `CLUSTER SLOTS`.
async fn primaries(
    connection: &Connection,
    operation: Operation,
) -> Result<Vec<SingleNodeRoutingInfo>, StoreError> {
    let Connection::Cluster(cluster) = connection else {
        return Ok(Vec::new());
    };
    let reply = cluster
        .clone()
        .route_command(
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .map_err(|err| map(operation, err))?;
    let Value::Array(ranges) = reply else {
        return Err(unexpected("a CLUSTER SLOTS reply that is not an array"));
    };
    let mut found: Vec<(String, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        let Some(Value::Array(primary)) = parts.get(2) else {
            continue;
        };
        let host = primary
            .first()
            .and_then(bytes)
            .map(|b| String::from_utf8_lossy(b).into_owned());
        let port = match primary.get(1) {
            Some(Value::Int(port)) => u16::try_from(*port).ok(),
            _ => None,
        };
        if let (Some(host), Some(port)) = (host, port)
            && !found.contains(&(host.clone(), port))
        {
            found.push((host, port));
        }
    }
    Ok(found
        .into_iter()
        .map(|(host, port)| SingleNodeRoutingInfo::ByAddress { host, port })
        .collect())
}

impl RedisStore {
    /// Every record under the prefix, and the server's clock.
    async fn records(&self, operation: Operation) -> Result<(Vec<Record>, Timestamp), StoreError> {
        let connection = self.connection();
        let mut names = Vec::new();
        match connection {
            Connection::Standalone(_) => {
                names = scan_node(connection, self.prefix(), None, operation).await?
            }
            Connection::Cluster(_) => {
                for node in primaries(connection, operation).await? {
                    names.extend(
                        scan_node(connection, self.prefix(), Some(&node), operation).await?,
                    );
                }
            }
        }
        let mut records = Vec::with_capacity(names.len());
        for name in names {
            let Some(key) = self.key_of(&name) else {
                continue;
            };
            let fields: Vec<Vec<u8>> = connection
                .query(redis::cmd("HGETALL").arg(&name))
                .await
                .map_err(|err| map(operation, err))?;
            if fields.is_empty() {
                continue; // deleted since the scan
            }
            records.push(decode(key, fields)?);
        }
        let time: Vec<String> = connection
            .query(&redis::cmd("TIME"))
            .await
            .map_err(|err| map(operation, err))?;
        let now = match time.as_slice() {
            [seconds, micros] => {
                let seconds: u64 = seconds.parse().map_err(|_| unexpected("a bad TIME"))?;
                let micros: u64 = micros.parse().map_err(|_| unexpected("a bad TIME"))?;
                Timestamp::from_unix_millis(seconds * 1000 + micros / 1000)
            }
            _ => return Err(unexpected("a TIME reply of another shape")),
        };
        Ok((records, now))
    }

    /// The key a Redis key name of this store holds.
    fn key_of(&self, name: &[u8]) -> Option<Key> {
        let name = std::str::from_utf8(name).ok()?;
        let inner = name
            .strip_prefix(self.prefix())?
            .strip_prefix('{')?
            .strip_suffix('}')?;
        let key = storage_name::parse_key_name(inner).ok()?;
        // Exactly this store's layout, nothing a longer prefix wrote.
        (layout::record_key(self.prefix(), &key) == name.as_bytes()).then_some(key)
    }
}

/// A record from the fields of its hash.
fn decode(key: Key, fields: Vec<Vec<u8>>) -> Result<Record, StoreError> {
    let mut parts = Record::parts(key);
    let number = |value: &[u8]| -> i128 {
        std::str::from_utf8(value)
            .ok()
            .and_then(|text| text.parse().ok())
            .unwrap_or(-1)
    };
    let mut pairs = fields.into_iter();
    let mut response = None;
    while let (Some(name), Some(value)) = (pairs.next(), pairs.next()) {
        parts = match name.as_slice() {
            b"f" => parts.fingerprint(&value),
            b"s" => parts.state(&value),
            b"t" => parts.token(number(&value)),
            b"a" => parts.attempt(&value),
            b"l" => parts.lease_until_millis(number(&value)),
            b"c" => parts.created_at_millis(number(&value)),
            b"e" => parts.expires_at_millis(number(&value)),
            b"r" => {
                response = Some(value);
                parts
            }
            other => match other.strip_prefix(b"step:") {
                Some(step) => parts.step(step, value),
                None => parts,
            },
        };
    }
    parts.response(response).build()
}

#[async_trait]
impl Admin for RedisStore {
    async fn list(&self, query: &ListQuery) -> Result<Page, StoreError> {
        let (records, now) = self.records(Operation::List).await?;
        select_page(records, query, now)
    }

    async fn stats(&self, top_scopes: usize) -> Result<Stats, StoreError> {
        let (records, now) = self.records(Operation::Stats).await?;
        Ok(Stats::tally(&records, now, top_scopes))
    }

    async fn release_key(&self, key: &Key) -> Result<ReleaseKeyOutcome, StoreError> {
        let attempt = AttemptId::random();
        let mut invocation = self.scripts().admin_release.key(self.record_key(key));
        invocation.arg(&attempt.as_bytes()[..]);
        let reply: Value = self
            .connection()
            .invoke(&invocation)
            .await
            .map_err(|err| map(Operation::ReleaseKey, err))?;
        let Value::Array(parts) = reply else {
            return Err(unexpected("a release reply that is not an array"));
        };
        match parts.as_slice() {
            [kind, Value::Int(token)] if bytes(kind) == Some(b"released") => {
                Ok(ReleaseKeyOutcome::Released {
                    token: u64::try_from(*token).map_err(|_| unexpected("a negative token"))?,
                })
            }
            [kind, state] if bytes(kind) == Some(b"finished") => {
                let state = bytes(state)
                    .and_then(|s| std::str::from_utf8(s).ok())
                    .and_then(State::parse)
                    .ok_or_else(|| unexpected("an unknown state"))?;
                Ok(ReleaseKeyOutcome::Finished(state))
            }
            [kind] if bytes(kind) == Some(b"not_found") => Ok(ReleaseKeyOutcome::NotFound),
            _ => Err(unexpected("an unknown release answer")),
        }
    }

    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        let deleted: i64 = self
            .connection()
            .query(redis::cmd("DEL").arg(self.record_key(key)))
            .await
            .map_err(|err| map(Operation::Delete, err))?;
        Ok(deleted == 1)
    }

    async fn raw(&self, key: &Key) -> Result<Option<idem_core::admin::RawRecord>, StoreError> {
        let fields: Vec<Vec<u8>> = self
            .connection()
            .query(redis::cmd("HGETALL").arg(self.record_key(key)))
            .await
            .map_err(|err| map(Operation::Get, err))?;
        if fields.is_empty() {
            return Ok(None);
        }
        Ok(Some(
            fields
                .chunks(2)
                .map(|pair| {
                    let name = idem_core::raw::raw_text(&pair[0]);
                    let value = pair.get(1).map_or(&[][..], Vec::as_slice);
                    // The response (field `r`) as its length, as every store shows it.
                    let shown = if pair[0] == b"r" || pair[0].starts_with(b"step:") {
                        format!("{} bytes", value.len())
                    } else {
                        idem_core::raw::raw_text(value)
                    };
                    (name, shown)
                })
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_escape_glob_characters() {
        assert_eq!(pattern("idem:"), "idem:{*");
        assert_eq!(pattern("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\{*");
    }

    proptest::proptest! {
        #![proptest_config(idem_testkit::fuzz_config())]

        /// Any hash fields decode to a record or answer `Corrupt` naming the key.
        #[test]
        fn any_hash_fields(fields in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
                proptest::sample::select(vec![
                    b"f".to_vec(), b"s".to_vec(), b"t".to_vec(), b"a".to_vec(), b"l".to_vec(),
                    b"c".to_vec(), b"e".to_vec(), b"r".to_vec(), b"z".to_vec(), b"step:x".to_vec(),
                    b"in_progress".to_vec(), b"completed".to_vec(), b"1".to_vec(),
                    b"9007199254740993".to_vec(), b"-1".to_vec(),
                ]),
            ],
            0..24,
        )) {
            let key = Key::new("fuzz", "hash").unwrap();
            if let Err(err) = decode(key, fields) {
                let named = matches!(err, StoreError::Corrupt { key: Some(_), .. });
                proptest::prop_assert!(named, "{err:?}");
            }
        }
    }
}
