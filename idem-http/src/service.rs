//! The service the layer builds: one request from its header to its answer.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context as TaskContext, Poll};

use bytes::{Bytes, BytesMut};
use http::response::Parts as ResponseParts;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Frame;
use idem_core::{BoxError, Context, Error, Fingerprint, Key, Outcome, WorkError};
use tokio::sync::{mpsc, oneshot};
use tower::{Service, ServiceExt};

use crate::Body;
use crate::answer::{answer, invalid_key, malformed_key, missing_key};
use crate::disposition::Disposition;
use crate::key_header::{self, KeyHeaderError};
use crate::layer::{Config, KeyRequirement};
use crate::observe::{self, Answer};
use crate::problem::full;
use crate::request_read::{RequestBody, read_body, read_grpc_body};
use crate::stored::StoredResponse;
use crate::streaming::{FRAMES_IN_FLIGHT, FrameSender, Frames, Streaming, Tail};

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

async fn handle<S, B, ResBody>(
    inner: S,
    config: Arc<Config>,
    routed: bool,
    request: Request<B>,
) -> Response<Body>
where
    S: Inner<ResBody>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: ResponseBody,
{
    // Only the protected path runs inline: every other one is boxed, so that this
    // future (allocated and copied for every request) holds none of their states.
    let (parts, body) = request.into_parts();
    let requirement = config.requirement(&parts, routed);
    let grpc = crate::grpc::has_grpc_framing(&parts.headers);
    let mut values = parts.headers.get_all(&config.header).iter();
    let (value, repeated) = (values.next(), values.next().is_some());
    let body = Body::new(body);
    let keyed_by_body = config.key_with.is_some();
    if requirement == KeyRequirement::Ignored
        || (!keyed_by_body && value.is_none() && requirement == KeyRequirement::Optional)
    {
        return Box::pin(pass(inner, &config, Request::from_parts(parts, body), None)).await;
    }
    // Keys taken from the body need it read first; header keys are checked before a byte
    // of it is read.
    let (client_key, body) = match &config.key_with {
        Some(key_with) => {
            let body = match read_request(&config, body, grpc).await {
                Ok(body) => body,
                Err(refused) => return Box::pin(refused.answer(inner, &config, parts)).await,
            };
            match key_with(&parts, &body) {
                Ok(Some(key)) => (key, Pending::Read(body)),
                Ok(None) if requirement == KeyRequirement::Optional => {
                    let request = Request::from_parts(parts, full(body));
                    return Box::pin(pass(inner, &config, request, None)).await;
                }
                Ok(None) => {
                    let (answer, response) = missing_key(&config);
                    return Box::pin(refuse(inner, &config, answer, response, parts, full(body)))
                        .await;
                }
                Err(refused) => {
                    let response = refused.into_http_response();
                    return Box::pin(refuse(
                        inner,
                        &config,
                        Answer::MalformedKey,
                        response,
                        parts,
                        full(body),
                    ))
                    .await;
                }
            }
        }
        None => {
            let client_key = match (value, repeated) {
                (None, _) => Err(missing_key(&config)),
                (Some(value), false) => {
                    // Only `Idempotency-Key` is a Structured Field; another header's value
                    // (a webhook id) is an opaque string.
                    let read = if config.header == crate::layer::DEFAULT_HEADER {
                        key_header::parse(value.as_bytes())
                    } else {
                        key_header::opaque(value.as_bytes())
                    };
                    read.map_err(|err| malformed_key(&config, &err))
                }
                (Some(_), true) => Err(malformed_key(&config, &KeyHeaderError::Repeated)),
            };
            match client_key {
                Ok(key) => (key, Pending::Unread(body)),
                Err((answer, response)) => {
                    return Box::pin(refuse(inner, &config, answer, response, parts, body)).await;
                }
            }
        }
    };
    let scope = match (config.scope)(&parts) {
        Ok(scope) => scope,
        Err(refused) => {
            let response = refused.into_http_response();
            let body = body.into_body();
            let refusal = refuse(inner, &config, Answer::ScopeRefused, response, parts, body);
            return Box::pin(refusal).await;
        }
    };
    let key = match Key::new(scope, client_key) {
        Ok(key) => key,
        Err(err) => {
            let (answer, response) = invalid_key(&config, &err);
            let refusal = refuse(inner, &config, answer, response, parts, body.into_body());
            return Box::pin(refusal).await;
        }
    };
    // Read the whole body before anything is claimed: a body over the limit, or a client
    // gone mid-upload, leaves no trace in the store.
    let body = match body {
        Pending::Read(body) => body,
        Pending::Unread(body) => match read_request(&config, body, grpc).await {
            Ok(body) => body,
            Err(refused) => return Box::pin(refused.answer(inner, &config, parts)).await,
        },
    };
    // A custom fingerprint gets the body as it came: nothing to decode for it.
    let content = match config.fingerprint.reads_content() {
        true => crate::request_body::content(&parts.headers, &body, config.max_request_body).await,
        false => crate::request_body::Content::Plain(body.clone()),
    };
    let fingerprint = config.fingerprint.fingerprint_of(&parts, &body, &content);
    drop(content);
    protect(inner, config, key, fingerprint, parts, body).await
}

