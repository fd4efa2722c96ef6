//! Bodies that may not stall: once their reader waits for a frame, it must come within a
//! timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;

/// Whose body stalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// A client's request body.
    Client,
    /// The upstream's answer.
    Upstream,
}

/// The error of a body that stalled: its reader waited longer than the timeout.
#[derive(Debug, thiserror::Error)]
#[error("{}", match .0 { Side::Client => "the client's request body stalled", Side::Upstream => "the upstream's answer stalled" })]
pub(crate) struct Stalled(pub(crate) Side);

/// Whether `err`, or an error it came from, is a client's body that stalled.
pub(crate) fn client_stalled(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(cause) = source {
        if cause
            .downcast_ref::<Stalled>()
            .is_some_and(|stalled| stalled.0 == Side::Client)
        {
            return true;
        }
        source = cause.source();
    }
    false
}

/// A body whose reader may wait at most `timeout` for each frame; past it, the body
/// breaks off with [`Stalled`] and raises its flag. Only time spent waiting counts: a
/// reader that is slow to ask (backpressure further on) is never the body's fault.
pub(crate) struct Idle<B> {
    body: B,
    timeout: Duration,
    /// Armed while the reader waits.
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    side: Side,
    stalled: Arc<AtomicBool>,
    on_stall: fn(),
}

impl<B> Idle<B> {
    pub(crate) fn new(body: B, timeout: Duration, side: Side) -> Self {
        Self {
            body,
            timeout,
            sleep: None,
            side,
            stalled: Arc::new(AtomicBool::new(false)),
            on_stall: || {},
        }
    }

    /// Calls `count` once when it stalls (a metric).
    pub(crate) fn on_stall(mut self, count: fn()) -> Self {
        self.on_stall = count;
        self
    }

    /// Raised once the body stalled.
    pub(crate) fn stalled(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stalled)
    }
}

impl<B> http_body::Body for Idle<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<idem_core::BoxError>,
{
    type Data = Bytes;
    type Error = idem_core::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.stalled.load(Ordering::Relaxed) {
            return Poll::Ready(Some(Err(Stalled(self.side).into())));
        }
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            self.sleep = None;
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        let timeout = self.timeout;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.stalled.store(true, Ordering::Relaxed);
                (self.on_stall)();
                Poll::Ready(Some(Err(Stalled(self.side).into())))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
