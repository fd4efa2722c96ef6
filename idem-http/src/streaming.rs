//! A response streamed to its client while the work that stores it runs on in a task of
//! its own: a client that reads slowly (or the server not polling a body it cannot send)
//! never stalls the work's heartbeat, and the work goes at the client's pace.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use idem_core::BoxError;
use tokio::sync::mpsc;

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

/// The body of a streamed response: the handler's frames as they come.
pub(crate) struct Streaming {
    frames: Frames,
}

impl Streaming {
    pub(crate) fn new(frames: Frames) -> Self {
        Self { frames }
    }
}

impl http_body::Body for Streaming {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // The work sends the frames; when it ends, the channel closes after the last.
        self.get_mut().frames.poll_recv(cx)
    }
}
