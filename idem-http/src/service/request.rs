//! A request up to its claim: its key, scope and body read, or the request refused or
//! passed on untouched.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use idem_core::{BoxError, Context, Fingerprint, Key};

use super::failures::{handler_failed, not_run, overloaded};
use super::protected::protect;
use super::{Inner, ResponseBody};
use crate::Body;
use crate::answer::{invalid_key, malformed_key, missing_key};
use crate::key_header::{self, KeyHeaderError};
use crate::layer::{Config, KeyRequirement};
use crate::observe::{self, Answer};
use crate::problem::full;
use crate::request_read::{RequestBody, read_body, read_grpc_body};

pub(super) async fn handle<S, B, ResBody>(
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
