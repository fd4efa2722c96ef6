//! The body type the layer speaks.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use idem_core::BoxError;

/// The body of the requests the layer hands the inner service, and of its responses: any
/// body of `Bytes`, boxed. A newtype rather than an alias, so that futures holding it stay
/// provably `Send` (rust-lang/rust#110338).
///
/// ```
/// use idem_http::Body;
///
/// let body = Body::from(bytes::Bytes::from_static(b"hello"));
/// # let _ = body;
/// ```
pub struct Body(UnsyncBoxBody<Bytes, BoxError>);

impl Body {
    /// Boxes any body of `Bytes`.
    pub fn new<B>(body: B) -> Self
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Self(body.map_err(Into::into).boxed_unsync())
    }

    /// An empty body.
    pub fn empty() -> Self {
        Self::from(Bytes::new())
    }
}

impl Body {
    /// A stored body sent again: its bytes, then its trailers when it had any.
    pub(crate) fn replayed(data: Bytes, trailers: HeaderMap) -> Self {
        if trailers.is_empty() {
            return Self::from(data);
        }
        Self::new(Replayed {
            data: (!data.is_empty()).then_some(data),
            trailers: Some(trailers),
        })
    }
}

/// Bytes, then trailers.
struct Replayed {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for Replayed {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

impl From<Bytes> for Body {
    fn from(bytes: Bytes) -> Self {
        Self(
            Full::new(bytes)
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
    }
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Body")
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.0.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http::HeaderMap;
    use http_body::Body as _;

    use super::Body;

    /// Polls one frame of a body that is always ready.
    fn next_frame(body: &mut Body) -> Option<http_body::Frame<Bytes>> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match Pin::new(body).poll_frame(&mut cx) {
            Poll::Ready(frame) => frame.map(|f| f.expect("no error")),
            Poll::Pending => panic!("a replayed body is always ready"),
        }
    }

    #[test]
    fn a_body_of_bytes_tells_its_exact_size_and_its_end() {
        let mut body = Body::from(Bytes::from_static(b"hello"));
        assert_eq!(body.size_hint().exact(), Some(5));
        assert!(!body.is_end_stream());
        assert_eq!(next_frame(&mut body).unwrap().into_data().unwrap(), "hello");
        assert!(body.is_end_stream());
        assert!(Body::empty().is_end_stream());
        assert_eq!(format!("{:?}", Body::empty()), "Body");
    }

    #[test]
    fn a_replayed_body_ends_after_its_trailers_not_before() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let mut body = Body::replayed(Bytes::from_static(b"data"), trailers.clone());
        assert!(!body.is_end_stream());
        assert_eq!(next_frame(&mut body).unwrap().into_data().unwrap(), "data");
        assert!(!body.is_end_stream(), "its trailers are still to come");
        assert_eq!(
            next_frame(&mut body).unwrap().into_trailers().unwrap(),
            trailers
        );
        assert!(body.is_end_stream());
        assert!(next_frame(&mut body).is_none());
        // Trailers alone: no empty data frame before them.
        let mut only = Body::replayed(Bytes::new(), trailers.clone());
        assert!(!only.is_end_stream());
        assert!(next_frame(&mut only).unwrap().is_trailers());
        assert!(only.is_end_stream());
    }

    #[test]
    fn a_replayed_body_with_trailers_claims_no_exact_size() {
        // An exact size becomes a Content-Length on HTTP/1, where trailers then have no
        // place to go (they need chunked encoding): the hint stays open. Without
        // trailers the size is exact.
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let body = Body::replayed(Bytes::from_static(b"data"), trailers);
        assert_eq!(body.size_hint().exact(), None);
        assert!(body.size_hint().lower() <= 4);
        let plain = Body::replayed(Bytes::from_static(b"data"), HeaderMap::new());
        assert_eq!(plain.size_hint().exact(), Some(4));
    }
}
