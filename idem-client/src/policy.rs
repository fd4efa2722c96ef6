//! When to try again, and how long to wait first.

use std::time::{Duration, SystemTime};

use http::HeaderMap;
use http::header::RETRY_AFTER;

/// The problem type idem-http answers a duplicate with while the first request runs.
pub const IDEM_IN_FLIGHT: &str = "tag:idem-http,2026:in-flight";

/// The problem type idem-http answers when another try took the request over while this
/// one ran: that try's answer is to be fetched by retrying.
pub const IDEM_TAKEN_OVER: &str = "tag:idem-http,2026:taken-over";

/// The longest backoff and deadline a policy takes: a day. Longer values are taken as a
/// day, never as an overflow.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// The error code Stripe-style APIs answer a 409 with while the first request of a key
/// runs (`{"error": {"code": "idempotency_key_in_use", ...}}`).
pub const STRIPE_KEY_IN_USE: &str = "idempotency_key_in_use";

/// How a logical operation is retried.
///
/// - At most `max_attempts` tries, all within `deadline` of the first (a try still
///   unanswered then is ended), each within `attempt_timeout` (its answer's head, and
///   the body of a 409 read for its type). Polls of a request whose first try still runs
///   on the server (a 409 in flight or taken over) do not count as tries; the deadline
///   bounds them.
/// - Between tries: the server's `Retry-After` (seconds or an HTTP date) when it sent
///   one, plus up to a fifth more at random so that clients told the same moment do not
///   return together; else exponential backoff with full jitter from `first_backoff` up
///   to `max_backoff`. A wait that would end past the deadline is not waited: the last
///   answer is returned.
/// - A 409 means "the first try still runs" when its JSON body says so: a problem `type`
///   that is idem-http's in-flight or taken-over type under any base (the type ends in
///   `in-flight` or `taken-over` after a `/`, `:` or `#`), one added with
///   [`RetryPolicy::in_flight_problem_type`], or an error `code` (top level or under
///   `error`) of [`STRIPE_KEY_IN_USE`] or one added with
///   [`RetryPolicy::in_flight_error_code`]. [`RetryPolicy::every_conflict_in_flight`]
///   takes every 409 of a keyed request as in flight, as the IETF draft says servers
///   answer.
///
/// ```
/// use std::time::Duration;
/// use idem_client::RetryPolicy;
///
/// let policy = RetryPolicy::default()
///     .max_attempts(8)
///     .deadline(Duration::from_secs(60));
/// assert_eq!(policy.attempts(), 8);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    first_backoff: Duration,
    max_backoff: Duration,
    deadline: Duration,
    attempt_timeout: Duration,
    in_flight_types: Vec<String>,
    in_flight_codes: Vec<String>,
    every_conflict: bool,
}

impl Default for RetryPolicy {
    /// 5 tries within 90 s (longer than idem-http's default lease of 60 s, so that a
    /// first try that crashed is taken over, and answered, within it), each within 30 s,
    /// backoff from 100 ms to 5 s; idem-http's in-flight and taken-over problems (under
    /// any base) and Stripe's `idempotency_key_in_use` are polled.
    fn default() -> Self {
        Self {
            max_attempts: 5,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            deadline: Duration::from_secs(90),
            attempt_timeout: Duration::from_secs(30),
            in_flight_types: vec![IDEM_IN_FLIGHT.to_owned(), IDEM_TAKEN_OVER.to_owned()],
            in_flight_codes: vec![STRIPE_KEY_IN_USE.to_owned()],
            every_conflict: false,
        }
    }
}

