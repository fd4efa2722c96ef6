//! The service the layer builds: one request from its header to its answer.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context as TaskContext, Poll};

use bytes::Bytes;
use http::response::Parts as ResponseParts;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use idem_core::{BoxError, Fingerprint, Idempotency, Key, WorkError};
use tower::{Service, ServiceExt};

use crate::Body;
use crate::answer::{answer, invalid_key, malformed_key, missing_key};
use crate::disposition::Disposition;
use crate::key_header::{self, KeyHeaderError};
use crate::layer::{Config, KeyRequirement};
use crate::observe::{self, Answer};
use crate::problem::{Problem, full};
use crate::stored::StoredResponse;

/// The header a replayed response carries, with the value `true`.
///
/// ```
/// // A client tells a replay from a first answer by this header.
/// assert_eq!(idem_http::REPLAYED_HEADER, "idempotent-replayed");
/// ```
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

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
/// let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| Ok(parts.uri.path().to_owned()));
/// let service = layer.layer(handler);
/// let request = Request::post("/jobs").header("idempotency-key", "job-7").body(Body::empty()).unwrap();
/// let response = service.oneshot(request).await.unwrap();
/// assert_eq!(response.status(), 200);
/// # });
/// ```
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    idem: Idempotency,
    config: Arc<Config>,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, idem: Idempotency, config: Arc<Config>) -> Self {
        Self {
            inner,
            idem,
            config,
        }
    }
}

impl<S> std::fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("idem", &self.idem)
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

    /// Always ready: the inner service's readiness is awaited for each request, in the
    /// task that runs it.
    fn poll_ready(&mut self, _cx: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> ResponseFuture {
        // The clone that was driven ready is the one to call (tower's convention).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let (idem, config) = (self.idem.clone(), Arc::clone(&self.config));
        Box::pin(async move { Ok(handle(inner, idem, config, request).await) })
    }
}

/// A request on its way to the inner service, its body already read.
struct Protected<S> {
    inner: S,
    idem: Idempotency,
    config: Arc<Config>,
    key: Key,
    fingerprint: Fingerprint,
    head: http::request::Parts,
    body: Bytes,
}

async fn handle<S, B, ResBody>(
    inner: S,
    idem: Idempotency,
    config: Arc<Config>,
    request: Request<B>,
) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let requirement = config.requirement(request.method());
    let values: Vec<HeaderValue> = request
        .headers()
        .get_all(&config.header)
        .iter()
        .cloned()
        .collect();
    if requirement == KeyRequirement::Ignored
        || (values.is_empty() && requirement == KeyRequirement::Optional)
    {
        return pass(inner, request).await;
    }
    let refusal = match values.as_slice() {
        [] => Err(missing_key(&config)),
        [value] => key_header::parse(value.as_bytes()).map_err(|err| malformed_key(&config, &err)),
        _ => Err(malformed_key(&config, &KeyHeaderError::Repeated)),
    };
    let client_key = match refusal {
        Ok(key) => key,
        Err((answer, response)) => {
            if config.shadow {
                observe::shadow(answer.name());
                tracing::info!(would = answer.name(), "shadow mode: passing the request on");
                return pass(inner, request).await;
            }
            observe::answer(answer);
            return response;
        }
    };
    let (parts, body) = request.into_parts();
    let scope = match (config.scope)(&parts) {
        Ok(scope) => scope,
        Err(refused) => {
            observe::answer(Answer::ScopeRefused);
            return refused.into_response();
        }
    };
    let key = match Key::new(scope, client_key) {
        Ok(key) => key,
        Err(err) => return invalid_key(&config, &err),
    };
    // Read the whole body before anything is claimed: a body over the limit, or a client
    // gone mid-upload, leaves no trace in the store.
    let body = match Limited::new(body, config.max_request_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => {
            observe::answer(Answer::TooLarge);
            return Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "request-too-large", "Request body too large")
                .detail(format!(
                    "An idempotent request's body is read whole to fingerprint it; this one is over {} bytes.",
                    config.max_request_body
                ))
                .into_response();
        }
        Err(_) => {
            observe::answer(Answer::BadBody);
            return Problem::new(
                StatusCode::BAD_REQUEST,
                "unreadable-body",
                "The request body could not be read",
            )
            .into_response();
        }
    };
    let fingerprint = config.fingerprint.fingerprint(&parts, &body);
    let protected = Protected {
        inner,
        idem,
        config,
        key,
        fingerprint,
        head: parts,
        body,
    };
    protected.run().await
}

