//! The handler's response: run for the driver, streamed to its client as it comes, and
//! stored whole or without its body.

use std::future::{Future, poll_fn};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use bytes::{Bytes, BytesMut};
use http::response::Parts as ResponseParts;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Frame;
use idem_core::{BoxError, Context, WorkError};
use tokio::sync::{mpsc, oneshot};

use super::failures::{failed, not_run, shed};
use super::protected::{Captured, Pump, Rest, lock};
use super::{Inner, ResponseBody};
use crate::Body;
use crate::disposition::Disposition;
use crate::layer::Config;
use crate::stored::StoredResponse;
use crate::streaming::{FRAMES_IN_FLIGHT, FrameSender, Frames};

/// The most frames read from a handler's body while they are ready before its head is
/// sent: a body that is always ready is streamed, not buffered forever.
const MAX_READY_FRAMES: usize = 1024;

/// Sends the rest of a body to the client, after its record was finished without it.
pub(super) async fn stream_rest<ResBody: ResponseBody>(
    mut body: Pin<Box<ResBody>>,
    frames: FrameSender,
) {
    loop {
        match next_frame(&mut body).await {
            None => return,
            Some(frame) => {
                let end = frame.is_err();
                if frames.send(frame).await.is_err() || end {
                    // The client is gone, and nothing more is stored: stop reading.
                    return;
                }
            }
        }
    }
}

/// The next frame of the handler's body, a panic while producing it an error.
async fn next_frame<ResBody: ResponseBody>(
    body: &mut Pin<Box<ResBody>>,
) -> Option<Result<Frame<Bytes>, BoxError>> {
    poll_fn(|cx| poll_frame(body, cx)).await
}

fn poll_frame<ResBody: ResponseBody>(
    body: &mut Pin<Box<ResBody>>,
    cx: &mut TaskContext<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| body.as_mut().poll_frame(cx))) {
        Ok(polled) => polled.map(|frame| frame.map(|frame| frame.map_err(Into::into))),
        Err(_) => Poll::Ready(Some(Err("the handler's body panicked".into()))),
    }
}

/// Data frames shorter than this are kept for the record copied together, not one by one:
/// a stream of tiny frames (events of a few bytes) would otherwise keep a frame each, many
/// times its bytes, and hold on to the buffers they were cut from.
const SMALL_FRAME: usize = 1024;

/// A response's body as read so far: what the client gets, and what may be stored.
#[derive(Default)]
struct Read {
    frames: Vec<Frame<Bytes>>,
    /// Small data frames kept after `frames`, copied together ([`keep`]).
    small: BytesMut,
    /// Bytes of data read (kept, for the record's copy).
    size: usize,
    trailers: HeaderMap,
}

impl Read {
    fn push(&mut self, frame: Frame<Bytes>) {
        if let Some(data) = frame.data_ref() {
            self.size = self.size.saturating_add(data.len());
        } else if let Some(trailers) = frame.trailers_ref() {
            self.trailers.extend(trailers.clone());
        }
        self.frames.push(frame);
    }

    /// The data frames as one: the frame itself when there is one (most handlers
    /// answer a whole body at once), without a list of them on the way.
    fn data(&self) -> Bytes {
        let mut chunks = self.frames.iter().filter_map(Frame::data_ref);
        let Some(first) = chunks.next() else {
            return Bytes::copy_from_slice(&self.small);
        };
        let Some(second) = chunks.next() else {
            if self.small.is_empty() {
                return first.clone();
            }
            return [&first[..], &self.small[..]].concat().into();
        };
        let mut all = BytesMut::with_capacity(self.size);
        all.extend_from_slice(first);
        all.extend_from_slice(second);
        chunks.for_each(|chunk| all.extend_from_slice(chunk));
        all.extend_from_slice(&self.small);
        all.freeze()
    }
}

