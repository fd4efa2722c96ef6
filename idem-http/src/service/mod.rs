//! The service the layer builds: one request from its header to its answer.

mod failures;
mod handler_response;
mod protected;
mod request;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use bytes::Bytes;
use http::{Request, Response};
use idem_core::BoxError;
use tower::Service;

use crate::Body;
use crate::layer::Config;
use crate::observe::{self, Answer};

use failures::handler_failed;
use request::handle;

/// The header a replayed response carries, with the value `true`.
///
/// ```
/// // A client tells a replay from a first answer by this header.
/// assert_eq!(idem_http::REPLAYED_HEADER, "idempotent-replayed");
/// ```
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The header a replay carries, with the value `true`, when the first response's body was
/// too large to store: the status and stored headers are the first response's, the body
/// is empty.
///
/// ```
/// assert_eq!(idem_http::BODY_NOT_STORED_HEADER, "idempotent-body-not-stored");
/// ```
pub const BODY_NOT_STORED_HEADER: &str = "idempotent-body-not-stored";

/// The service [`IdempotencyLayer`](crate::IdempotencyLayer) wraps around `S`: any tower
/// service of HTTP requests, an axum router or a hyper service.
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response};
/// use idem_core::{Idempotency, MemoryStore};
/// use idem_http::{Body, IdempotencyLayer};
/// use tower::{Layer, ServiceExt, service_fn};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let handler = service_fn(|_request: Request<Body>| async {
///     Ok::<_, Infallible>(Response::new(Body::from(bytes::Bytes::from_static(b"done"))))
/// });
/// let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| Ok(idem_http::scope::path(parts).to_owned()));
/// let service = layer.layer(handler);
/// let request = Request::post("/jobs").header("idempotency-key", "job-7").body(Body::empty()).unwrap();
/// let response = service.oneshot(request).await.unwrap();
/// assert_eq!(response.status(), 200);
/// # });
/// ```
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
    /// The inner service failed its readiness: the next request is answered 500.
    broken: Option<Arc<BoxError>>,
    /// The inner service is one of axum's routes (see `leave_unmatched_routes`).
    routed: bool,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, config: Arc<Config>, routed: bool) -> Self {
        Self {
            inner,
            config,
            broken: None,
            routed,
        }
    }
}

impl<S> std::fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("idem", &self.config.idem)
            .finish_non_exhaustive()
    }
}

type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl<S, B, ResBody> Service<Request<B>> for IdempotencyService<S>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    /// Ready when the inner service is: its backpressure reaches the server. An inner
    /// service that fails its readiness gets the next request answered 500.
    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        match self.inner.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) => Poll::Ready(Ok(())),
            Poll::Ready(Err(err)) => {
                self.broken = Some(Arc::new(err.into()));
                Poll::Ready(Ok(()))
            }
        }
    }

    fn call(&mut self, request: Request<B>) -> ResponseFuture {
        let config = Arc::clone(&self.config);
        let grpc = crate::grpc::is_grpc(request.headers())
            .then(|| request.headers().get(http::header::CONTENT_TYPE).cloned());
        if let Some(err) = self.broken.take() {
            return Box::pin(async move {
                tracing::warn!(error = %err, "the inner service is not ready");
                observe::answer(&config, Answer::Error);
                let response = handler_failed(&config);
                Ok(match grpc {
                    Some(content_type) => {
                        crate::grpc::refusal_as_status(response, content_type).await
                    }
                    None => response,
                })
            });
        }
        // The clone that was driven ready is the one to call (tower's convention).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let routed = self.routed;
        // A gRPC caller reads the layer's refusals as gRPC statuses, not problem
        // documents it would take for a malformed message.
        if let Some(content_type) = grpc {
            return Box::pin(async move {
                let response = handle(inner, Arc::clone(&config), routed, request).await;
                Ok(crate::grpc::refusal_as_status(response, content_type).await)
            });
        }
        Box::pin(async move { Ok(handle(inner, config, routed, request).await) })
    }
}

/// The bounds every function here shares.
trait Inner<ResBody>:
    Service<
        Request<Body>,
        Response = Response<ResBody>,
        Future: Send + 'static,
        Error: Into<BoxError>,
    > + Clone
    + Send
    + 'static
{
}

impl<S, ResBody> Inner<ResBody> for S where
    S: Service<
            Request<Body>,
            Response = Response<ResBody>,
            Future: Send + 'static,
            Error: Into<BoxError>,
        > + Clone
        + Send
        + 'static
{
}

/// The bounds of the handler's response body.
trait ResponseBody: http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static {}

impl<T> ResponseBody for T where
    T: http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static
{
}

#[cfg(test)]
mod tests {
    use idem_core::{Idempotency, MemoryStore};

    use crate::IdempotencyLayer;

    #[test]
    fn the_service_shows_its_settings() {
        let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| {
            Ok(crate::scope::path(parts).to_owned())
        });
        let service = tower::Layer::layer(
            &layer,
            tower::service_fn(|()| async { Ok::<_, std::convert::Infallible>(()) }),
        );
        let shown = format!("{service:?}");
        assert!(shown.starts_with("IdempotencyService { idem: "), "{shown}");
    }
}
