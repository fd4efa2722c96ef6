//! Store calls bounded in time and tried again while they fail with a retryable error.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use super::{observe, policy};
use crate::StoreError;
use crate::store::Operation;

/// How often the driver retries a store call that failed with a retryable error. Every
/// store operation is safe to repeat (same attempt id, same lease), so a retry resolves an
/// ambiguous failure instead of leaving the key held.
const STORE_ATTEMPTS: u32 = 3;
const STORE_BACKOFF: Duration = Duration::from_millis(25);

/// One store call, failed as unavailable (retryable) when it takes longer than `timeout`.
/// The call is polled once before its timer is armed: a call that answers at once costs
/// no clock read and no timer.
async fn bounded<O>(
    operation: Operation,
    timeout: Duration,
    call: impl Future<Output = Result<O, StoreError>>,
) -> Result<O, StoreError> {
    let mut call = std::pin::pin!(call);
    match poll_once(call.as_mut()).await {
        Poll::Ready(result) => result,
        Poll::Pending => with_timeout(operation, timeout, call).await,
    }
}

/// Polls `call` once: ready at once, so the closure runs exactly once.
async fn poll_once<F: Future>(mut call: Pin<&mut F>) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await
}

/// The rest of a call that did not answer in its first poll, bounded by `timeout`.
async fn with_timeout<O>(
    operation: Operation,
    timeout: Duration,
    call: Pin<&mut impl Future<Output = Result<O, StoreError>>>,
) -> Result<O, StoreError> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| Err(no_answer(operation, timeout)))
}

/// A try that got no answer within `timeout`: unavailable, so retryable.
fn no_answer(operation: Operation, timeout: Duration) -> StoreError {
    StoreError::Unavailable {
        operation,
        source: Box::new(crate::connect::NoAnswer(timeout)),
    }
}

/// The most tries of one write within a lease, whatever the lease's length.
const MAX_WRITE_ATTEMPTS: u32 = 64;
const MAX_WRITE_BACKOFF: Duration = Duration::from_millis(500);

/// Runs a store call, trying again with backoff while it fails with a retryable error:
/// at least [`STORE_ATTEMPTS`] tries, and for a write that follows the work (made before
/// `deadline`, the end of its lease on this process's clock: a checkpoint, the result,
/// the failure) as long as the lease has time left, at most [`MAX_WRITE_ATTEMPTS`].
/// Giving such a write up early would leave the key held until the lease ends and then
/// run the work again. Every store operation is safe to repeat (the same attempt id, the
/// same lease). Each try is bounded by `timeout`, so the whole call ends within
/// `max(deadline, 3 tries) + timeout` and the backoff between tries.
pub(crate) async fn retry_store<O, Fut>(
    operation: Operation,
    timeout: Duration,
    deadline: Option<Instant>,
    jitter: &policy::Jitter,
    mut call: impl FnMut() -> Fut,
) -> Result<O, StoreError>
where
    Fut: Future<Output = Result<O, StoreError>>,
{
    // The first try is polled once before anything else: a call that answers at once
    // (the memory store, a cached answer) then costs no clock read and no timer, and the
    // state of the timeout and the retries (a timer is large: cache-line aligned) is
    // made, in a box of its own, only for a call that waits or fails. The first poll only
    // runs until the call's first wait, so the bound on the wait itself is unchanged.
    let mut first = std::pin::pin!(Some(call()));
    let answered = match first.as_mut().as_pin_mut() {
        Some(call) => poll_once(call).await,
        None => Poll::Pending, // made just above: never
    };
    let first = match answered {
        Poll::Ready(Ok(answer)) => return Ok(answer),
        Poll::Ready(Err(err)) => {
            first.set(None);
            Err(err)
        }
        Poll::Pending => Ok(first),
    };
    Box::pin(retried(operation, timeout, deadline, jitter, call, first)).await
}