/// Runs the handler for the driver: streams its response to the client as it comes and
/// decides what is stored.
pub(super) async fn handler_outcome<S, ResBody>(
    mut inner: S,
    mut request: Request<Body>,
    ctx: Context,
    config: Arc<Config>,
    head_tx: oneshot::Sender<(ResponseParts, Frames)>,
    captured: Captured,
    pump: Pump<ResBody>,
) -> Result<Vec<u8>, WorkError<Vec<u8>>>
where
    S: Inner<ResBody>,
    ResBody: ResponseBody,
{
    // Handlers reach steps, derived keys and the fencing token through the context.
    request.extensions_mut().insert(ctx.clone());
    // A panic in the handler, its future or its body is the handler failing: 500, held.
    let Ok(mut call) = std::panic::catch_unwind(AssertUnwindSafe(|| Box::pin(inner.call(request))))
    else {
        return failed(&"the handler panicked".into(), &config, &captured);
    };
    let called =
        poll_fn(
            |cx| match std::panic::catch_unwind(AssertUnwindSafe(|| call.as_mut().poll(cx))) {
                Ok(polled) => polled.map(|result| result.map_err(Into::into)),
                Err(_) => Poll::Ready(Err("the handler panicked".into())),
            },
        )
        .await;
    drop(call);
    let response = match called {
        Ok(response) => response,
        Err(err) if not_run(&err) => return shed(&config, &captured),
        Err(err) => return failed(&err, &config, &captured),
    };
    let (parts, body) = response.into_parts();
    let mut body = Box::pin(body);
    let status = parts.status;
    let chosen = parts.extensions.get::<Disposition>().copied();
    // gRPC answers 200 and says how the call went in `grpc-status`: in the headers of a
    // trailers-only answer, else in the trailers, known when the body ends.
    let is_grpc = crate::grpc::is_grpc(&parts.headers);
    let grpc = chosen.is_none() && is_grpc;
    // The head is the outcome: a body that breaks off finishes a stored key without it.
    let final_head = parts.extensions.get::<crate::FinalHead>().is_some() && !is_grpc;
    let disposition = chosen.unwrap_or_else(|| match grpc {
        true => crate::grpc::disposition(&parts.headers).unwrap_or(Disposition::Store),
        false => std::panic::catch_unwind(AssertUnwindSafe(|| (config.disposition)(status)))
            .unwrap_or(Disposition::Hold),
    });
    // Known held before anything of the answer goes out, so that a retry sent the moment
    // it arrives is told so (the work's end is recorded after the answer is sent).
    if disposition == Disposition::Hold && !grpc && !config.shadow {
        config.held.hold(&ctx.key(), config.idem.lease());
    }
    let storing = disposition == Disposition::Store;
    let headers: HeaderMap = if storing {
        parts
            .headers
            .iter()
            // A trailers-only gRPC answer carries its status in the headers.
            .filter(|(name, _)| {
                config.stores_header(name) || (is_grpc && name.as_str().starts_with("grpc-"))
            })
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    } else {
        HeaderMap::new()
    };
    let head_size = 20
        + headers
            .iter()
            .map(|(name, value)| 6 + name.as_str().len() + value.len())
            .sum::<usize>();
    // Never buffer more than the record can hold: a store's own limit lowers the layer's.
    let room = config
        .max_response_body
        .min(ctx.room_for_plain_response().saturating_sub(head_size));
    let mut read = Read::default();
    // Whatever the body has ready now: most handlers answer a whole body at once, which
    // is stored before it is sent, as one response.
    // A body that broke off before the head went, when the head is the outcome: sent to
    // the client after the frames read, and the key finished without the body.
    let mut broke_off = None;
    let complete = loop {
        match poll_fn(|cx| Poll::Ready(poll_frame(&mut body, cx))).await {
            Poll::Ready(None) => break true,
            Poll::Ready(Some(Ok(frame))) => {
                read.push(frame);
                // Bounded in frames too: a body of empty frames that are always ready
                // would never grow past the size.
                if read.size > room.max(64 * 1024) || read.frames.len() >= MAX_READY_FRAMES {
                    break false;
                }
            }
            Poll::Ready(Some(Err(err))) if final_head => {
                broke_off = Some(err);
                break false;
            }
            Poll::Ready(Some(Err(err))) => return failed(&err, &config, &captured),
            Poll::Pending => break false,
        }
    };
    let outcome = |read: &Read, whole: bool| -> Result<Vec<u8>, WorkError<Vec<u8>>> {
        let disposition = match grpc {
            true => crate::grpc::disposition(&read.trailers).unwrap_or(disposition),
            false => disposition,
        };
        match disposition {
            Disposition::Store => Ok(stored(
                status,
                headers.clone(),
                read,
                whole,
                grpc,
                &ctx,
                room,
            )),
            Disposition::Release => Err(WorkError::Retryable(Vec::new())),
            Disposition::Hold => Err(WorkError::Unknown(Vec::new())),
        }
    };
    if complete {
        let result = outcome(&read, true);
        let data = read.data();
        let response = Response::from_parts(parts, Body::replayed(data, read.trailers));
        *lock(&captured) = Some(response);
        return result;
    }
    // A stream: the head goes now, each frame as it comes.
    let (frames, receiver) = mpsc::channel(FRAMES_IN_FLIGHT);
    let mut client = Client {
        frames,
        gone: false,
    };
    if head_tx.send((parts, receiver)).is_err() {
        client.gone = true;
    }
    let mut kept = Read::default();
    let mut over = false;
    for frame in read.frames {
        over = keep(&mut kept, &frame, storing, over, room);
        client.send(Ok(frame)).await;
    }
    if let Some(err) = broke_off {
        return head_decides(err, client, &pump, outcome(&kept, false));
    }
    // Once the client is gone, the body is read on for the record, for at most a lease:
    // a finite stream is kept whole, one that never ends stops holding its key.
    let mut deadline = client
        .gone
        .then(|| tokio::time::Instant::now() + config.idem.lease());
    loop {
        if over && storing && !grpc {
            // Too large to store: the key is finished now, without the body, and the
            // rest streams on after it to a client still reading. (A gRPC answer whose
            // status decides waits for it in its trailers, and is stored without its body
            // then; one whose handler chose to store it is finished now, like any other.)
            if !client.gone {
                *lock(&pump) = Some((Rest::Body(body), client.frames));
            }
            return outcome(&kept, false);
        }
        let next = match deadline {
            None => next_frame_or_gone(&mut body, &client.frames).await,
            // A body whose frames are always ready never lets a timeout fire, and never
            // yields: the end of the lease is checked before each frame, and each frame
            // spends the task's budget, so that the work's heartbeat and the rest of the
            // runtime run.
            Some(at) if tokio::time::Instant::now() >= at => {
                return match grpc {
                    true => Err(WorkError::Unknown(Vec::new())),
                    false => outcome(&kept, false),
                };
            }
            Some(at) => match tokio::time::timeout_at(at, async {
                tokio::task::coop::consume_budget().await;
                next_frame(&mut body).await
            })
            .await
            {
                Ok(frame) => Next::Frame(frame),
                Err(_) => {
                    // Nobody reads and the stream goes on: the key is finished now (a
                    // gRPC answer, whose status is still to come, is held).
                    return match grpc {
                        true => Err(WorkError::Unknown(Vec::new())),
                        false => outcome(&kept, false),
                    };
                }
            },
        };
        match next {
            Next::Gone => client.gone = true,
            Next::Frame(None) => break,
            Next::Frame(Some(Ok(frame))) => {
                over = keep(&mut kept, &frame, storing, over, room);
                client.send(Ok(frame)).await;
            }
            Next::Frame(Some(Err(err))) if final_head => {
                return head_decides(err, client, &pump, outcome(&kept, false));
            }
            Next::Frame(Some(Err(err))) => {
                // The body broke off: whatever the handler did may have happened.
                tracing::warn!(error = %err, "the handler's response body failed");
                client.send(Err(err)).await;
                return Err(WorkError::Unknown(Vec::new()));
            }
        }
        if client.gone && deadline.is_none() {
            deadline = Some(tokio::time::Instant::now() + config.idem.lease());
        }
    }
    outcome(&kept, !over)
}

