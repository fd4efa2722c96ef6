//! A response streamed to its client while the work that stores it runs on, driven by
//! the client's reads: no task of its own unless the client goes away.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use idem_core::BoxError;
use tokio::sync::mpsc;

use crate::handlers::Handlers;

/// The rest of a protected request's work: finishing its record, pumping the rest of a
/// body that was too large to store, counting the answer.
pub(crate) type Tail = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The frames of the handler's body on their way to the client.
pub(crate) type Frames = mpsc::Receiver<Result<Frame<Bytes>, BoxError>>;
/// The sending side of [`Frames`].
pub(crate) type FrameSender = mpsc::Sender<Result<Frame<Bytes>, BoxError>>;

/// How many frames wait for a slow client before the handler's body is read no further:
/// the stream goes at the client's pace, in bounded memory.
pub(crate) const FRAMES_IN_FLIGHT: usize = 8;

/// A work future that is finished elsewhere if its owner drops it first.
pub(crate) struct Detached {
    work: Option<Tail>,
    handlers: Handlers,
}

impl Detached {
    pub(crate) fn new(work: Tail, handlers: Handlers) -> Self {
        Self {
            work: Some(work),
            handlers,
        }
    }

    /// Drives the work; ready once it has ended.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(work) = self.work.as_mut() else {
            return Poll::Ready(());
        };
        let polled = work.as_mut().poll(cx);
        if polled.is_ready() {
            self.work = None;
        }
        polled
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        // The client went away: the work still finishes, so its record is stored.
        if let Some(work) = self.work.take() {
            self.handlers.detach(work);
        }
    }
}

/// The body of a streamed response: the handler's frames as they come, while polling it
/// drives the work that stores them.
pub(crate) struct Streaming {
    work: Detached,
    frames: Frames,
}

impl Streaming {
    pub(crate) fn new(work: Detached, frames: Frames) -> Self {
        Self { work, frames }
    }
}

impl http_body::Body for Streaming {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        // The work sends the frames; when it ends, the channel closes after the last.
        let _ = this.work.poll(cx);
        this.frames.poll_recv(cx)
    }
}
