//! The operator's side of the Redis store: `SCAN` over the store's prefix (on every
//! primary of a Cluster), each batch of keys read in one pipeline, and a Lua function (or
//! script) for the release.
//!
//! Cost: listing and counting read every record of the prefix, without its response and
//! steps (one pipelined `HMGET` of seven small fields per record, a round trip per
//! `SCAN` batch of about a thousand keys), holding no more than a batch, the page being
//! chosen and a count per scope. A listing then reads its page's records whole. The time
//! grows with the number of records (BENCHMARKS.md has it at ten million); for a
//! dashboard, count with the metrics instead.

use async_trait::async_trait;
use idem_core::{
    Admin, Key, Record, State, StoreError, Timestamp, admin::ListQuery, admin::Page,
    admin::ReleaseKeyOutcome, admin::Stats, raw::PageSelector, raw::Tally, raw::storage_name,
    record::AttemptId, store::Operation,
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

/// The fields a listing chooses by and a count reads: all but the response and the steps.
const SUMMARY: [&str; 7] = ["f", "s", "t", "a", "l", "c", "e"];

/// The keys of the store's prefix on one node, a `SCAN` batch at a time (`route` a single
/// node of a Cluster, or `None` on a standalone server).
struct NodeScan<'a> {
    connection: &'a Connection,
    pattern: String,
    route: Option<SingleNodeRoutingInfo>,
    /// `None` once the scan has come back to cursor 0.
    cursor: Option<u64>,
}

impl<'a> NodeScan<'a> {
    fn new(connection: &'a Connection, prefix: &str, route: Option<SingleNodeRoutingInfo>) -> Self {
        Self {
            connection,
            pattern: pattern(prefix),
            route,
            cursor: Some(0),
        }
    }

    /// The next batch of key names (possibly empty), or `None` when the scan is over.
    async fn next(&mut self, operation: Operation) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        let Some(cursor) = self.cursor else {
            return Ok(None);
        };
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(&self.pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let reply: Value = match (self.connection, &self.route) {
            (Connection::Cluster(cluster), Some(route)) => cluster
                .clone()
                .route_command(cmd, RoutingInfo::SingleNode(route.clone()))
                .await
                .map_err(|err| map(operation, err))?,
            _ => self
                .connection
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
        let next: u64 = bytes(next)
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| unexpected("a SCAN cursor that is not a number"))?;
        self.cursor = (next != 0).then_some(next);
        Ok(Some(
            found.iter().filter_map(bytes).map(<[u8]>::to_vec).collect(),
        ))
    }

