//! The layer's own answers: `application/problem+json` (RFC 9457).

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;

use crate::Body;

/// The base of every problem type the layer answers with (tag URIs, RFC 4151: stable
/// names that need no web page).
pub const PROBLEM_TYPE_BASE: &str = "tag:idem-http,2026:";

/// A response in `application/problem+json`: what the layer answers when it refuses a
/// request, and what a [`scope`](crate::IdempotencyLayer::new) function can answer with.
///
/// ```
/// use http::StatusCode;
/// use idem_http::Problem;
///
/// let response = Problem::new(StatusCode::UNAUTHORIZED, "not-signed-in", "Sign in first")
///     .detail("An idempotent request needs a signed-in account.")
///     .into_http_response();
/// assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// ```
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    #[serde(rename = "type")]
    kind: String,
    title: String,
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
    #[serde(skip)]
    retry_after: Option<u64>,
    /// An extension member: the key is held until its lease ends, and nothing runs
    /// under it meanwhile, so polling sooner than `Retry-After` is pointless.
    #[serde(skip_serializing_if = "Option::is_none")]
    held: Option<bool>,
}

impl Problem {
    /// A problem of type `tag:idem-http,2026:<slug>` with a short title.
    pub fn new(status: StatusCode, slug: &str, title: &str) -> Self {
        Self::typed(PROBLEM_TYPE_BASE, status, slug, title)
    }

    /// A problem of type `<base><slug>`.
    pub(crate) fn typed(base: &str, status: StatusCode, slug: &str, title: &str) -> Self {
        Self {
            kind: format!("{base}{slug}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail: None,
            retry_after: None,
            held: None,
        }
    }

    /// An explanation for this occurrence.
    #[must_use]
    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// A `Retry-After` header, in whole seconds.
    #[must_use]
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// Marks an in-flight problem as a key held until its lease ends (`"held": true`).
    pub(crate) fn held(mut self) -> Self {
        self.held = Some(true);
        self
    }

    /// The response.
    pub fn into_http_response(self) -> Response<Body> {
        self.into_bytes_response().map(full)
    }

    /// The response, its body as bytes. The problem itself rides in the response's
    /// extensions, so that a gRPC caller can be answered with a status instead.
    pub(crate) fn into_bytes_response(self) -> Response<Bytes> {
        // Only strings and a number: serialising cannot fail.
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = Response::new(Bytes::from(body));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response.extensions_mut().insert(self);
        response
    }

    /// A problem document read back (a stored answer replayed), with the
    /// `Retry-After` its response carried; `None` when it is not one.
    pub(crate) fn from_document(bytes: &[u8], retry_after: Option<u64>) -> Option<Self> {
        #[derive(serde::Deserialize)]
        struct Document {
            #[serde(rename = "type", default)]
            kind: Option<String>,
            #[serde(default)]
            title: Option<String>,
            status: Option<u16>,
            #[serde(default)]
            detail: Option<String>,
        }
        let document: Document = serde_json::from_slice(bytes).ok()?;
        Some(Self {
            kind: document.kind.unwrap_or_else(|| "about:blank".to_owned()),
            title: document.title.unwrap_or_default(),
            status: document.status?,
            detail: document.detail,
            retry_after,
            held: None,
        })
    }

    /// A problem known by its HTTP status alone (a document too large or unreadable).
    pub(crate) fn of_status(status: StatusCode, retry_after: Option<u64>) -> Self {
        Self {
            kind: "about:blank".to_owned(),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail: None,
            retry_after,
            held: None,
        }
    }

    /// The problem's type URI.
    pub(crate) fn kind(&self) -> &str {
        &self.kind
    }

    /// The problem's title and detail, as one line.
    pub(crate) fn message(&self) -> String {
        match &self.detail {
            Some(detail) => format!("{}: {detail}", self.title),
            None => self.title.clone(),
        }
    }

    /// The HTTP status.
    pub(crate) fn status(&self) -> u16 {
        self.status
    }

    /// The `Retry-After`, in seconds.
    pub(crate) fn retry_after_seconds(&self) -> Option<u64> {
        self.retry_after
    }
}

/// A whole body of bytes, as the layer's `Body`.
pub(crate) fn full(bytes: Bytes) -> Body {
    Body::from(bytes)
}

/// What a [scope function](crate::IdempotencyLayer::new) answers to refuse a request: the
/// response to send instead (boxed, so a `Result` carrying it stays small). Made from a
/// [`Problem`] or any response with `?` or `.into()`.
///
/// ```
/// use http::StatusCode;
/// use idem_http::{Problem, Refusal};
///
/// fn principal(authorization: Option<&str>) -> Result<String, Refusal> {
///     let token = authorization
///         .ok_or_else(|| Problem::new(StatusCode::UNAUTHORIZED, "not-signed-in", "Sign in first"))?;
///     Ok(token.to_owned())
/// }
/// assert!(principal(None).is_err());
/// ```
#[derive(Debug)]
pub struct Refusal(Box<Response<Body>>);

impl Refusal {
    /// The response to send.
    pub fn into_http_response(self) -> Response<Body> {
        *self.0
    }
}

impl From<Problem> for Refusal {
    fn from(problem: Problem) -> Self {
        Self(Box::new(problem.into_http_response()))
    }
}

impl From<Response<Body>> for Refusal {
    fn from(response: Response<Body>) -> Self {
        Self(Box::new(response))
    }
}