/// A body that broke off after a [`crate::FinalHead`]: its head's disposition decides the
/// key (a stored one is finished without the body), and the client, if it still reads,
/// gets the error once the key is finished, so that the retry the cut prompts is
/// answered from the record, not 409.
fn head_decides<ResBody>(
    err: BoxError,
    client: Client,
    pump: &Pump<ResBody>,
    outcome: Result<Vec<u8>, WorkError<Vec<u8>>>,
) -> Result<Vec<u8>, WorkError<Vec<u8>>> {
    tracing::warn!(error = %err, "the response body broke off after its head; its head decides its key");
    if !client.gone {
        *lock(pump) = Some((Rest::Error(err), client.frames));
    }
    outcome
}

/// What came of waiting on the handler's body.
enum Next {
    Frame(Option<Result<Frame<Bytes>, BoxError>>),
    /// The client went away while the body was quiet.
    Gone,
}

/// The next frame of the handler's body, or word that the client went away meanwhile (a
/// stream that goes quiet must not hide that its reader is gone).
async fn next_frame_or_gone<ResBody: ResponseBody>(
    body: &mut Pin<Box<ResBody>>,
    frames: &FrameSender,
) -> Next {
    let closed = frames.closed();
    let mut closed = std::pin::pin!(closed);
    poll_fn(|cx| {
        if let Poll::Ready(frame) = poll_frame(body, cx) {
            return Poll::Ready(Next::Frame(frame));
        }
        if closed.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Next::Gone);
        }
        Poll::Pending
    })
    .await
}