/// The layer's refusal, or in shadow mode the handler's own answer, the refusal counted.
async fn refuse<S, ResBody>(
    inner: S,
    config: &Config,
    answer: Answer,
    response: Response<Body>,
    parts: http::request::Parts,
    body: Body,
) -> Response<Body>
where
    S: Inner<ResBody>,
    ResBody: ResponseBody,
{
    if config.shadow {
        observe::shadow(config, answer.name());
        tracing::info!(would = answer.name(), "shadow mode: passing the request on");
        let context = unprotected_context(config, &parts);
        return pass(
            inner,
            config,
            Request::from_parts(parts, body),
            Some(context),
        )
        .await;
    }
    observe::answer(config, answer);
    response
}

/// A request body, read or not yet.
enum Pending {
    Read(Bytes),
    Unread(Body),
}

impl Pending {
    fn into_body(self) -> Body {
        match self {
            Pending::Read(bytes) => full(bytes),
            Pending::Unread(body) => body,
        }
    }
}

/// A request body the layer could not read whole.
enum Unreadable {
    /// Over the limit: the body again, whole, for shadow mode to pass on.
    TooLarge(Body),
    Broken,
    /// A gRPC call streaming its request: the body again, whole, for shadow mode.
    Streaming(Body),
}

impl Unreadable {
    async fn answer<S, ResBody>(
        self,
        inner: S,
        config: &Config,
        parts: http::request::Parts,
    ) -> Response<Body>
    where
        S: Inner<ResBody>,
        ResBody: ResponseBody,
    {
        match self {
            Unreadable::TooLarge(whole) => {
                let response = config
                    .problem(StatusCode::PAYLOAD_TOO_LARGE, "request-too-large", "Request body too large")
                    .detail(format!(
                        "An idempotent request's body is read whole to fingerprint it; this one is over {} bytes.",
                        config.max_request_body
                    ))
                    .into_http_response();
                refuse(inner, config, Answer::TooLarge, response, parts, whole).await
            }
            Unreadable::Streaming(whole) => {
                let response = config
                    .problem(
                        StatusCode::NOT_IMPLEMENTED,
                        "streaming-request",
                        "Streaming requests are not protected",
                    )
                    .detail("The layer reads a protected request whole before it runs; a gRPC call that streams its request (client streaming or bidirectional) cannot be. Exempt the method from the layer (requirement_with, or a route without it).")
                    .into_http_response();
                refuse(inner, config, Answer::BadBody, response, parts, whole).await
            }
            Unreadable::Broken => {
                // Nothing of the body can reach the handler either, shadow mode or not.
                observe::answer(config, Answer::BadBody);
                config
                    .problem(
                        StatusCode::BAD_REQUEST,
                        "unreadable-body",
                        "The request body could not be read",
                    )
                    .into_http_response()
            }
        }
    }
}