    /// Runs `pipeline` on this scan's node, one answer per command, errors included as
    /// [`Value::ServerError`].
    async fn pipeline(
        &self,
        pipeline: &mut redis::Pipeline,
        count: usize,
        operation: Operation,
    ) -> Result<Vec<Value>, StoreError> {
        pipeline.ignore_errors();
        let answers: Vec<Value> = match (self.connection, &self.route) {
            (Connection::Cluster(cluster), Some(route)) => cluster
                .clone()
                .route_pipeline(pipeline.clone(), 0, count, route.clone())
                .await
                .map_err(|err| map(operation, err))?,
            _ => self
                .connection
                .query_pipeline(pipeline)
                .await
                .map_err(|err| map(operation, err))?,
        };
        if answers.len() != count {
            return Err(unexpected("a pipeline answered another number of replies"));
        }
        Ok(answers)
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
    /// The server's clock.
    async fn server_time(&self, operation: Operation) -> Result<Timestamp, StoreError> {
        let time: Vec<String> = self
            .connection()
            .query(&redis::cmd("TIME"))
            .await
            .map_err(|err| map(operation, err))?;
        match time.as_slice() {
            [seconds, micros] => {
                let seconds: u64 = seconds.parse().map_err(|_| unexpected("a bad TIME"))?;
                let micros: u64 = micros.parse().map_err(|_| unexpected("a bad TIME"))?;
                Ok(Timestamp::from_unix_millis(seconds * 1000 + micros / 1000))
            }
            _ => Err(unexpected("a TIME reply of another shape")),
        }
    }

    /// Every node to scan: the primaries of a Cluster, or the one server.
    async fn nodes(
        &self,
        operation: Operation,
    ) -> Result<Vec<Option<SingleNodeRoutingInfo>>, StoreError> {
        Ok(match self.connection() {
            Connection::Standalone(_) => vec![None],
            Connection::Cluster(_) => primaries(self.connection(), operation)
                .await?
                .into_iter()
                .map(Some)
                .collect(),
        })
    }

    /// Calls `each` with every record under the prefix, read without its response and
    /// steps, a `SCAN` batch at a time. Answers how many keys of this store's layout could
    /// not be read as a record (another type of key, or fields idem did not write): they
    /// are skipped, so that one odd key does not hide the rest.
    async fn each_summary(
        &self,
        operation: Operation,
        mut each: impl FnMut(Record),
    ) -> Result<u64, StoreError> {
        let mut unreadable = 0;
        for node in self.nodes(operation).await? {
            let mut scan = NodeScan::new(self.connection(), self.prefix(), node);
            while let Some(names) = scan.next(operation).await? {
                let keys: Vec<(Key, &[u8])> = names
                    .iter()
                    .filter_map(|name| Some((self.key_of(name)?, name.as_slice())))
                    .collect();
                if keys.is_empty() {
                    continue;
                }
                let mut pipeline = redis::pipe();
                for (_, name) in &keys {
                    pipeline.cmd("HMGET").arg(*name).arg(&SUMMARY[..]);
                }
                // A pipeline that fails as a whole (a Cluster moving slots answers MOVED
                // for some of its keys), or an answer that is an error other than a key of
                // another type, is asked again key by key, each routed by its own slot.
                let answers = match scan.pipeline(&mut pipeline, keys.len(), operation).await {
                    Ok(answers) => answers,
                    Err(err) => {
                        tracing::warn!(error = %err, "a pipeline failed; reading its keys one by one");
                        Vec::new()
                    }
                };
                for (i, (key, name)) in keys.into_iter().enumerate() {
                    let answer = match answers.get(i) {
                        Some(Value::ServerError(err)) if err.code() != "WRONGTYPE" => {
                            self.summary_alone(name, operation).await?
                        }
                        Some(answer) => Some(answer.clone()),
                        None => self.summary_alone(name, operation).await?,
                    };
                    let read = match answer {
                        Some(answer) => summary(key, answer),
                        None => Err(StoreError::Corrupt {
                            what: "a key of the store's layout that is not a record's hash",
                            key: Some(key.short_hash()),
                            source: None,
                        }),
                    };
                    match read {
                        Ok(Some(record)) => each(record),
                        Ok(None) => {} // deleted since the scan
                        Err(err) => {
                            unreadable += 1;
                            tracing::warn!(error = %err, "skipped a key that is not a readable record");
                        }
                    }
                }
            }
        }
        Ok(unreadable)
    }

    /// One key's summary fields on their own, routed by the key; `None` for a key of
    /// another type (unreadable as a record). Any other error fails the call.
    async fn summary_alone(
        &self,
        name: &[u8],
        operation: Operation,
    ) -> Result<Option<Value>, StoreError> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(name).arg(&SUMMARY[..]);
        match self.connection().query::<Value>(&cmd).await {
            Ok(value) => Ok(Some(value)),
            Err(err) if err.code() == Some("WRONGTYPE") => Ok(None),
            Err(err) => Err(map(operation, err)),
        }
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

/// What `admin_release.lua` answered: `{'released', token}`, `{'finished', state}` or
/// `{'not_found'}`; anything else is an unexpected reply, never a guess.
fn release_answer(reply: Value) -> Result<ReleaseKeyOutcome, StoreError> {
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

/// A record from the answer to `HMGET` of [`SUMMARY`]: no response, no steps. `None`
/// when every field is missing (the key was deleted since the scan).
fn summary(key: Key, answer: Value) -> Result<Option<Record>, StoreError> {
    let values = match answer {
        Value::Array(values) => values,
        Value::ServerError(err) => {
            return Err(StoreError::Corrupt {
                what: "a key of the store's layout that is not a record's hash",
                key: Some(key.short_hash()),
                source: Some(redis::RedisError::from(err).into()),
            });
        }
        _ => return Err(unexpected("an HMGET reply that is not an array").for_key(&key)),
    };
    if values.len() != SUMMARY.len() {
        return Err(unexpected("an HMGET reply of another length").for_key(&key));
    }
    if values.iter().all(|value| matches!(value, Value::Nil)) {
        return Ok(None);
    }
    let mut fields = Vec::with_capacity(2 * SUMMARY.len());
    for (name, value) in SUMMARY.iter().zip(&values) {
        if let Some(value) = bytes(value) {
            fields.push(name.as_bytes().to_vec());
            fields.push(value.to_vec());
        }
    }
    decode(key, fields).map(Some)
}

#[async_trait]
impl Admin for RedisStore {
    async fn list(&self, query: &ListQuery) -> Result<Page, StoreError> {
        let now = self.server_time(Operation::List).await?;
        let mut selector = PageSelector::new(query, now)?;
        self.each_summary(Operation::List, |record| selector.offer(record))
            .await?;
        // The page's records whole (responses and steps); the cursor stays the one the
        // selection found, so a record that changed or went since the scan is left out of
        // this page without ending the listing.
        let plan = selector.plan();
        let mut whole = Vec::with_capacity(plan.keys().len());
        for key in plan.keys() {
            let fields: Vec<Vec<u8>> = self
                .connection()
                .query(redis::cmd("HGETALL").arg(self.record_key(key)))
                .await
                .map_err(|err| map(Operation::List, err))?;
            if !fields.is_empty() {
                match decode(key.clone(), fields) {
                    Ok(record) => whole.push(record),
                    Err(err) => {
                        tracing::warn!(error = %err, "skipped a key that is not a readable record")
                    }
                }
            }
        }
        Ok(plan.page(whole))
    }

    async fn stats(&self, top_scopes: usize) -> Result<Stats, StoreError> {
        let now = self.server_time(Operation::Stats).await?;
        let mut tally = Tally::new(now);
        let unreadable = self
            .each_summary(Operation::Stats, |record| tally.add(&record))
            .await?;
        let mut stats = tally.finish(top_scopes);
        stats.unreadable = unreadable;
        Ok(stats)
    }

    async fn release_key(&self, key: &Key) -> Result<ReleaseKeyOutcome, StoreError> {
        let attempt = AttemptId::random();
        let scripts = self.scripts();
        let mut call = scripts.call(&scripts.admin_release, &self.record_key(key));
        call.arg(&attempt.as_bytes()[..]);
        let reply: Value = scripts
            .run(self.connection(), &scripts.admin_release, &call)
            .await
            .map_err(|err| map(Operation::ReleaseKey, err).for_key(key))?;
        release_answer(reply)
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
    fn a_release_answer_is_read_by_its_kind_and_shape() {
        let text = |t: &str| Value::BulkString(t.as_bytes().to_vec());
        let answer = |parts: Vec<Value>| release_answer(Value::Array(parts));
        assert!(matches!(
            answer(vec![text("released"), Value::Int(7)]),
            Ok(ReleaseKeyOutcome::Released { token: 7 })
        ));
        assert!(matches!(
            answer(vec![text("finished"), text("completed")]),
            Ok(ReleaseKeyOutcome::Finished(State::Completed))
        ));
        assert!(matches!(
            answer(vec![text("not_found")]),
            Ok(ReleaseKeyOutcome::NotFound)
        ));
        // The right shape under another kind is not taken for that kind.
        for wrong in [
            vec![text("finished"), Value::Int(7)],
            vec![text("released"), text("completed")],
            vec![text("released")],
            vec![text("released"), Value::Int(-1)],
            vec![text("finished"), text("unknown")],
        ] {
            assert!(
                matches!(answer(wrong.clone()), Err(StoreError::Corrupt { .. })),
                "{wrong:?}"
            );
        }
        assert!(release_answer(Value::Int(1)).is_err());
    }

    #[test]
    fn a_scan_reads_bulk_and_simple_strings() {
        // Servers answer SCAN with bulk strings; a proxy in front may answer a simple one.
        assert_eq!(bytes(&Value::BulkString(b"17".to_vec())), Some(&b"17"[..]));
        assert_eq!(bytes(&Value::SimpleString("17".into())), Some(&b"17"[..]));
        assert_eq!(bytes(&Value::Int(17)), None);
    }

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
