//! How records, times and keys look on an operator's screen and in JSON.
//!
//! Keys are secrets of a kind (a payment's key replays its result), so a listing shows the
//! short hash that logs show; the full key appears only where the operator typed it
//! (`inspect`, `release`, `delete`) or asked for it (`list --show-keys`). Fingerprints are
//! never shown whole.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use idem_core::{Key, Record, State, Timestamp};
use serde::Serialize;

/// `at` as an RFC 3339 UTC time, to the second.
pub(crate) fn time(at: Timestamp) -> String {
    let system = UNIX_EPOCH + Duration::from_millis(at.as_unix_millis());
    if system > SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799) {
        // Past year 9999 (retention "forever"): humantime cannot print it.
        return "never".to_owned();
    }
    humantime::format_rfc3339_seconds(system).to_string()
}

/// A duration to the second (to the millisecond under one second), as people write it.
pub(crate) fn duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// `at` relative to `now`: "in 20s" or "5m 3s ago".
pub(crate) fn relative(at: Timestamp, now: Timestamp) -> String {
    if at >= now {
        format!("in {}", duration(at.saturating_duration_since(now)))
    } else {
        format!("{} ago", duration(now.saturating_duration_since(at)))
    }
}

/// The key as a listing shows it.
pub(crate) fn key(key: &Key, in_full: bool) -> String {
    if in_full {
        key.key().to_owned()
    } else {
        format!("#{}", key.short_hash())
    }
}

/// Where a record's lease stands, in a few words.
pub(crate) fn lease(record: &Record, now: Timestamp) -> String {
    match record.state {
        State::InProgress if record.lease_is_live(now) => {
            format!("live, ends {}", relative(record.lease_until, now))
        }
        State::InProgress => format!("ended {}", relative(record.lease_until, now)),
        _ => "-".to_owned(),
    }
}

/// The first bytes of a fingerprint: enough to tell two apart, not enough to be one.
pub(crate) fn fingerprint_prefix(record: &Record) -> String {
    let bytes = record.fingerprint.as_bytes();
    format!("{}…", hex(&bytes[..4]))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A record in `--json` output.
#[derive(Serialize)]
pub(crate) struct RecordJson {
    scope: String,
    /// The full key only when shown in full; `key_hash` always.
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    key_hash: String,
    state: &'static str,
    /// Expired with no live lease: what a purge deletes, and what a claim treats as new.
    absent: bool,
    token: u64,
    attempt: String,
    lease_until: String,
    lease_live: bool,
    created_at: String,
    expires_at: String,
    steps: Vec<StepJson>,
    response_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_base64: Option<String>,
}

#[derive(Serialize)]
struct StepJson {
    name: String,
    bytes: usize,
}

impl RecordJson {
    pub(crate) fn new(
        record: &Record,
        response_len: Option<usize>,
        key_in_full: bool,
        now: Timestamp,
    ) -> Self {
        Self {
            scope: record.key.scope().to_owned(),
            key: key_in_full.then(|| record.key.key().to_owned()),
            key_hash: record.key.short_hash().to_string(),
            state: record.state.as_str(),
            absent: record.is_absent(now),
            token: record.token,
            attempt: hex(record.attempt.as_bytes()),
            lease_until: time(record.lease_until),
            lease_live: record.lease_is_live(now),
            created_at: time(record.created_at),
            expires_at: time(record.expires_at),
            steps: record
                .steps
                .iter()
                .map(|(name, value)| StepJson {
                    name: name.clone(),
                    bytes: value.len(),
                })
                .collect(),
            response_bytes: response_len,
            response_base64: record.response.as_ref().map(|r| BASE64.encode(r)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_plainly() {
        assert_eq!(time(Timestamp::from_unix_millis(0)), "1970-01-01T00:00:00Z");
        assert_eq!(time(Timestamp::from_unix_millis(u64::MAX / 2)), "never");
        assert_eq!(duration(Duration::from_millis(250)), "250ms");
        assert_eq!(duration(Duration::from_millis(302_400)), "5m 2s");
        let now = Timestamp::from_unix_millis(100_000);
        assert_eq!(
            relative(Timestamp::from_unix_millis(120_000), now),
            "in 20s"
        );
        assert_eq!(relative(Timestamp::from_unix_millis(40_000), now), "1m ago");
    }

    #[test]
    fn listings_hide_keys_unless_asked() {
        let key = Key::new("acct_42/charge", "order-7781").unwrap();
        assert_eq!(self::key(&key, true), "order-7781");
        let hidden = self::key(&key, false);
        assert!(!hidden.contains("order"), "{hidden}");
        assert_eq!(hidden, format!("#{}", key.short_hash()));
    }
}