async fn read_request(config: &Config, body: Body, grpc: bool) -> Result<Bytes, Unreadable> {
    let read = match grpc {
        true => read_grpc_body(body, config.max_request_body).await,
        false => read_body(body, config.max_request_body).await,
    };
    match read {
        RequestBody::Whole(body) => Ok(body),
        RequestBody::TooLarge(whole) => Err(Unreadable::TooLarge(whole)),
        RequestBody::Broken => Err(Unreadable::Broken),
        RequestBody::Streaming(whole) => Err(Unreadable::Streaming(whole)),
    }
}

/// A context for a request shadow mode passes on without a claim, so that a handler
/// that reads one works as it would when protected.
fn unprotected_context(config: &Config, parts: &http::request::Parts) -> Context {
    let key = Key::new(
        format!("{} {}", parts.method, crate::scope::path(parts)),
        "-",
    )
    .or_else(|_| Key::new("-", "-"))
    .expect("a short key of printable characters is valid");
    config
        .idem
        .detached_context(&key, Fingerprint::of_bytes(b""))
}

/// A request the layer does not protect, handed on as it is (to the service that was
/// driven ready).
async fn pass<S, ResBody>(
    mut inner: S,
    config: &Config,
    mut request: Request<Body>,
    context: Option<Context>,
) -> Response<Body>
where
    S: Inner<ResBody>,
    ResBody: ResponseBody,
{
    observe::answer(config, Answer::PassedThrough);
    if let Some(context) = context {
        request.extensions_mut().insert(context);
    }
    match inner.call(request).await.map_err(Into::into) {
        Ok(response) => response.map(Body::new),
        Err(err) if not_run(&err) => overloaded(config, false),
        Err(err) => {
            tracing::warn!(error = %err, "the inner service failed");
            handler_failed(config)
        }
    }
}

fn handler_failed(config: &Config) -> Response<Body> {
    handler_failed_problem(config).into_http_response()
}

fn handler_failed_problem(config: &Config) -> crate::Problem {
    config.problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "handler-failed",
        "The handler failed",
    )
}

/// The most frames read from a handler's body while they are ready before its head is
/// sent: a body that is always ready is streamed, not buffered forever.
const MAX_READY_FRAMES: usize = 1024;

/// The driver's answer, in the work's future.
type Executed = Result<Outcome<Vec<u8>, Vec<u8>>, Error>;

/// The handler's whole response, when it was complete before anything was sent.
type Captured = Arc<Mutex<Option<Response<Body>>>>;

/// The rest of a body too large to store, to stream on after the record is finished.
type Pump<ResBody> = Arc<Mutex<Option<(Rest<ResBody>, FrameSender)>>>;

