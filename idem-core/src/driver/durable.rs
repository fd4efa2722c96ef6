//! Writes after the work, made so that they survive the caller going away.
//!
//! Once the work returned, its effect happened: the result (or failure, or checkpoint)
//! must reach the store even if the caller drops `execute` (a client timeout, an axum
//! handler whose client disconnected). Each such write is polled in place first, and the
//! first time it would wait it moves to a task of its own, which the caller awaits;
//! dropping the caller leaves the task running to its end. A store that answers at once
//! (the memory store) costs no task and no wake-up.

use std::future::{Future, poll_fn};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use super::error::Error;
use super::policy::Jitter;
use super::wire::Marker;
use super::{Context, interruption_error, retry_store};
use crate::record::ValuePart;
use crate::{
    Compensation, Store, StoreError, key::StepName, record::Lease, store::Operation,
    store::WriteOutcome,
};

/// A fenced write of the driver's.
pub(crate) enum Write {
    /// Shared, so that a caller can keep the bytes without copying them.
    Complete(Arc<Vec<u8>>),
    Fail(Vec<u8>),
    Checkpoint(StepName, Vec<u8>),
    Release,
}

impl Write {
    fn operation(&self) -> Operation {
        match self {
            Write::Complete(_) => Operation::Complete,
            Write::Fail(_) => Operation::Fail,
            Write::Checkpoint(..) => Operation::Checkpoint,
            Write::Release => Operation::Release,
        }
    }
}

/// Runs `write` under `lease` with the driver's store retries (until `deadline`, the
/// lease's end on this process's clock, when given) in a task of its own, and answers
/// what it answered. Dropping the returned future does not stop the write.
pub(crate) async fn write(
    store: Arc<dyn Store>,
    lease: Lease,
    write: Write,
    timeout: Duration,
    deadline: Option<Instant>,
    jitter: Jitter,
) -> Result<WriteOutcome, StoreError> {
    let operation = write.operation();
    let task = survive(tracing::Instrument::in_current_span(async move {
        retry_store(operation, timeout, deadline, &jitter, || async {
            match &write {
                Write::Complete(bytes) => store.complete(&lease, bytes).await,
                Write::Fail(bytes) => store.fail(&lease, bytes).await,
                Write::Checkpoint(step, bytes) => store.checkpoint(&lease, step, bytes).await,
                Write::Release => store.release(&lease).await,
            }
        })
        .await
    }));
    match task.await {
        Ok(result) => result,
        // The store panicked: the caller sees that panic, as if the call ran inline.
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        // Only a runtime shutting down cancels the task: the write may or may not land.
        Err(err) => Err(StoreError::Unavailable {
            operation,
            source: Box::new(err),
        }),
    }
}

/// Runs `work` to its end whatever becomes of the caller: polled here once, and moved to
/// a task of its own if it is not done by then. Both happen within one poll of the
/// caller, so no drop can come between them.
///
/// `work` is boxed before this future exists, so that the futures awaiting it hold a
/// pointer, not a copy of every write's state nested in theirs.
fn survive<T, F>(work: F) -> impl Future<Output = Result<T, tokio::task::JoinError>> + Send
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let mut work = Box::pin(work);
    async move {
        if let Poll::Ready(done) = poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await {
            return Ok(done);
        }
        tokio::spawn(work).await
    }
}

/// What storing a result or a failure came to.
pub(crate) enum Finished {
    Applied,
    Fenced,
    /// The store refused the value as too large; this marker, saying so, is stored.
    Marked(Marker),
}

/// Stores a result or a failure (`write` is [`Write::Complete`] or [`Write::Fail`]) under
/// the context's lease; one the store refuses as too large is stored as the failure
/// marker saying so, in the same task, so that a caller dropping `execute` between the
/// two leaves no key held.
pub(crate) async fn finish(
    context: &Context,
    write: Write,
    marker: fn(&Marker, Option<&Compensation>) -> Vec<u8>,
) -> Result<Finished, Error> {
    let operation = write.operation();
    let owner = context.clone();
    let task = survive(tracing::Instrument::in_current_span(async move {
        // Whether the write is the work's failure, for the marker that may replace it.
        let failure = matches!(write, Write::Fail(_));
        let mut write = write;
        let mut marked = None;
        loop {
            match owner.durable(write).await {
                Ok(WriteOutcome::Applied) => {
                    return Ok(marked.map_or(Finished::Applied, Finished::Marked));
                }
                Ok(WriteOutcome::Fenced) => return Ok(Finished::Fenced),
                Err(StoreError::TooLarge {
                    part: ValuePart::Result | ValuePart::Failure,
                    size,
                    limit,
                }) if marked.is_none() => {
                    let stored = Marker::ResultTooLarge {
                        size,
                        limit,
                        failure,
                    };
                    let bytes = owner
                        .encode(ValuePart::Failure, marker(&stored, None))
                        .map_err(|err| interruption_error(&owner.key(), err))?;
                    write = Write::Fail(bytes);
                    marked = Some(stored);
                }
                Err(err) => return Err(Error::Store(err)),
            }
        }
    }));
    match task.await {
        Ok(result) => result,
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        Err(err) => Err(Error::Store(StoreError::Unavailable {
            operation,
            source: Box::new(err),
        })),
    }
}
