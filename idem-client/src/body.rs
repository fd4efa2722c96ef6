//! Bodies: a request's stream buffered so that a retry can send it again, and a response
//! rebuilt around the bytes already read from it.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use reqwest::Request;

use crate::error::ClientError;

/// Makes `request`'s body one that can be sent again: a stream body (a `multipart::Form`,
/// `Body::wrap_stream`) is read whole, at most `limit` bytes, before anything is sent.
/// A body that can already be cloned, or none, is left as it is.
pub(crate) async fn make_replayable(
    request: &mut Request,
    limit: usize,
) -> Result<(), ClientError> {
    if request.try_clone().is_some() {
        return Ok(());
    }
    if limit == 0 {
        return Err(ClientError::BodyNotReplayable);
    }
    let Some(body) = request.body_mut().take() else {
        return Ok(());
    };
    let collected = http_body_util::Limited::new(body, limit)
        .collect()
        .await
        .map_err(|err| {
            if err.is::<http_body_util::LengthLimitError>() {
                ClientError::BodyTooLarge { limit }
            } else {
                ClientError::BodyFailed(err)
            }
        })?;
    *request.body_mut() = Some(reqwest::Body::from(collected.to_bytes()));
    Ok(())
}

/// A response body that yields `prefix` (the bytes already read from it), then the rest
/// of `rest`.
pub(crate) struct Prefixed<B> {
    prefix: Option<Bytes>,
    rest: B,
}

impl<B> Prefixed<B> {
    pub(crate) fn new(prefix: Bytes, rest: B) -> Self {
        Self {
            prefix: (!prefix.is_empty()).then_some(prefix),
            rest,
        }
    }
}

impl<B> Body for Prefixed<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let before = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(before));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(before));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    #[tokio::test]
    async fn the_prefix_comes_first_and_the_hints_count_it() {
        let body = Prefixed::new(
            Bytes::from_static(b"head-"),
            Full::new(Bytes::from_static(b"rest")),
        );
        assert!(!body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(9));
        assert_eq!(body.collect().await.unwrap().to_bytes(), &b"head-rest"[..]);
        // An empty prefix yields nothing of its own.
        let bare = Prefixed::new(Bytes::new(), Full::new(Bytes::new()));
        assert!(bare.is_end_stream());
        assert_eq!(bare.size_hint().exact(), Some(0));
    }
}