/// What reaches a client still reading after its key was finished.
enum Rest<ResBody> {
    /// The rest of a body too large to store.
    Body(Pin<Box<ResBody>>),
    /// The error a body broke off with: sent once its key is finished, so that a retry
    /// the cut prompts finds the record.
    Error(BoxError),
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs a protected request: claims its key and runs the handler inline, streaming its
/// response as it comes. The handler runs in a task of its own only when the client goes
/// away first, so that it finishes and stores its response for the client's retry.
async fn protect<S, ResBody>(
    inner: S,
    config: Arc<Config>,
    key: Key,
    fingerprint: Fingerprint,
    head: http::request::Parts,
    body: Bytes,
) -> Response<Body>
where
    S: Inner<ResBody>,
    ResBody: ResponseBody,
{
    // Only shadow mode needs the request again, to hand it to the handler.
    let shadow = config
        .shadow
        .then(|| (inner.clone(), head.clone(), body.clone(), key.clone()));
    let request = Request::from_parts(head, full(body));
    let (head_tx, mut head_rx) = oneshot::channel::<(ResponseParts, Frames)>();
    let captured: Captured = Arc::default();
    let pump: Pump<ResBody> = Arc::default();
    let mut work: Option<Pin<Box<dyn Future<Output = Executed> + Send>>> = Some(Box::pin({
        let (config, captured, pump, key) = (
            Arc::clone(&config),
            Arc::clone(&captured),
            Arc::clone(&pump),
            key.clone(),
        );
        async move {
            let run = |ctx| {
                // Claimed here: whatever this layer held the key with has ended.
                config.held.forget(&key);
                handler_outcome(
                    inner,
                    request,
                    ctx,
                    Arc::clone(&config),
                    head_tx,
                    captured,
                    pump,
                )
            };
            config.idem.execute_bytes(&key, fingerprint, run).await
        }
    }));
    // Dropped before the work ends (the client went away): the work finishes elsewhere.
    struct Unfinished<'a, ResBody: ResponseBody> {
        work: &'a mut Option<Pin<Box<dyn Future<Output = Executed> + Send>>>,
        pump: &'a Pump<ResBody>,
        config: &'a Arc<Config>,
        key: &'a Key,
    }
    impl<ResBody: ResponseBody> Drop for Unfinished<'_, ResBody> {
        fn drop(&mut self) {
            // Also while another future of the same task unwinds (a panic beside this
            // request in a `join!`): this work is sound, and finishes elsewhere.
            if let Some(work) = self.work.take() {
                let tail = tail(
                    work,
                    Arc::clone(self.pump),
                    Arc::clone(self.config),
                    self.key.clone(),
                );
                self.config.handlers.detach_orphan(tail);
            }
        }
    }
    let guard = Unfinished {
        work: &mut work,
        pump: &pump,
        config: &config,
        key: &key,
    };
    let mut head_open = true;
    let first = poll_fn(|cx| {
        if head_open {
            match Pin::new(&mut head_rx).poll(cx) {
                Poll::Ready(Ok(head)) => return Poll::Ready(First::Head(head)),
                // A whole response, or none: the work's end says which.
                Poll::Ready(Err(_)) => head_open = false,
                Poll::Pending => {}
            }
        }
        let Some(work) = guard.work.as_mut() else {
            return Poll::Pending;
        };
        match std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx))) {
            Ok(polled) => polled.map(First::Done),
            // The driver or the store panicked: that future cannot go on, so it is not
            // finished elsewhere; its key is held until the lease ends.
            Err(_) => {
                *guard.work = None;
                Poll::Ready(First::Panicked)
            }
        }
    })
    .await;
    let running = guard.work.take();
    drop(guard);
    let (head, tail) = match first {
        First::Panicked => {
            tracing::error!("the idempotency driver panicked");
            observe::answer(&config, Answer::Error);
            return handler_failed(&config);
        }
        First::Head(head) => {
            let running = running.expect("the work runs until it answers");
            (head, tail(running, pump, Arc::clone(&config), key))
        }
        First::Done(result) => match head_rx.try_recv() {
            // The handler's response began and its work ended in the same poll.
            Ok(head) => (
                head,
                Box::pin(tail_of(result, pump, config.clone(), key)) as Tail,
            ),
            Err(_) => {
                let first = || lock(&captured).take();
                let Some(shadow) = shadow else {
                    let held_here = match &result {
                        Err(Error::InFlight { retry_after }) => {
                            config.held.holds(&key, *retry_after)
                        }
                        _ => false,
                    };
                    let (answer, response) = answer(result, first, &config, held_here);
                    remember(&config, &key, answer);
                    observe::answer(&config, answer);
                    return response;
                };
                // Boxed: shadow mode may call the handler again, whose future is not
                // part of this one.
                return Box::pin(shadow_answer(result, &captured, &config, shadow)).await;
            }
        },
    };
    let (parts, frames) = head;
    // The rest runs in a task of its own: the server polls a body only as fast as it can
    // send it, and the work's heartbeat must not wait for a slow client.
    config.handlers.detach(tail);
    Response::from_parts(parts, Body::new(Streaming::new(frames)))
}

enum First {
    Head((ResponseParts, Frames)),
    Done(Executed),
    Panicked,
}