impl RetryPolicy {
    /// The most tries of one operation, the first included (at least 1).
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The backoff before the second try, doubling after each (at most `max`). Both are
    /// taken at most [`MAX_WAIT`] (a day): longer waits belong to a job queue.
    #[must_use]
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.first_backoff = first.min(MAX_WAIT);
        self.max_backoff = max.min(MAX_WAIT).max(self.first_backoff);
        self
    }

    /// How long one operation may take, every try and wait included: a try still
    /// unanswered at the deadline ends with `ClientError::DeadlineExceeded`. Taken at
    /// least 1 ms and at most [`MAX_WAIT`] (a day), so `Duration::MAX` means "a day".
    #[must_use]
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline.clamp(Duration::from_millis(1), MAX_WAIT);
        self
    }

    /// How long one try may wait for its answer's head (and a 409's body, read for its
    /// type) before it is given up and, if the policy allows, tried again: a server that
    /// stalls one connection does not take the whole deadline. Taken at least 1 ms and at
    /// most [`MAX_WAIT`]; the deadline still bounds every try. A try the policy leaves no
    /// retry after (a request sent only once, the last of `max_attempts`) is bounded by
    /// the deadline alone; one a retry budget then refuses was still cut at this timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_client::RetryPolicy;
    ///
    /// // Three tries of at most 10 s each, within 40 s.
    /// let policy = RetryPolicy::default()
    ///     .max_attempts(3)
    ///     .attempt_timeout(Duration::from_secs(10))
    ///     .deadline(Duration::from_secs(40));
    /// # let _ = policy;
    /// ```
    #[must_use]
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout.clamp(Duration::from_millis(1), MAX_WAIT);
        self
    }

    /// Another problem type (RFC 9457 `type`) that a 409 carries when the server is still
    /// running the first request: such a 409 is retried, any other 409 is an answer.
    #[must_use]
    pub fn in_flight_problem_type(mut self, problem_type: impl Into<String>) -> Self {
        self.in_flight_types.push(problem_type.into());
        self
    }

    /// Another error code (a JSON body's `code`, or `error.code`) that a 409 carries when
    /// the server is still running the first request.
    ///
    /// ```
    /// use idem_client::RetryPolicy;
    ///
    /// // An API that answers `{"error": {"code": "request_in_progress"}}`.
    /// let policy = RetryPolicy::default().in_flight_error_code("request_in_progress");
    /// # let _ = policy;
    /// ```
    #[must_use]
    pub fn in_flight_error_code(mut self, code: impl Into<String>) -> Self {
        self.in_flight_codes.push(code.into());
        self
    }

    /// Every 409 answered to a keyed request means the first try still runs, whatever
    /// its body: for servers that follow the IETF draft's "409 while in progress" and say
    /// nothing more. Do not use it for APIs that answer 409 for conflicts of their own
    /// (an order that exists): those would be polled until the deadline.
    ///
    /// ```
    /// use idem_client::RetryPolicy;
    ///
    /// let policy = RetryPolicy::default().every_conflict_in_flight();
    /// # let _ = policy;
    /// ```
    #[must_use]
    pub fn every_conflict_in_flight(mut self) -> Self {
        self.every_conflict = true;
        self
    }

    /// The most tries.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    pub(crate) fn total(&self) -> Duration {
        self.deadline
    }

    pub(crate) fn per_try(&self) -> Duration {
        self.attempt_timeout
    }

    pub(crate) fn every_conflict(&self) -> bool {
        self.every_conflict
    }

    /// Whether a 409's JSON body says the first try of its key still runs.
    pub(crate) fn says_in_flight(&self, body: &serde_json::Value) -> bool {
        fn text(value: Option<&serde_json::Value>) -> Option<&str> {
            value.and_then(serde_json::Value::as_str)
        }
        if let Some(kind) = text(body.get("type")) {
            if self.in_flight_types.iter().any(|known| known == kind) || is_idem_in_flight(kind) {
                return true;
            }
        }
        let codes = [
            text(body.get("code")),
            text(body.get("error").and_then(|e| e.get("code"))),
        ];
        codes
            .into_iter()
            .flatten()
            .any(|code| self.in_flight_codes.iter().any(|known| known == code))
    }

    /// The wait the server asked for, plus up to a fifth more at random: never sooner than
    /// asked, and spread so that clients told one moment do not all return at it.
    pub(crate) fn jittered(&self, asked: Duration) -> Duration {
        asked
            .min(MAX_WAIT)
            .saturating_add(asked.min(MAX_WAIT).mul_f64(random_fraction() / 5.0))
    }

    /// The backoff before try `attempt + 1` (`attempt` counts from 1): a random wait up to
    /// `first * 2^(attempt - 1)`, capped.
    pub(crate) fn backoff_after(&self, attempt: u32) -> Duration {
        let doubled = self
            .first_backoff
            .saturating_mul(1u32 << (attempt.saturating_sub(1)).min(20));
        let cap = doubled.min(self.max_backoff);
        cap.mul_f64(random_fraction())
    }
}

/// A random number in `0.0..=1.0`; `1.0` without randomness (wait the whole cap rather
/// than none).
fn random_fraction() -> f64 {
    let mut byte = [0u8; 2];
    match getrandom::fill(&mut byte) {
        Ok(()) => f64::from(u16::from_le_bytes(byte)) / f64::from(u16::MAX),
        Err(_) => 1.0,
    }
}

