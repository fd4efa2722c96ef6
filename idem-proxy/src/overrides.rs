//! Method and path overrides on protected routes: what in a request names another
//! method or path than the one its route matched, which the upstream would act on under
//! this route's key and scope. Such requests are refused (400 `method-override`).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderName, Method, Request, Response, StatusCode, header};
use http_body::Frame;
use http_body_util::BodyExt;
use idem_core::BoxError;
use idem_http::{Body, Problem};

/// `request` as it came (its body read ahead only where it is a form), or the refusal
/// when it names another method or path. A body is read ahead only for a request that
/// carries its route's key (`key_header`: without one, the layer refuses it or passes it
/// on unprotected, and nothing is claimed), and only within `limit`, the route's
/// `max_request_body`: a form longer than that is not read through, and the layer
/// refuses it as too large, at once when its length says so.
pub(crate) async fn check(
    request: Request<Body>,
    headers_reach: bool,
    key_header: &HeaderName,
    limit: usize,
) -> Result<Request<Body>, Response<Body>> {
    if let Some(named) = overridden(&request, headers_reach) {
        return Err(refuse_override(named));
    }
    if request.method().is_safe() || !request.headers().contains_key(key_header) {
        return Ok(request);
    }
    // Rails, Laravel and Symfony read `_method` from a form's body too, and Laravel from
    // a JSON body's top level.
    let Some(form) = form_kind(&request) else {
        return Ok(request);
    };
    if http_body::Body::size_hint(request.body()).lower() > limit as u64 {
        return Ok(request);
    }
    let (parts, body) = request.into_parts();
    let (read, whole) = read_ahead(body, limit).await;
    let named = match (whole, form) {
        (Some(bytes), Form::Urlencoded) => bytes
            .split(|byte| *byte == b'&')
            .filter_map(|pair| pair.split(|byte| *byte == b'=').next())
            .any(|name| names_method(&String::from_utf8_lossy(name))),
        (Some(bytes), Form::Multipart(Some(boundary))) => {
            match multipart_names_method(bytes.clone(), boundary).await {
                Some(named) => named,
                // What multer cannot read, a more lenient parser upstream may.
                None => names_method_anywhere(&bytes),
            }
        }
        (Some(bytes), Form::Multipart(None)) => names_method_anywhere(&bytes),
        (Some(bytes), Form::Json) => json_names_method(&bytes),
        (None, _) => false,
    };
    if named {
        return Err(refuse_override("_method"));
    }
    Ok(Request::from_parts(parts, read))
}

/// The kinds of body whose fields frameworks read `_method` from.
enum Form {
    Urlencoded,
    /// With its boundary, when the content type has one that parses.
    Multipart(Option<String>),
    Json,
}

/// What kind of form `request`'s body is, if any: `application/x-www-form-urlencoded`
/// (also a `POST` without a content type, which Rack reads as one),
/// `multipart/form-data` with its boundary, or JSON (`application/json`, `+json`).
fn form_kind(request: &Request<Body>) -> Option<Form> {
    let Some(content_type) = request.headers().get(header::CONTENT_TYPE) else {
        return (request.method() == Method::POST).then_some(Form::Urlencoded);
    };
    let content_type = content_type.to_str().ok()?;
    let essence = content_type.split(';').next()?.trim();
    if essence.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        Some(Form::Urlencoded)
    } else if essence.eq_ignore_ascii_case("multipart/form-data") {
        Some(Form::Multipart(multer::parse_boundary(content_type).ok()))
    } else if essence.eq_ignore_ascii_case("application/json")
        || essence.to_ascii_lowercase().ends_with("+json")
    {
        Some(Form::Json)
    } else {
        None
    }
}

/// Whether a JSON body's top level has `_method` (Laravel reads a JSON body as its
/// input, `_method` included). Parsed only when the bytes hold the name at all.
fn json_names_method(body: &[u8]) -> bool {
    if !body.windows(7).any(|window| window == b"_method") {
        return false;
    }
    // A body that does not parse cannot name a method upstream either.
    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(body)
        .is_ok_and(|object| object.contains_key("_method"))
}

/// Whether a multipart body multer could not read names a `_method` field anywhere in
/// its bytes (`name="_method"` or `name=_method`, any case).
fn names_method_anywhere(body: &[u8]) -> bool {
    let lower = body.to_ascii_lowercase();
    [&b"name=\"_method\""[..], &b"name=_method"[..]]
        .iter()
        .any(|needle| lower.windows(needle.len()).any(|window| window == *needle))
}