/// What the client gets in shadow mode when the work ended before any response
/// streamed: the handler's whole response, or the handler's answer to the request
/// passed on again.
async fn shadow_answer<S, ResBody>(
    result: Executed,
    captured: &Captured,
    config: &Arc<Config>,
    (inner, head, body, key): (S, http::request::Parts, Bytes, Key),
) -> Response<Body>
where
    S: Inner<ResBody>,
    ResBody: ResponseBody,
{
    let first = || lock(captured).take();
    // Shadow mode: the handler's answer, always; what the layer would have said is
    // counted when it is not the handler's.
    if let Some(response) = first() {
        observe::answer(config, Answer::PassedThrough);
        return response;
    }
    let (would, _) = answer(result, || None, config, false);
    observe::shadow(config, would.name());
    tracing::info!(would = would.name(), "shadow mode: passing the request on");
    let fingerprint = Fingerprint::of_bytes(crate::scope::path(&head).as_bytes());
    let mut request = Request::from_parts(head, full(body));
    request
        .extensions_mut()
        .insert(config.idem.detached_context(&key, fingerprint));
    observe::answer(config, Answer::PassedThrough);
    match inner.oneshot(request).await.map_err(Into::into) {
        Ok(response) => response.map(Body::new),
        Err(err) => {
            tracing::warn!(error = %err, "the inner service failed");
            handler_failed(config)
        }
    }
}

/// The rest of the work after the response began: its end, a too-large body's rest,
/// and the count.
fn tail<ResBody: ResponseBody>(
    work: Pin<Box<dyn Future<Output = Executed> + Send>>,
    pump: Pump<ResBody>,
    config: Arc<Config>,
    key: Key,
) -> Tail {
    Box::pin(async move {
        let result = work.await;
        tail_of(result, pump, config, key).await;
    })
}

async fn tail_of<ResBody: ResponseBody>(
    result: Executed,
    pump: Pump<ResBody>,
    config: Arc<Config>,
    key: Key,
) {
    let rest = lock(&pump).take();
    match rest {
        Some((Rest::Body(body), frames)) => stream_rest(body, frames).await,
        Some((Rest::Error(err), frames)) => {
            let _ = frames.send(Err(err)).await;
        }
        None => {}
    }
    let answer = streamed_answer(&result);
    remember(&config, &key, answer);
    observe::answer(&config, answer);
}

/// Keeps in mind a key this layer holds after answering its request, so that a retry
/// here is told when the lease ends; any other end forgets it.
fn remember(config: &Config, key: &Key, answer: Answer) {
    // Shadow mode never answers for a held key: nothing to remember.
    if config.shadow {
        return;
    }
    match answer {
        Answer::Held => config.held.hold(key, config.idem.lease()),
        // Still held (or running): what was known stays so.
        Answer::InFlight => {}
        _ => config.held.forget(key),
    }
}

/// What a request whose response went out as the handler gave it counts as.
fn streamed_answer(result: &Executed) -> Answer {
    match result {
        Ok(Outcome::Completed { .. }) => Answer::Executed,
        Ok(Outcome::Retryable(_)) => Answer::Released,
        Ok(Outcome::Unknown(_)) => Answer::Held,
        Ok(_) => Answer::Error,
        Err(Error::Store(err)) => {
            tracing::warn!(error = %err, "a response was sent but could not be stored");
            Answer::Held
        }
        Err(Error::LeaseLost) => {
            tracing::warn!("a response was sent, but another attempt took its key over");
            Answer::LeaseLost
        }
        Err(err) => {
            tracing::warn!(error = %err, "a response was sent, but its key failed");
            Answer::Error
        }
    }
}

/// Sends the rest of a body to the client, after its record was finished without it.
async fn stream_rest<ResBody: ResponseBody>(mut body: Pin<Box<ResBody>>, frames: FrameSender) {
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

/// A response's body as read so far: what the client gets, and what may be stored.
struct Read {
    frames: Vec<Frame<Bytes>>,
    /// Bytes of data read.
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
            return Bytes::new();
        };
        let Some(second) = chunks.next() else {
            return first.clone();
        };
        let mut all = BytesMut::with_capacity(self.size);
        all.extend_from_slice(first);
        all.extend_from_slice(second);
        chunks.for_each(|chunk| all.extend_from_slice(chunk));
        all.freeze()
    }
}