/// The client's side of a streamed response; a client gone still lets the body be read
/// on, for the record.
struct Client {
    frames: FrameSender,
    gone: bool,
}

impl Client {
    async fn send(&mut self, frame: Result<Frame<Bytes>, BoxError>) {
        if !self.gone && self.frames.send(frame).await.is_err() {
            self.gone = true;
        }
    }
}

/// Keeps a copy of `frame` for the record while the body fits its room; true once it no
/// longer does (`over`: nothing more of the body is kept then, only trailers).
fn keep(kept: &mut Read, frame: &Frame<Bytes>, storing: bool, over: bool, room: usize) -> bool {
    if !storing {
        return false;
    }
    if let Some(data) = frame.data_ref() {
        if over {
            return true;
        }
        if kept.size.saturating_add(data.len()) > room {
            kept.frames = Vec::new();
            kept.small = BytesMut::new();
            return true;
        }
        kept.size += data.len();
        if data.len() < SMALL_FRAME {
            // An empty frame adds nothing.
            kept.small.extend_from_slice(data);
        } else {
            if !kept.small.is_empty() {
                let small = kept.small.split().freeze();
                kept.frames.push(Frame::data(small));
            }
            kept.frames.push(Frame::data(data.clone()));
        }
    } else if let Some(trailers) = frame.trailers_ref() {
        kept.trailers.extend(trailers.clone());
    }
    over
}