/// Whether a multipart body has a field named `_method`, as PHP reads names; `None`
/// when multer cannot read it through.
async fn multipart_names_method(body: Bytes, boundary: String) -> Option<bool> {
    let stream = futures_util::stream::once(async move { Ok::<_, std::convert::Infallible>(body) });
    let mut form = multer::Multipart::new(stream, boundary);
    loop {
        match form.next_field().await {
            Ok(Some(field)) if field.name().is_some_and(is_method_name) => return Some(true),
            Ok(Some(_)) => {}
            Ok(None) => return Some(false),
            Err(_) => return None,
        }
    }
}

/// Whether a form or query name (still percent-encoded) is `_method` as PHP reads names:
/// `+` is a space, then as [`is_method_name`].
fn names_method(encoded: &str) -> bool {
    let encoded = encoded.replace('+', " ");
    is_method_name(&percent_encoding::percent_decode_str(&encoded).decode_utf8_lossy())
}

/// Whether a decoded name is `_method` as PHP reads names: it ends at a NUL, leading
/// spaces go, and ` `, `.` and `[` become `_` (`_method`, ` _method`, `.method`,
/// `[method`, `_method\0x` are one).
fn is_method_name(name: &str) -> bool {
    let name = name.split('\0').next().unwrap_or_default();
    let name: String = name
        .trim_start_matches(' ')
        .chars()
        .map(|c| if matches!(c, ' ' | '.' | '[') { '_' } else { c })
        .collect();
    name.eq_ignore_ascii_case("_method")
}

/// Reads `body` until its end, past `limit` bytes, or an error, keeping one copy of its
/// bytes: the body again, whole (what was read, then the rest, or the error where it
/// broke off), and its bytes when it ended within `limit`.
async fn read_ahead(mut body: Body, limit: usize) -> (Body, Option<Bytes>) {
    let mut data = BytesMut::new();
    let (rest, error, trailers) = loop {
        match body.frame().await {
            None => break (None, None, None),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(bytes) => {
                    data.extend_from_slice(&bytes);
                    if data.len() > limit {
                        break (Some(body), None, None);
                    }
                }
                Err(frame) => {
                    // Trailers end a body.
                    break (None, None, frame.into_trailers().ok());
                }
            },
            Some(Err(err)) => break (None, Some(err), None),
        }
    };
    let data = data.freeze();
    let whole = (rest.is_none() && error.is_none()).then(|| data.clone());
    let replayed = Replayed {
        data: (!data.is_empty()).then_some(data),
        trailers,
        error,
        rest,
    };
    (Body::new(replayed), whole)
}

/// A body read ahead: its bytes, then its trailers, the error it broke off with, or the
/// rest of the body they came from.
struct Replayed {
    data: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
    error: Option<BoxError>,
    rest: Option<Body>,
}

impl http_body::Body for Replayed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(trailers) = self.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        if let Some(error) = self.error.take() {
            return Poll::Ready(Some(Err(error)));
        }
        match self.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
            && self.trailers.is_none()
            && self.error.is_none()
            && self
                .rest
                .as_ref()
                .is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let read = self.data.as_ref().map_or(0, |data| data.len() as u64);
        let mut hint = self.rest.as_ref().map_or_else(
            || http_body::SizeHint::with_exact(0),
            http_body::Body::size_hint,
        );
        // The upper bound first: `set_lower` panics above the upper bound.
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper.saturating_add(read));
        }
        hint.set_lower(hint.lower().saturating_add(read));
        hint
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_as_php_reads_them() {
        for name in [
            "_method",
            "+_method",
            "%20_method",
            ".method",
            "[method",
            "_METHOD",
            "_method%00x",
        ] {
            assert!(names_method(name), "{name}");
        }
        for name in ["method", "__method", "_method_", "x_method", "%2B_method"] {
            assert!(!names_method(name), "{name}");
        }
    }

    #[tokio::test]
    async fn a_body_read_ahead_is_the_same_body_with_the_same_length() {
        let rest = Body::from(Bytes::from_static(b"0123456789"));
        let replayed = Replayed {
            data: Some(Bytes::from_static(b"abc")),
            trailers: None,
            error: None,
            rest: Some(rest),
        };
        let hint = http_body::Body::size_hint(&replayed);
        assert_eq!((hint.lower(), hint.upper()), (13, Some(13)));
        let whole = Body::new(replayed).collect().await.unwrap().to_bytes();
        assert_eq!(&whole[..], b"abc0123456789");

        let (body, read) = read_ahead(Body::from(Bytes::from_static(b"a=1&b=2")), 4).await;
        assert_eq!(read, None, "past the limit: not read through");
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"a=1&b=2");
    }
}
