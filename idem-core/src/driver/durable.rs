//! Writes after the work, made so that they survive the caller going away.
//!
//! Once the work returned, its effect happened: the result (or failure, or checkpoint)
//! must reach the store even if the caller drops `execute` (a client timeout, an axum
//! handler whose client disconnected). Each such write is polled in place, by the caller,
//! and moves to a task of its own only if the caller drops it before it finished, which
//! then runs it to its end. A write that finishes while its caller waits costs no task and
//! no wake-up on another thread.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
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
    Complete(Vec<u8>),
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
/// lease's end on this process's clock, when given), and answers what it answered.
/// Dropping the returned future does not stop the write: it goes on in a task of its own.
pub(crate) async fn write(
    store: Arc<dyn Store>,
    lease: Lease,
    write: Write,
    timeout: Duration,
    deadline: Option<Instant>,
    jitter: Jitter,
) -> Result<WriteOutcome, StoreError> {
    Survive::new(in_place(store, lease, write, timeout, deadline, jitter)).await
}

/// [`write`] for a caller that is itself a [`Survive`] (or inside one): run where it is,
/// without a task of its own to go to.
pub(crate) async fn in_place(
    store: Arc<dyn Store>,
    lease: Lease,
    write: Write,
    timeout: Duration,
    deadline: Option<Instant>,
    jitter: Jitter,
) -> Result<WriteOutcome, StoreError> {
    let operation = write.operation();
    retry_store(operation, timeout, deadline, &jitter, || async {
        match &write {
            Write::Complete(bytes) => store.complete(&lease, bytes).await,
            Write::Fail(bytes) => store.fail(&lease, bytes).await,
            Write::Checkpoint(step, bytes) => store.checkpoint(&lease, step, bytes).await,
            Write::Release => store.release(&lease).await,
        }
    })
    .await
}

/// Runs its work to the end whatever becomes of the caller: polled in place while the
/// caller awaits it, and, if the caller drops it first, handed as it stands to a task of
/// its own that finishes it. A future may be polled from one task and then another, so
/// nothing the work started (a request on the wire, a retry's wait) is lost in the move.
/// Like the heartbeat while the work runs, the write advances only while the caller polls
/// it: a caller polls `execute` to its end or drops it.
///
/// The work is boxed, so the futures awaiting it hold a pointer, not a copy of every
/// write's state nested in theirs, and moving it to a task moves only the pointer.
pub(crate) struct Survive<T: Send + 'static> {
    /// `None` once it has finished, or while it is being polled (so that a panic in it
    /// leaves nothing to hand on: that future cannot go on).
    work: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    /// The runtime it first waited on, to finish it on when it is dropped unfinished, even
    /// from a thread outside that runtime.
    runtime: Option<tokio::runtime::Handle>,
}

impl<T: Send + 'static> Survive<T> {
    pub(crate) fn new(work: impl Future<Output = T> + Send + 'static) -> Self {
        Self {
            work: Some(Box::pin(work)),
            runtime: None,
        }
    }
}

impl<T: Send + 'static> Future for Survive<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<T> {
        // Never polled again once finished: whatever awaits it stops at its answer.
        let Some(mut work) = self.work.take() else {
            return Poll::Pending;
        };
        match work.as_mut().poll(cx) {
            Poll::Ready(done) => Poll::Ready(done),
            Poll::Pending => {
                if self.runtime.is_none() {
                    self.runtime = tokio::runtime::Handle::try_current().ok();
                }
                self.work = Some(work);
                Poll::Pending
            }
        }
    }
}

impl<T: Send + 'static> Drop for Survive<T> {
    fn drop(&mut self) {
        if let Some(work) = self.work.take() {
            let runtime = self
                .runtime
                .take()
                .or_else(|| tokio::runtime::Handle::try_current().ok());
            match runtime {
                // On a runtime shutting down, the task is dropped at once, as it would be
                // had it been spawned before.
                // The task goes on in the span current where it was dropped: `execute`'s
                // when a caller drops `execute` (an instrumented future enters its span
                // while it drops what it holds).
                Some(runtime) => drop(runtime.spawn(tracing::Instrument::in_current_span(work))),
                // Never polled on a runtime, and dropped outside one: nothing can run it.
                None => tracing::warn!(
                    "a write after the work was dropped outside any Tokio runtime before it \
                     began; the lease will run out and a retry take over"
                ),
            }
        }
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
    let owner = context.clone();
    Survive::new(async move {
        // Whether the write is the work's failure, for the marker that may replace it.
        let failure = matches!(write, Write::Fail(_));
        let mut write = write;
        let mut marked = None;
        loop {
            match owner.durable_in_place(write).await {
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
    })
    .await
}
