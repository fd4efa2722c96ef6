//! Method and path overrides on protected routes: what in a request names another
//! method or path than the one its route matched, which the upstream would act on under
//! this route's key and scope. Such requests are refused (400 `method-override`).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{Request, Response, StatusCode, header};
use http_body::Frame;
use http_body_util::BodyExt;
use idem_core::BoxError;
use idem_http::{Body, Problem};

/// `request` as it came (its body read ahead only where it is a form), or the refusal
/// when it names another method or path. `limit` is the route's `max_request_body`: a
/// form body longer than it is not read through (the layer refuses it as too large).
pub(crate) async fn check(
    request: Request<Body>,
    headers_reach: bool,
    limit: usize,
) -> Result<Request<Body>, Response<Body>> {
    if let Some(named) = overridden(&request, headers_reach) {
        return Err(refuse_override(named));
    }
    if request.method().is_safe() || !is_form(&request) {
        return Ok(request);
    }
    // Rails, Laravel and Symfony read `_method` from a form's body too.
    let (parts, body) = request.into_parts();
    let (read, whole) = read_ahead(body, limit).await;
    if let Some(form) = whole
        && form
            .split(|byte| *byte == b'&')
            .filter_map(|pair| pair.split(|byte| *byte == b'=').next())
            .any(|name| names_method(&String::from_utf8_lossy(name)))
    {
        return Err(refuse_override("_method"));
    }
    Ok(Request::from_parts(parts, read))
}

fn is_form(request: &Request<Body>) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| {
            essence
                .trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
}

/// Whether a form or query name (still percent-encoded) is `_method` as PHP reads names:
/// `+` is a space, leading spaces go, and ` `, `.` and `[` become `_` (`_method`,
/// `+_method`, `.method`, `[method` are one).
fn names_method(encoded: &str) -> bool {
    let encoded = encoded.replace('+', " ");
    let name = percent_encoding::percent_decode_str(&encoded).decode_utf8_lossy();
    let name: String = name
        .trim_start_matches(' ')
        .chars()
        .map(|c| if matches!(c, ' ' | '.' | '[') { '_' } else { c })
        .collect();
    name.eq_ignore_ascii_case("_method")
}

/// Reads `body` until its end, past `limit` bytes, or an error: the body again, whole
/// (what was read, then the rest, an error where it broke off), and its bytes when it
/// ended within `limit`.
async fn read_ahead(mut body: Body, limit: usize) -> (Body, Option<Bytes>) {
    let mut frames = VecDeque::new();
    let mut data = BytesMut::new();
    loop {
        match body.frame().await {
            None => {
                let whole = data.freeze();
                return (Body::new(Replayed { frames, rest: None }), Some(whole));
            }
            Some(Ok(frame)) => {
                if let Some(bytes) = frame.data_ref() {
                    data.extend_from_slice(bytes);
                }
                frames.push_back(Ok(frame));
                if data.len() > limit {
                    let rest = Some(body);
                    return (Body::new(Replayed { frames, rest }), None);
                }
            }
            Some(Err(err)) => {
                frames.push_back(Err(err));
                return (Body::new(Replayed { frames, rest: None }), None);
            }
        }
    }
}

/// Frames read ahead, then the rest of the body they came from.
struct Replayed {
    frames: VecDeque<Result<Frame<Bytes>, BoxError>>,
    rest: Option<Body>,
}

impl http_body::Body for Replayed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(frame) = self.frames.pop_front() {
            return Poll::Ready(Some(frame));
        }
        match self.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
            && self
                .rest
                .as_ref()
                .is_none_or(http_body::Body::is_end_stream)
    }
}

/// Headers by which a request names another method than its own, which frameworks
/// upstream act on (Express's method-override, Google's APIs, ...).
const METHOD_HEADERS: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// Headers by which a request names another path than its own (IIS, Symfony).
const PATH_HEADERS: [&str; 2] = ["x-original-url", "x-rewrite-url"];

/// What in `request` names another method or path than the route matched, which the
/// upstream would act on under this route's key and scope: an override header that
/// reaches the upstream (`headers_reach`: only under `trust_forwarded_headers`; else the
/// proxy removes them) naming another method or path, or `_method` in the query of a
/// request that changes things (as PHP reads names, see [`names_method`]).
fn overridden(request: &Request<Body>, headers_reach: bool) -> Option<&'static str> {
    let value = |name: &str| {
        request
            .headers()
            .get_all(name)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .map(str::trim)
            .collect::<Vec<_>>()
    };
    if headers_reach {
        let method = request.method().as_str();
        if let Some(name) = METHOD_HEADERS.into_iter().find(|name| {
            value(name)
                .iter()
                .any(|named| !named.eq_ignore_ascii_case(method))
        }) {
            return Some(name);
        }
        let path = request.uri().path();
        if let Some(name) = PATH_HEADERS.into_iter().find(|name| {
            value(name)
                .iter()
                .any(|named| *named != path && !named.starts_with(&format!("{path}?")))
        }) {
            return Some(name);
        }
    }
    if request.method().is_safe() {
        return None;
    }
    let query = request.uri().query()?;
    query
        .split('&')
        .filter_map(|pair| pair.split('=').next())
        .any(names_method)
        .then_some("_method")
}

/// 400 for a protected request that names another method or path.
fn refuse_override(named: &str) -> Response<Body> {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "method-override",
        "Method and path overrides are refused on protected routes",
    )
    .detail(format!(
        "This request carries `{named}`, which names another method or path than the one its route matched; send the request with its real method and path."
    ))
    .into_http_response()
}
