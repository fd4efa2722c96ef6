//! The one validated decoder every backend shares: a record rebuilt field by field.

use crate::{Fingerprint, Key, Record, State, StoreError, Timestamp, record::AttemptId};

use super::Steps;

impl Record {
    /// Starts rebuilding a record of `key` from the fields a store read back.
    pub fn parts(key: Key) -> RecordParts {
        RecordParts {
            key,
            fingerprint: None,
            state: None,
            token: None,
            attempt: None,
            lease_until: None,
            created_at: None,
            expires_at: None,
            response: None,
            steps: Steps::new(),
            error: None,
        }
    }
}

/// Rebuilds a [`Record`] from the raw fields a store read back, checking each one: the one
/// validated decoder every backend shares. Start it with [`Record::parts`].
///
/// Numbers are accepted as any integer type and refused when negative; a missing or
/// malformed field makes [`RecordParts::build`] answer [`StoreError::Corrupt`] naming it.
///
/// ```
/// use idem_core::{record::AttemptId, Fingerprint, Key, Record, State, StoreError};
///
/// let record = Record::parts(Key::new("shop/checkout", "order-7")?)
///     .fingerprint(Fingerprint::of_bytes("req").as_bytes())
///     .state("completed")
///     .token(3_i64)
///     .attempt(AttemptId::random().as_bytes())
///     .lease_until_millis(2_000_i64)
///     .created_at_millis(1_000_i64)
///     .expires_at_millis(90_000_i64)
///     .response(Some(b"ok".to_vec()))
///     .step("debit", b"1".to_vec())
///     .build()?;
/// assert_eq!((record.state, record.token), (State::Completed, 3));
///
/// let corrupt = Record::parts(Key::new("s", "k")?).fingerprint(b"short").build();
/// assert!(matches!(corrupt, Err(StoreError::Corrupt { what: "a fingerprint that is not 32 bytes", .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[must_use = "call build() to get the record"]
pub struct RecordParts {
    key: Key,
    fingerprint: Option<Fingerprint>,
    state: Option<State>,
    token: Option<u64>,
    attempt: Option<AttemptId>,
    lease_until: Option<Timestamp>,
    created_at: Option<Timestamp>,
    expires_at: Option<Timestamp>,
    response: Option<Vec<u8>>,
    steps: Steps,
    error: Option<&'static str>,
}

impl RecordParts {
    fn check<T>(&mut self, value: Option<T>, what: &'static str) -> Option<T> {
        if value.is_none() && self.error.is_none() {
            self.error = Some(what);
        }
        value
    }

    /// The fingerprint's 32 bytes.
    pub fn fingerprint(mut self, bytes: &[u8]) -> Self {
        let value = <[u8; 32]>::try_from(bytes)
            .ok()
            .map(Fingerprint::from_bytes);
        self.fingerprint = self.check(value, "a fingerprint that is not 32 bytes");
        self
    }

    /// The state's name, as [`State::as_str`] writes it.
    pub fn state(mut self, name: impl AsRef<[u8]>) -> Self {
        let value = std::str::from_utf8(name.as_ref())
            .ok()
            .and_then(State::parse);
        self.state = self.check(value, "an unknown state");
        self
    }

    /// The fencing token; at least 1 and at most [`MAX_TOKEN`](crate::raw::MAX_TOKEN).
    pub fn token(mut self, token: impl TryInto<u64>) -> Self {
        let value = token
            .try_into()
            .ok()
            .filter(|token| (1..=crate::raw::MAX_TOKEN).contains(token));
        self.token = self.check(value, "a token outside 1 to 2^53 - 1");
        self
    }

    /// The attempt id's 16 bytes.
    pub fn attempt(mut self, bytes: &[u8]) -> Self {
        let value = <[u8; 16]>::try_from(bytes).ok().map(AttemptId::from_bytes);
        self.attempt = self.check(value, "an attempt id that is not 16 bytes");
        self
    }

    fn millis(&mut self, millis: impl TryInto<u64>, what: &'static str) -> Option<Timestamp> {
        let value = millis.try_into().ok().map(Timestamp::from_unix_millis);
        self.check(value, what)
    }

    /// The lease end, in milliseconds since the Unix epoch.
    pub fn lease_until_millis(mut self, millis: impl TryInto<u64>) -> Self {
        self.lease_until = self.millis(millis, "a lease end before 1970");
        self
    }

    /// The creation time, in milliseconds since the Unix epoch.
    pub fn created_at_millis(mut self, millis: impl TryInto<u64>) -> Self {
        self.created_at = self.millis(millis, "a creation time before 1970");
        self
    }

    /// The expiry, in milliseconds since the Unix epoch.
    pub fn expires_at_millis(mut self, millis: impl TryInto<u64>) -> Self {
        self.expires_at = self.millis(millis, "an expiry before 1970");
        self
    }

    /// The stored response, if any.
    pub fn response(mut self, response: Option<Vec<u8>>) -> Self {
        self.response = response;
        self
    }

    /// One checkpoint; its name must be UTF-8.
    pub fn step(mut self, name: impl Into<Vec<u8>>, value: Vec<u8>) -> Self {
        match String::from_utf8(name.into()) {
            Ok(name) => {
                self.steps.insert(name, value);
            }
            Err(_) => {
                self.check(None::<()>, "a step name that is not UTF-8");
            }
        }
        self
    }

    /// The record, or [`StoreError::Corrupt`] naming the first field that was missing or
    /// malformed.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`].
    pub fn build(self) -> Result<Record, StoreError> {
        let key = self.key;
        // The key's hash only on an error: a decode that succeeds never needs it.
        let corrupt = |what| StoreError::Corrupt {
            what,
            key: Some(key.short_hash()),
            source: None,
        };
        if let Some(what) = self.error {
            return Err(corrupt(what));
        }
        let fingerprint = self
            .fingerprint
            .ok_or_else(|| corrupt("a missing fingerprint"))?;
        let state = self.state.ok_or_else(|| corrupt("a missing state"))?;
        let token = self.token.ok_or_else(|| corrupt("a missing token"))?;
        let attempt = self
            .attempt
            .ok_or_else(|| corrupt("a missing attempt id"))?;
        let lease_until = self
            .lease_until
            .ok_or_else(|| corrupt("a missing lease end"))?;
        let created_at = self
            .created_at
            .ok_or_else(|| corrupt("a missing creation time"))?;
        let expires_at = self.expires_at.ok_or_else(|| corrupt("a missing expiry"))?;
        Ok(Record {
            key,
            fingerprint,
            state,
            token,
            attempt,
            lease_until,
            created_at,
            expires_at,
            response: self.response,
            steps: self.steps,
        })
    }
}
