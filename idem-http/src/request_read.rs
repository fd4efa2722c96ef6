//! Reading a protected request's body whole, within its limit, before anything is
//! claimed; and a gRPC call's one message, refusing a stream of them.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body as _, Frame};
use idem_core::BoxError;

use crate::Body;

/// The request body, read within its limit.
pub(crate) enum RequestBody {
    Whole(Bytes),
    /// Over the limit: the bytes read so far and the rest, as one body again.
    TooLarge(Body),
    Broken,
    /// A gRPC call that sends more than one message, or does not end its request after
    /// its first (client streaming, bidirectional): the layer cannot read it whole before
    /// the answer begins.
    Streaming,
}

/// How long a gRPC call's request may stay open after its first whole message before it
/// is taken for a stream: a unary call ends it with that message.
const GRPC_END_GRACE: Duration = Duration::from_secs(5);

pub(crate) async fn read_body<B>(body: B, limit: usize) -> RequestBody
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    if body.size_hint().lower() > limit as u64 {
        // Content-Length says so: no need to read a byte.
        return RequestBody::TooLarge(Body::new(body));
    }
    let mut chunks = VecDeque::new();
    let mut read = 0usize;
    loop {
        match poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            None => break,
            Some(Ok(frame)) => {
                // Request trailers are not part of what is fingerprinted or replayed.
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                read = read.saturating_add(data.len());
                chunks.push_back(data);
                if read > limit {
                    return RequestBody::TooLarge(Body::new(Prefixed { chunks, rest: body }));
                }
            }
            Some(Err(_)) => return RequestBody::Broken,
        }
    }
    RequestBody::Whole(concat(chunks.into()))
}

/// A gRPC call's request body: its one length-prefixed message, read within `limit`, and
/// then its end. A second message, or no end within a grace after the first, is a stream
/// the layer refuses rather than wait for (a bidirectional call would wait for the answer
/// before ending its request, and hang).
pub(crate) async fn read_grpc_body<B>(body: B, limit: usize) -> RequestBody
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let mut chunks = VecDeque::new();
    let mut read = BytesMut::new();
    // Until the first message is whole: its 5-byte prefix (a flag, then its length).
    let whole = loop {
        if read.len() >= 5 {
            let length = u32::from_be_bytes([read[1], read[2], read[3], read[4]]) as usize;
            let whole = length.saturating_add(5);
            if whole > limit {
                return RequestBody::TooLarge(Body::new(Prefixed { chunks, rest: body }));
            }
            if read.len() >= whole {
                break whole;
            }
        }
        match poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            // Ended before a whole message: the service answers what it got.
            None => return RequestBody::Whole(read.freeze()),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    read.extend_from_slice(&data);
                    chunks.push_back(data);
                }
            }
            Some(Err(_)) => return RequestBody::Broken,
        }
    };
    if read.len() > whole {
        return RequestBody::Streaming;
    }
    // Then its end: empty frames and trailers may come first, a byte more is a stream.
    let ended = tokio::time::timeout(GRPC_END_GRACE, async {
        loop {
            if body.is_end_stream() {
                return Some(true);
            }
            match poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
                None => return Some(true),
                Some(Ok(frame)) => {
                    if frame.data_ref().is_some_and(|data| !data.is_empty()) {
                        return Some(false);
                    }
                }
                Some(Err(_)) => return None,
            }
        }
    })
    .await;
    match ended {
        Ok(Some(true)) => RequestBody::Whole(read.freeze()),
        Ok(None) => RequestBody::Broken,
        Ok(Some(false)) | Err(_) => RequestBody::Streaming,
    }
}

/// Chunks already read, then the rest of the body.
struct Prefixed<B> {
    chunks: VecDeque<Bytes>,
    rest: Pin<Box<B>>,
}

impl<B: http_body::Body<Data = Bytes>> http_body::Body for Prefixed<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(chunk) = self.chunks.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        self.rest.as_mut().poll_frame(cx)
    }
}

/// The chunks as one `Bytes`, copied only when there are several.
pub(crate) fn concat(mut chunks: Vec<Bytes>) -> Bytes {
    match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.pop().unwrap_or_default(),
        _ => {
            let mut all = BytesMut::with_capacity(chunks.iter().map(Bytes::len).sum());
            for chunk in chunks {
                all.extend_from_slice(&chunk);
            }
            all.freeze()
        }
    }
}