/// A request the layer does not protect, handed on as it is.
async fn pass<S, B, ResBody>(inner: S, request: Request<B>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    observe::answer(Answer::PassedThrough);
    call_inner(inner, request.map(box_body)).await
}

fn box_body<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    Body::new(body)
}

async fn call_inner<S, ResBody>(inner: S, request: Request<Body>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    match inner.oneshot(request).await.map_err(Into::into) {
        Ok(response) => response.map(box_body),
        Err(err) => handler_error(&err),
    }
}

fn handler_error(err: &BoxError) -> Response<Body> {
    tracing::warn!(error = %err, "the inner service failed");
    handler_failed()
}

fn handler_failed() -> Response<Body> {
    handler_failed_problem().into_response()
}

fn handler_failed_problem() -> Problem {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "handler-failed",
        "The handler failed",
    )
}

/// The handler's response, read whole: what the first client gets.
type Captured = Arc<Mutex<Option<(ResponseParts, Bytes)>>>;

impl<S, ResBody> Protected<S>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    async fn run(self) -> Response<Body> {
        let Protected {
            inner,
            idem,
            config,
            key,
            fingerprint,
            head,
            body,
        } = self;
        let request = Request::from_parts(head.clone(), full(body.clone()));
        let captured: Captured = Arc::default();
        let task = {
            let (inner, config, captured) =
                (inner.clone(), Arc::clone(&config), Arc::clone(&captured));
            // The handler runs in a task of its own: a client that disconnects, or a
            // timeout layer above, drops this future but not the work, whose response is
            // then stored for the client's retry.
            tokio::spawn(async move {
                idem.execute_bytes(&key, fingerprint, |ctx| {
                    handler_outcome(inner, request, ctx, config, captured)
                })
                .await
            })
        };
        let Ok(result) = task.await else {
            // The handler panicked: the key stays held until its lease ends.
            observe::answer(Answer::Error);
            return handler_failed();
        };
        let (answer, response) = answer(result, || take(&captured), &config);
        if config.shadow && answer.answered_by_the_store() {
            // Shadow mode: count what would have been answered, answer as the handler does.
            observe::shadow(answer.name());
            tracing::info!(would = answer.name(), "shadow mode: passing the request on");
            observe::answer(Answer::PassedThrough);
            return call_inner(inner, Request::from_parts(head, full(body))).await;
        }
        observe::answer(answer);
        response
    }
}

/// Runs the handler for the driver and decides what is stored.
async fn handler_outcome<S, ResBody>(
    inner: S,
    mut request: Request<Body>,
    ctx: idem_core::Context,
    config: Arc<Config>,
    captured: Captured,
) -> Result<Vec<u8>, WorkError<Vec<u8>>>
where
    S: Service<Request<Body>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    // Handlers reach steps, derived keys and the fencing token through the context.
    request.extensions_mut().insert(ctx);
    let (parts, body, disposition) = match inner.oneshot(request).await.map_err(Into::into) {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            match body.collect().await {
                Ok(collected) => {
                    let disposition = parts
                        .extensions
                        .get::<Disposition>()
                        .copied()
                        .unwrap_or_else(|| (config.disposition)(parts.status));
                    (parts, collected.to_bytes(), disposition)
                }
                // The body broke off: whatever the handler did may have happened.
                Err(err) => failed(&err.into()),
            }
        }
        Err(err) => failed(&err),
    };
    let stored = || {
        let headers: HeaderMap = parts
            .headers
            .iter()
            .filter(|(name, _)| config.stores_header(name))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        if body.len() > config.max_response_body {
            StoredResponse::without_body(parts.status, headers)
        } else {
            StoredResponse::new(parts.status, headers, body.clone())
        }
        .encode()
    };
    let outcome = match disposition {
        Disposition::Store => Ok(stored()),
        Disposition::Release => Err(WorkError::Retryable(Vec::new())),
        Disposition::Hold => Err(WorkError::Unknown(Vec::new())),
    };
    *captured.lock().unwrap_or_else(PoisonError::into_inner) = Some((parts, body));
    outcome
}

/// The handler failed (an error from the inner service, or a body that broke off): its
/// effect may have happened, so the key is held.
fn failed(err: &BoxError) -> (ResponseParts, Bytes, Disposition) {
    tracing::warn!(error = %err, "the inner service failed");
    let (parts, body) = handler_failed_problem().into_bytes_response().into_parts();
    (parts, body, Disposition::Hold)
}

fn take(captured: &Captured) -> Option<Response<Body>> {
    let (parts, body) = captured
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()?;
    Some(Response::from_parts(parts, full(body)))
}