/// [`retry_store`] after a first try that waited (`first`, still pending) or failed.
async fn retried<O, Fut>(
    operation: Operation,
    timeout: Duration,
    deadline: Option<Instant>,
    jitter: &policy::Jitter,
    mut call: impl FnMut() -> Fut,
    first: Result<Pin<&mut Option<Fut>>, StoreError>,
) -> Result<O, StoreError>
where
    Fut: Future<Output = Result<O, StoreError>>,
{
    let mut result = match first {
        Ok(mut pending) => {
            let answer = match pending.as_mut().as_pin_mut() {
                Some(call) => with_timeout(operation, timeout, call).await,
                None => Err(no_answer(operation, timeout)), // never: it was pending
            };
            // A try that ran out of time is dropped before the next is sent, as every
            // later one is: it may hold what the next needs (a pooled connection, a lock).
            pending.set(None);
            answer
        }
        Err(err) => Err(err),
    };
    let mut tries = 1;
    let mut backoff = STORE_BACKOFF;
    loop {
        if result.is_err() {
            observe::store_error(operation);
        }
        // The clock is read only for a failed try: a call that succeeds costs none.
        let lease_left = || deadline.is_some_and(|deadline| Instant::now() < deadline);
        match result {
            Err(err)
                if err.is_retryable()
                    && (tries < STORE_ATTEMPTS || tries < MAX_WRITE_ATTEMPTS && lease_left()) =>
            {
                tracing::debug!(error = %err, tries, "retrying a store call");
                tokio::time::sleep(jitter.jittered(backoff)).await;
                backoff = (backoff * 2).min(MAX_WRITE_BACKOFF);
                tries += 1;
            }
            result => return result,
        }
        result = bounded(operation, timeout, call()).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Runs `retry_store` over a call that always fails with `error`, and returns when each
    /// try was sent (on tokio's paused clock).
    async fn tries(deadline: Option<Duration>, error: fn() -> StoreError) -> Vec<Duration> {
        let start = Instant::now();
        let sent = Mutex::new(Vec::new());
        let result: Result<(), _> = retry_store(
            Operation::Complete,
            Duration::from_secs(1),
            deadline.map(|left| start + left),
            &policy::Jitter::seeded(7),
            || {
                sent.lock().unwrap().push(start.elapsed());
                std::future::ready(Err(error()))
            },
        )
        .await;
        assert!(result.is_err(), "every try failed: {result:?}");
        sent.into_inner().unwrap()
    }

    fn refused() -> StoreError {
        StoreError::Unavailable {
            operation: Operation::Complete,
            source: "connection refused".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_with_no_deadline_is_tried_three_times_with_a_doubling_backoff() {
        let sent = tries(None, refused).await;
        assert_eq!(sent.len(), 3, "{sent:?}");
        // Each pause is the backoff (25 ms, then 50) scaled by a factor in [0.5, 1].
        let first = sent[1] - sent[0];
        let second = sent[2] - sent[1];
        assert!(
            first >= STORE_BACKOFF / 2 && first <= STORE_BACKOFF,
            "{sent:?}"
        );
        assert!(
            second >= STORE_BACKOFF && second <= STORE_BACKOFF * 2,
            "{sent:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_with_its_lease_left_is_tried_at_most_64_times_with_a_capped_backoff() {
        let sent = tries(Some(Duration::from_secs(24 * 3600)), refused).await;
        assert_eq!(sent.len(), MAX_WRITE_ATTEMPTS as usize, "{sent:?}");
        let longest = sent.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert!(
            longest >= MAX_WRITE_BACKOFF / 2 && longest <= MAX_WRITE_BACKOFF,
            "{longest:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_stops_at_its_deadline_exactly() {
        // The seeded jitter makes the tries' times the same from run to run: a deadline
        // at the sixth try's time allows that try, and no seventh.
        let unbounded = tries(Some(Duration::from_secs(3600)), refused).await;
        let sent = tries(Some(unbounded[5]), refused).await;
        assert_eq!(sent, unbounded[..6]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_past_its_deadline_gets_the_three_quick_tries_only() {
        let sent = tries(Some(Duration::ZERO), refused).await;
        assert_eq!(sent.len(), STORE_ATTEMPTS as usize, "{sent:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_that_is_not_retryable_is_tried_once() {
        let sent = tries(Some(Duration::from_secs(3600)), || StoreError::TooLarge {
            part: crate::record::ValuePart::Result,
            size: 10,
            limit: 5,
        })
        .await;
        assert_eq!(sent, [Duration::ZERO]);
    }
}
