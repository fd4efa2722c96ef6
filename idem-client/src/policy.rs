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

/// How a logical operation is retried.
///
/// - At most `max_attempts` tries, all within `deadline` of the first (a try still
///   unanswered then is ended). Polls of a request whose first try still runs on the
///   server (a 409 in flight or taken over) do not count as tries; the deadline bounds
///   them.
/// - Between tries: the server's `Retry-After` (seconds or an HTTP date) when it sent
///   one, else exponential backoff with full jitter from `first_backoff` up to
///   `max_backoff`. A wait that would end past the deadline is not waited: the last
///   answer is returned.
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
    in_flight_types: Vec<String>,
}

impl Default for RetryPolicy {
    /// 5 tries within 90 s (longer than idem-http's default lease of 60 s, so that a
    /// first try that crashed is taken over, and answered, within it), backoff from 100 ms
    /// to 5 s, idem-http's in-flight and taken-over problems.
    fn default() -> Self {
        Self {
            max_attempts: 5,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            deadline: Duration::from_secs(90),
            in_flight_types: vec![IDEM_IN_FLIGHT.to_owned(), IDEM_TAKEN_OVER.to_owned()],
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
    /// unanswered at the deadline ends with `ClientError::DeadlineExceeded`. Taken at most
    /// [`MAX_WAIT`] (a day), so `Duration::MAX` means "a day".
    #[must_use]
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline.min(MAX_WAIT);
        self
    }

    /// Another problem type (RFC 9457 `type`) that a 409 carries when the server is still
    /// running the first request: such a 409 is retried, any other 409 is an answer.
    #[must_use]
    pub fn in_flight_problem_type(mut self, problem_type: impl Into<String>) -> Self {
        self.in_flight_types.push(problem_type.into());
        self
    }

    /// The most tries.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    pub(crate) fn total(&self) -> Duration {
        self.deadline
    }

    pub(crate) fn is_in_flight_type(&self, problem_type: &str) -> bool {
        self.in_flight_types
            .iter()
            .any(|known| known == problem_type)
    }

    /// The backoff before try `attempt + 1` (`attempt` counts from 1): a random wait up to
    /// `first * 2^(attempt - 1)`, capped.
    pub(crate) fn backoff_after(&self, attempt: u32) -> Duration {
        let doubled = self
            .first_backoff
            .saturating_mul(1u32 << (attempt.saturating_sub(1)).min(20));
        let cap = doubled.min(self.max_backoff);
        let mut byte = [0u8; 2];
        let fraction = match getrandom::fill(&mut byte) {
            Ok(()) => f64::from(u16::from_le_bytes(byte)) / f64::from(u16::MAX),
            // No randomness: wait the whole cap rather than none.
            Err(_) => 1.0,
        };
        cap.mul_f64(fraction)
    }
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