/// Whether `kind` is idem-http's in-flight or taken-over problem type under any
/// `problem_type_base`: it ends in `in-flight` or `taken-over` right after a `/`, `:` or
/// `#`.
fn is_idem_in_flight(kind: &str) -> bool {
    ["in-flight", "taken-over"].iter().any(|slug| {
        kind.strip_suffix(slug)
            .is_some_and(|base| base.ends_with(['/', ':', '#']))
    })
}

/// The server's `Retry-After`: whole seconds, or an HTTP date (then relative to `now`; a
/// date already past is no wait). `None` when absent or unreadable.
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        assert_eq!(
            retry_after(&headers("3"), now),
            Some(Duration::from_secs(3))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(7));
        assert_eq!(
            retry_after(&headers(&later), now),
            Some(Duration::from_secs(7))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(7));
        assert_eq!(retry_after(&headers(&earlier), now), Some(Duration::ZERO));
        assert_eq!(retry_after(&headers("soon"), now), None);
        assert_eq!(retry_after(&headers("-1"), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn backoff_grows_and_stays_under_its_cap() {
        let policy =
            RetryPolicy::default().backoff(Duration::from_millis(10), Duration::from_millis(40));
        for attempt in 1..40 {
            assert!(policy.backoff_after(attempt) <= Duration::from_millis(40));
        }
        assert!(policy.backoff_after(1) <= Duration::from_millis(10));
        assert_eq!(RetryPolicy::default().max_attempts(0).attempts(), 1);
    }

    #[test]
    fn in_flight_409s_are_told_by_their_body() {
        let policy = RetryPolicy::default();
        let says = |body: serde_json::Value| policy.says_in_flight(&body);
        assert!(says(serde_json::json!({"type": IDEM_IN_FLIGHT})));
        assert!(says(serde_json::json!({"type": IDEM_TAKEN_OVER})));
        // idem-http under a base of the server's own.
        assert!(says(
            serde_json::json!({"type": "https://errors.example.com/idempotency/in-flight"})
        ));
        assert!(says(serde_json::json!({"type": "urn:acme:taken-over"})));
        // Stripe-style, and a bare code.
        assert!(says(
            serde_json::json!({"error": {"code": "idempotency_key_in_use", "type": "invalid_request_error"}})
        ));
        assert!(says(serde_json::json!({"code": "idempotency_key_in_use"})));
        // A conflict of the API's own is an answer.
        assert!(!says(
            serde_json::json!({"type": "https://api.example.com/order-exists"})
        ));
        assert!(!says(serde_json::json!({"type": "not-in-flight"})));
        assert!(!says(
            serde_json::json!({"error": {"code": "resource_exists"}})
        ));
        assert!(!says(serde_json::json!("in-flight")));
        let custom = RetryPolicy::default()
            .in_flight_problem_type("https://api.example.com/busy")
            .in_flight_error_code("request_in_progress");
        assert!(
            custom.says_in_flight(&serde_json::json!({"type": "https://api.example.com/busy"}))
        );
        assert!(
            custom.says_in_flight(&serde_json::json!({"error": {"code": "request_in_progress"}}))
        );
    }

    #[test]
    fn retry_after_is_jittered_upward_only() {
        let policy = RetryPolicy::default();
        let asked = Duration::from_secs(10);
        let waits: Vec<_> = (0..64).map(|_| policy.jittered(asked)).collect();
        assert!(
            waits
                .iter()
                .all(|wait| (asked..=asked * 6 / 5).contains(wait)),
            "{waits:?}"
        );
        assert!(
            waits.iter().any(|wait| *wait != waits[0]),
            "spread: {waits:?}"
        );
        assert_eq!(policy.jittered(Duration::ZERO), Duration::ZERO);
        assert!(policy.jittered(Duration::MAX) <= MAX_WAIT * 6 / 5);
        let clamped = RetryPolicy::default().attempt_timeout(Duration::ZERO);
        assert_eq!(clamped.per_try(), Duration::from_millis(1));
    }

    #[test]
    fn the_longest_durations_are_a_day_never_an_overflow() {
        let policy = RetryPolicy::default()
            .backoff(Duration::MAX, Duration::MAX)
            .deadline(Duration::MAX);
        assert_eq!(policy.total(), MAX_WAIT);
        for attempt in [1, 2, 30, u32::MAX] {
            assert!(policy.backoff_after(attempt) <= MAX_WAIT);
        }
        let policy = RetryPolicy::default().backoff(Duration::from_secs(1), Duration::ZERO);
        assert!(policy.backoff_after(1) <= Duration::from_secs(1));
    }
}