/// The stored form of a response: whole when it fits the record, else its status and
/// headers only. Trailers go with the body, but for a gRPC answer whose status decides
/// (`grpc`), which is waited for: any other body streamed past its room finishes its key
/// before its trailers come, so one too large that was read whole is stored without them
/// as well.
fn stored(
    status: StatusCode,
    headers: HeaderMap,
    read: &Read,
    whole: bool,
    grpc: bool,
    ctx: &Context,
    room: usize,
) -> Vec<u8> {
    let trailers: HeaderMap = read
        .trailers
        .iter()
        .filter(|(name, _)| !crate::layer::is_hop_by_hop(name))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let without_body = |headers: HeaderMap, trailers: HeaderMap| {
        let response = StoredResponse::without_body(status, headers);
        match grpc {
            true => response.with_trailers(trailers),
            false => response,
        }
        .encode()
    };
    if !whole || read.size > room {
        return without_body(headers, trailers);
    }
    let response = StoredResponse::new(status, headers, read.data()).with_trailers(trailers);
    let bytes = response.encode();
    if !ctx.fits_response(&bytes) {
        return without_body(response.headers, response.trailers);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::HeaderMap;
    use http_body::Frame;

    use super::{Read, keep};

    fn data(bytes: &'static [u8]) -> Frame<Bytes> {
        Frame::data(Bytes::from_static(bytes))
    }

    #[test]
    fn tiny_and_empty_frames_are_kept_copied_together_and_in_order() {
        let mut kept = Read::default();
        let large = vec![b'L'; 2000];
        let mut expected = Vec::new();
        for _ in 0..10_000 {
            assert!(!keep(&mut kept, &data(b""), true, false, 1 << 20));
            assert!(!keep(&mut kept, &data(b"e"), true, false, 1 << 20));
            expected.push(b'e');
        }
        assert!(kept.frames.is_empty(), "no frame kept per tiny frame");
        let frame = Frame::data(Bytes::from(large.clone()));
        assert!(!keep(&mut kept, &frame, true, false, 1 << 20));
        expected.extend_from_slice(&large);
        assert!(!keep(&mut kept, &data(b"tail"), true, false, 1 << 20));
        expected.extend_from_slice(b"tail");
        assert_eq!(
            kept.frames.len(),
            2,
            "the tiny ones as one frame, then the large one"
        );
        assert_eq!(kept.size, expected.len());
        assert_eq!(kept.data(), expected);
    }

    #[test]
    fn past_its_room_nothing_more_of_the_body_is_kept_but_trailers_are() {
        let mut kept = Read::default();
        assert!(!keep(&mut kept, &data(b"abc"), true, false, 5));
        assert!(keep(&mut kept, &data(b"def"), true, false, 5));
        assert!(kept.frames.is_empty() && kept.small.is_empty());
        assert!(
            keep(&mut kept, &data(b""), true, true, 5),
            "over stays over"
        );
        assert!(keep(&mut kept, &data(b"g"), true, true, 5));
        assert!(kept.small.is_empty());
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        assert!(keep(
            &mut kept,
            &Frame::trailers(trailers.clone()),
            true,
            true,
            5
        ));
        assert_eq!(kept.trailers, trailers);
        // Not storing: nothing kept, never over.
        let mut skipped = Read::default();
        assert!(!keep(&mut skipped, &data(b"too long"), false, false, 1));
        assert_eq!(skipped.size, 0);
    }

    #[test]
    fn a_body_of_every_frame_size_is_kept_in_order_until_it_passes_its_room() {
        let sizes = [0, 1, 1023, 1024, 5000, 3, 0, 2048, 7, 1, 4096];
        let frames: Vec<Frame<Bytes>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| Frame::data(Bytes::from(vec![b'a' + i as u8; len])))
            .collect();
        let whole: Vec<u8> = frames
            .iter()
            .flat_map(|f| f.data_ref().unwrap().to_vec())
            .collect();
        for room in [whole.len(), whole.len() - 1, 6000, 1030] {
            let mut kept = Read::default();
            let mut over = false;
            let mut expected = Vec::new();
            for frame in &frames {
                over = keep(&mut kept, frame, true, over, room);
                if !over {
                    expected.extend_from_slice(frame.data_ref().unwrap());
                }
                if over {
                    // Nothing of the body held once past its room, large frames included.
                    assert!(
                        kept.frames.is_empty() && kept.small.is_empty(),
                        "room {room}"
                    );
                } else {
                    assert_eq!(kept.size, expected.len(), "room {room}");
                    assert_eq!(kept.data(), expected, "room {room}");
                }
            }
            assert_eq!(over, room < whole.len(), "room {room}");
        }
    }

    #[test]
    fn one_large_frame_is_answered_without_a_copy() {
        let mut kept = Read::default();
        // Large from SMALL_FRAME on.
        let frame = Frame::data(Bytes::from(vec![b'x'; super::SMALL_FRAME]));
        keep(&mut kept, &frame, true, false, 1 << 20);
        let whole = kept.data();
        assert_eq!(whole.as_ptr(), frame.data_ref().unwrap().as_ptr());
        keep(&mut kept, &data(b"!"), true, false, 1 << 20);
        assert_eq!(kept.data().len(), super::SMALL_FRAME + 1);
        assert_eq!(kept.data().last(), Some(&b'!'));
        let mut small = Read::default();
        keep(&mut small, &data(b"only"), true, false, 1 << 20);
        assert_eq!(small.data(), &b"only"[..]);
        assert_eq!(Read::default().data(), Bytes::new());
    }
}