/// Runs the handler for the driver: streams its response to the client as it comes and
/// decides what is stored.
async fn handler_outcome<S, ResBody>(
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
    let mut read = Read {
        frames: Vec::new(),
        size: 0,
        trailers: HeaderMap::new(),
    };
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
            Disposition::Store => Ok(stored(status, headers.clone(), read, whole, &ctx, room)),
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
    let mut kept = Read {
        frames: Vec::new(),
        size: 0,
        trailers: HeaderMap::new(),
    };
    let mut over = false;
    for frame in read.frames {
        over |= keep(&mut kept, &frame, storing, room);
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
            // rest streams on after it to a client still reading. (A gRPC answer waits
            // for the status in its trailers, and is stored without its body then.)
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
                over |= keep(&mut kept, &frame, storing, room);
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

/// Keeps a copy of `frame` for the record while it fits; true once it no longer does.
fn keep(kept: &mut Read, frame: &Frame<Bytes>, storing: bool, room: usize) -> bool {
    if !storing {
        return false;
    }
    if let Some(data) = frame.data_ref() {
        if kept.size.saturating_add(data.len()) > room {
            kept.frames.clear();
            return true;
        }
        kept.push(Frame::data(data.clone()));
    } else if let Some(trailers) = frame.trailers_ref() {
        kept.trailers.extend(trailers.clone());
    }
    false
}

/// The stored form of a response: whole when it fits the record, else its status and
/// headers only.
fn stored(
    status: StatusCode,
    headers: HeaderMap,
    read: &Read,
    whole: bool,
    ctx: &Context,
    room: usize,
) -> Vec<u8> {
    let trailers: HeaderMap = read
        .trailers
        .iter()
        .filter(|(name, _)| !crate::layer::is_hop_by_hop(name))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    if !whole || read.size > room {
        return StoredResponse::without_body(status, headers)
            .with_trailers(trailers)
            .encode();
    }
    let response = StoredResponse::new(status, headers, read.data()).with_trailers(trailers);
    let bytes = response.encode();
    if !ctx.fits_response(&bytes) {
        return StoredResponse::without_body(status, response.headers)
            .with_trailers(response.trailers)
            .encode();
    }
    bytes
}

/// Whether an inner service's error says the request never reached the handler: tower's
/// `LoadShed` refused it (its inner service was not ready), so nothing ran.
fn not_run(err: &BoxError) -> bool {
    err.is::<tower::load_shed::error::Overloaded>()
}

/// A request shed before the handler ran: the key is released at once, and the client
/// gets 503 with `Retry-After`, to retry with the same key.
fn shed(config: &Config, captured: &Captured) -> Result<Vec<u8>, WorkError<Vec<u8>>> {
    tracing::debug!("the inner service shed the request; its key is released");
    *lock(captured) = Some(overloaded(config, true));
    Err(WorkError::Retryable(Vec::new()))
}

/// 503 for a request shed before it ran; `keyed` when it had a key to retry with.
fn overloaded(config: &Config, keyed: bool) -> Response<Body> {
    let detail = match keyed {
        true => {
            "The request was shed before it ran; nothing was done. Retry with the same key after the time in Retry-After."
        }
        false => {
            "The request was shed before it ran; nothing was done. Retry after the time in Retry-After."
        }
    };
    config
        .problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "The service is overloaded",
        )
        .detail(detail)
        .retry_after(1)
        .into_http_response()
}

/// The handler failed (an error from the inner service, a panic, or a body that broke
/// off before anything was sent): its effect may have happened, so the key is held, and
/// the client gets 500.
fn failed(
    err: &BoxError,
    config: &Config,
    captured: &Captured,
) -> Result<Vec<u8>, WorkError<Vec<u8>>> {
    tracing::warn!(error = %err, "the inner service failed");
    *lock(captured) = Some(handler_failed(config));
    Err(WorkError::Unknown(Vec::new()))
}
