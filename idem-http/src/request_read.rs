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
    /// the answer begins. The body again, whole, for shadow mode to pass on.
    Streaming(Body),
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
        return RequestBody::Streaming(Body::new(Prefixed { chunks, rest: body }));
    }
    // Then its end: empty frames and trailers may come first, a byte more is a stream.
    let deadline = tokio::time::Instant::now() + GRPC_END_GRACE;
    loop {
        if body.is_end_stream() {
            return RequestBody::Whole(read.freeze());
        }
        let next = poll_fn(|cx| body.as_mut().poll_frame(cx));
        match tokio::time::timeout_at(deadline, next).await {
            Ok(None) => return RequestBody::Whole(read.freeze()),
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) if data.is_empty() => {}
                Ok(data) => {
                    chunks.push_back(data);
                    return RequestBody::Streaming(Body::new(Prefixed { chunks, rest: body }));
                }
                // Request trailers are not part of what is fingerprinted or replayed.
                Err(_) => {}
            },
            Ok(Some(Err(_))) => return RequestBody::Broken,
            Err(_) => return RequestBody::Streaming(Body::new(Prefixed { chunks, rest: body })),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A body of these frames, then its end.
    fn frames(parts: Vec<Frame<Bytes>>) -> impl http_body::Body<Data = Bytes, Error = BoxError> {
        let stream = futures_util::stream::iter(parts.into_iter().map(Ok::<_, BoxError>));
        http_body_util::StreamBody::new(stream)
    }

    fn data(bytes: &[u8]) -> Frame<Bytes> {
        Frame::data(Bytes::copy_from_slice(bytes))
    }

    /// A message of `len` bytes with its 5-byte prefix.
    fn message(len: u8) -> Vec<u8> {
        let mut framed = vec![0, 0, 0, 0, len];
        framed.extend(std::iter::repeat_n(7u8, usize::from(len)));
        framed
    }

    async fn whole(body: Body) -> Vec<u8> {
        body.collect().await.unwrap().to_bytes().to_vec()
    }

    #[tokio::test]
    async fn one_message_split_anyhow_is_read_whole() {
        let framed = message(6);
        // The prefix split, the message split, empty frames and trailers before the end.
        let body = frames(vec![
            data(&framed[..2]),
            data(&framed[2..7]),
            data(b""),
            data(&framed[7..]),
            data(b""),
            Frame::trailers(http::HeaderMap::new()),
        ]);
        match read_grpc_body(body, 1024).await {
            RequestBody::Whole(read) => assert_eq!(read.to_vec(), framed),
            _ => panic!("one message is read whole"),
        }
        // A zero-length message alone is a message.
        match read_grpc_body(frames(vec![data(&message(0))]), 1024).await {
            RequestBody::Whole(read) => assert_eq!(read.to_vec(), message(0)),
            _ => panic!("an empty message is read whole"),
        }
        // Ended before a whole message: the service answers what it got.
        match read_grpc_body(frames(vec![data(&[0, 0])]), 1024).await {
            RequestBody::Whole(read) => assert_eq!(read.to_vec(), vec![0, 0]),
            _ => panic!("a cut prefix goes on as it is"),
        }
    }

    #[tokio::test]
    async fn a_second_message_is_a_stream_handed_back_whole() {
        let (first, second) = (message(0), message(3));
        // In one frame after the first, or in a frame of its own.
        let together = [first.clone(), second.clone()].concat();
        for body in [
            frames(vec![data(&together)]),
            frames(vec![data(&first), data(&second)]),
        ] {
            match read_grpc_body(body, 1024).await {
                RequestBody::Streaming(whole_body) => assert_eq!(whole(whole_body).await, together),
                _ => panic!("two messages are a stream"),
            }
        }
    }

    #[tokio::test]
    async fn a_message_over_the_limit_is_too_large_and_handed_back_whole() {
        let framed = message(200);
        let body = frames(vec![data(&framed[..3]), data(&framed[3..])]);
        match read_grpc_body(body, 100).await {
            RequestBody::TooLarge(whole_body) => assert_eq!(whole(whole_body).await, framed),
            _ => panic!("over the limit"),
        }
        // A length near u32::MAX never overflows.
        let huge = frames(vec![data(&[0, 0xff, 0xff, 0xff, 0xff])]);
        assert!(matches!(
            read_grpc_body(huge, usize::MAX - 1).await,
            RequestBody::Whole(_) | RequestBody::TooLarge(_)
        ));
    }

    /// The limit is the most a body may hold: at it, whole; a byte past it, too large,
    /// whether its length is told up front or found reading.
    #[tokio::test]
    async fn a_body_at_the_limit_is_whole_and_a_byte_more_is_too_large() {
        let told = |len: usize| http_body_util::Full::new(Bytes::from(vec![1u8; len]));
        assert!(matches!(read_body(told(4), 4).await, RequestBody::Whole(read) if read.len() == 4));
        assert!(matches!(
            read_body(told(5), 4).await,
            RequestBody::TooLarge(_)
        ));
        let found = |sizes: &[usize]| frames(sizes.iter().map(|&n| data(&vec![2u8; n])).collect());
        assert!(
            matches!(read_body(found(&[2, 2]), 4).await, RequestBody::Whole(read) if read.len() == 4)
        );
        match read_body(found(&[3, 3]), 4).await {
            RequestBody::TooLarge(whole_body) => assert_eq!(whole(whole_body).await, vec![2u8; 6]),
            _ => panic!("past the limit"),
        }
    }

    #[tokio::test]
    async fn a_message_at_the_limit_is_whole_and_its_end_may_come_later() {
        let framed = message(95);
        match read_grpc_body(frames(vec![data(&framed)]), 100).await {
            RequestBody::Whole(read) => assert_eq!(read.to_vec(), framed),
            _ => panic!("a message of the limit's size is read whole"),
        }
        // The client ends its request a moment after the message (well within the grace).
        let late_end = futures_util::stream::unfold(0, |step| async move {
            match step {
                0 => Some((Ok::<_, BoxError>(data(&message(3))), 1)),
                _ => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    None
                }
            }
        });
        match read_grpc_body(http_body_util::StreamBody::new(late_end), 100).await {
            RequestBody::Whole(read) => assert_eq!(read.to_vec(), message(3)),
            _ => panic!("a unary call whose end comes late is still one message"),
        }
    }
}
