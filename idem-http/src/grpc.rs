//! What becomes of a gRPC answer: every call answers HTTP 200, and `grpc-status` says how
//! it went.

use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};

use crate::problem::Problem;
use crate::{Body, Disposition};

/// The header of a gRPC answer of the layer's own that names its problem type (the
/// `type` of the problem document an HTTP caller gets), for callers that branch on it.
///
/// ```
/// // A tonic client reads it from the status's metadata.
/// # let status = tonic::Status::unavailable("in flight");
/// let kind = status.metadata().get(idem_http::GRPC_PROBLEM_HEADER);
/// # let _ = kind;
/// ```
pub const GRPC_PROBLEM_HEADER: &str = "idem-problem-type";

/// Whether a request's body is gRPC's length-prefixed messages as they are: gRPC
/// (`application/grpc`, `+proto`) and binary gRPC-web (`application/grpc-web`, `+proto`),
/// not gRPC-web-text, whose messages travel in base64.
pub(crate) fn has_grpc_framing(headers: &HeaderMap) -> bool {
    is_grpc(headers)
        && !headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("application/grpc-web-text"))
}

/// Whether a response is gRPC's (`application/grpc`, `application/grpc+proto`, ...).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/grpc"))
}

/// The disposition for the `grpc-status` in `fields` (headers or trailers), if any.
pub(crate) fn disposition(fields: &HeaderMap) -> Option<Disposition> {
    let code: u32 = fields
        .get("grpc-status")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(grpc_disposition(code))
}

/// The layer's policy for gRPC status codes, which never releases a call whose effect may
/// have happened:
///
/// | code | disposition | why |
/// |---|---|---|
/// | 0 OK, 3 INVALID_ARGUMENT, 5 NOT_FOUND, 6 ALREADY_EXISTS, 7 PERMISSION_DENIED, 9 FAILED_PRECONDITION, 11 OUT_OF_RANGE, 12 UNIMPLEMENTED, 16 UNAUTHENTICATED | [`Disposition::Store`] | a final answer about this request: a retry gets it again |
/// | 8 RESOURCE_EXHAUSTED | [`Disposition::Release`] | gRPC's 429: nothing was done, retry later |
/// | 1 CANCELLED, 2 UNKNOWN, 4 DEADLINE_EXCEEDED, 10 ABORTED, 13 INTERNAL, 14 UNAVAILABLE, 15 DATA_LOSS, and any other | [`Disposition::Hold`] | the call may have had its effect: held until the lease ends, then a retry takes over |
///
/// A handler overrides it for one answer with a [`Disposition`] in the response's
/// extensions, as for HTTP.
///
/// ```
/// use idem_http::{Disposition, grpc_disposition};
///
/// assert_eq!(grpc_disposition(0), Disposition::Store);
/// assert_eq!(grpc_disposition(8), Disposition::Release);
/// assert_eq!(grpc_disposition(14), Disposition::Hold);
/// ```
pub fn grpc_disposition(code: u32) -> Disposition {
    match code {
        0 | 3 | 5 | 6 | 7 | 9 | 11 | 12 | 16 => Disposition::Store,
        8 => Disposition::Release,
        _ => Disposition::Hold,
    }
}

/// The gRPC status for a refusal of the layer's own, by its HTTP status:
///
/// | HTTP | gRPC | the layer's refusals |
/// |---|---|---|
/// | 400 | 3 INVALID_ARGUMENT | a key missing, malformed or refused; a body that could not be read |
/// | 401 | 16 UNAUTHENTICATED | a scope function's refusal |
/// | 403 | 7 PERMISSION_DENIED | a scope function's refusal |
/// | 409 | 14 UNAVAILABLE, with `grpc-retry-pushback-ms` | the key's first call still runs, or another attempt took it over: retry later, with the same key |
/// | 413 | 8 RESOURCE_EXHAUSTED | the request is over the body limit |
/// | 422 | 9 FAILED_PRECONDITION | the key was used for another request: send a new key |
/// | 429 | 8 RESOURCE_EXHAUSTED, with pushback | too many new keys |
/// | 500 | 13 INTERNAL | the handler failed |
/// | 501 | 12 UNIMPLEMENTED | a call that streams its request |
/// | 503 | 14 UNAVAILABLE, with pushback | the store is unavailable, or the request was shed |
/// | other 4xx, 5xx | 9 FAILED_PRECONDITION, 14 UNAVAILABLE | |
///
/// ```
/// use idem_http::grpc_code;
///
/// assert_eq!(grpc_code(409), 14);
/// assert_eq!(grpc_code(422), 9);
/// ```
pub fn grpc_code(http_status: u16) -> u32 {
    match http_status {
        400 => 3,
        401 => 16,
        403 => 7,
        409 | 503 => 14,
        413 | 429 => 8,
        422 => 9,
        500 => 13,
        501 => 12,
        status if (400..500).contains(&status) => 9,
        _ => 14,
    }
}

/// A refusal of the layer's own (a [`Problem`] it answered with) as a gRPC trailers-only
/// answer: HTTP 200, `grpc-status` by [`grpc_code`], `grpc-message` with the problem's
/// title and detail, the problem type in [`GRPC_PROBLEM_HEADER`], and a retry pushback
/// where the problem says when to retry. Any other response is left as it is.
///
/// `content_type` is the call's own (`application/grpc`, `application/grpc-web+proto`,
/// ...): a gRPC-web client reads only answers of its own family.
pub(crate) async fn refusal_as_status(
    response: Response<Body>,
    content_type: Option<HeaderValue>,
) -> Response<Body> {
    let (parts, body) = response.into_parts();
    let problem =
        match parts.extensions.get::<Problem>().cloned() {
            Some(problem) => problem,
            // A problem document read back from the record (a replay): the same status as
            // the first answer got.
            None if is_problem_json(&parts.headers) => {
                let retry_after = parts
                    .headers
                    .get(header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse().ok());
                // Read for its title when it is small and whole (a stored one); else, or when
                // it does not read as a problem, its HTTP status says enough.
                let small = http_body::Body::size_hint(&body)
                    .exact()
                    .is_some_and(|length| length <= 64 * 1024);
                let read =
                    match small {
                        true => http_body_util::BodyExt::collect(body).await.ok().and_then(
                            |collected| Problem::from_document(&collected.to_bytes(), retry_after),
                        ),
                        false => None,
                    };
                read.unwrap_or_else(|| Problem::of_status(parts.status, retry_after))
            }
            None => return Response::from_parts(parts, body),
        };
    let mut headers = parts.headers;
    for name in [header::CONTENT_TYPE, header::CONTENT_LENGTH] {
        headers.remove(name);
    }
    headers.insert(
        header::CONTENT_TYPE,
        content_type.unwrap_or(HeaderValue::from_static("application/grpc")),
    );
    headers.insert(
        HeaderName::from_static("grpc-status"),
        HeaderValue::from(grpc_code(problem.status())),
    );
    if let Ok(message) = HeaderValue::from_str(&percent_encode(&problem.message())) {
        headers.insert(HeaderName::from_static("grpc-message"), message);
    }
    if let Ok(kind) = HeaderValue::from_str(problem.kind()) {
        headers.insert(HeaderName::from_static(GRPC_PROBLEM_HEADER), kind);
    }
    if let Some(seconds) = problem.retry_after_seconds() {
        headers.insert(
            HeaderName::from_static("grpc-retry-pushback-ms"),
            HeaderValue::from(seconds.saturating_mul(1000)),
        );
    }
    let mut answer = Response::new(Body::empty());
    *answer.status_mut() = StatusCode::OK;
    *answer.headers_mut() = headers;
    *answer.extensions_mut() = parts.extensions;
    answer
}

/// The header of a gRPC replay whose message was not stored: the `grpc-status` the call
/// first answered with.
///
/// ```
/// # let status = tonic::Status::already_exists("carried out");
/// if status.code() == tonic::Code::AlreadyExists {
///     let first = status.metadata().get(idem_http::GRPC_ORIGINAL_STATUS_HEADER);
///     # let _ = first;
/// }
/// ```
pub const GRPC_ORIGINAL_STATUS_HEADER: &str = "idem-original-grpc-status";

/// A replay of a gRPC answer whose message was too large to store: a trailers-only
/// answer with `grpc-status` 6 ALREADY_EXISTS (the call was carried out; its message is
/// not here), the first status in [`GRPC_ORIGINAL_STATUS_HEADER`] when the record has it
/// (when its status decided, not a [`Disposition`](crate::Disposition) its handler chose), and
/// `idempotent-body-not-stored`. Never OK without its message, which a client would
/// decode as an empty one.
pub(crate) fn not_stored(mut headers: HeaderMap, trailers: &HeaderMap) -> Response<Body> {
    let original = trailers
        .get("grpc-status")
        .or_else(|| headers.get("grpc-status"))
        .cloned();
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(
        HeaderName::from_static(crate::service::BODY_NOT_STORED_HEADER),
        HeaderValue::from_static("true"),
    );
    headers.insert(
        HeaderName::from_static("grpc-status"),
        HeaderValue::from(6u32),
    );
    headers.insert(
        HeaderName::from_static("grpc-message"),
        HeaderValue::from_static(
            "The call with this idempotency key was carried out; its response was too large to store and is not replayed",
        ),
    );
    if let Some(original) = original {
        headers.insert(
            HeaderName::from_static(GRPC_ORIGINAL_STATUS_HEADER),
            original,
        );
    }
    let mut answer = Response::new(Body::empty());
    *answer.headers_mut() = headers;
    answer
}

/// Whether an answer is a problem document (`application/problem+json`).
fn is_problem_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/problem+json"))
}

/// `grpc-message`'s encoding: percent-encoded UTF-8, every byte outside printable ASCII
/// and `%` itself escaped.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_escape_what_grpc_escapes() {
        assert_eq!(percent_encode("in flight: 100%"), "in flight: 100%25");
        assert_eq!(percent_encode("é\nx"), "%C3%A9%0Ax");
    }

    #[tokio::test]
    async fn only_problems_become_statuses() {
        let plain = Response::new(Body::empty());
        let kept = refusal_as_status(plain, None).await;
        assert!(kept.headers().get("grpc-status").is_none());
        let problem = crate::Problem::new(StatusCode::CONFLICT, "in-flight", "In flight")
            .retry_after(2)
            .into_http_response();
        let status = refusal_as_status(problem, None).await;
        assert_eq!(status.status(), 200);
        assert_eq!(status.headers()["grpc-status"], "14");
        assert_eq!(status.headers()["grpc-retry-pushback-ms"], "2000");
        assert_eq!(status.headers()["content-type"], "application/grpc");
        assert_eq!(
            status.headers()[GRPC_PROBLEM_HEADER],
            "tag:idem-http,2026:in-flight"
        );
    }

    #[test]
    fn every_http_status_has_its_grpc_code() {
        for (http, grpc) in [
            (400, 3),
            (401, 16),
            (403, 7),
            (409, 14),
            (413, 8),
            (422, 9),
            (429, 8),
            (500, 13),
            (501, 12),
            (503, 14),
            (404, 9),
            (418, 9),
            (499, 9),
            (502, 14),
            (504, 14),
        ] {
            assert_eq!(grpc_code(http), grpc, "HTTP {http}");
        }
    }

    #[test]
    fn every_grpc_code_has_its_disposition() {
        for code in [0, 3, 5, 6, 7, 9, 11, 12, 16] {
            assert_eq!(grpc_disposition(code), Disposition::Store, "{code}");
        }
        assert_eq!(grpc_disposition(8), Disposition::Release);
        for code in [1, 2, 4, 10, 13, 14, 15, 17] {
            assert_eq!(grpc_disposition(code), Disposition::Hold, "{code}");
        }
    }

    #[test]
    fn grpc_web_text_is_not_framed_as_it_travels() {
        let with = |content_type: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_str(content_type).unwrap(),
            );
            has_grpc_framing(&headers)
        };
        assert!(with("application/grpc"));
        assert!(with("application/grpc+proto"));
        assert!(with("application/grpc-web+proto"));
        assert!(!with("application/grpc-web-text"));
        assert!(!with("application/grpc-web-text+proto"));
        assert!(!with("application/json"));
        assert!(!has_grpc_framing(&HeaderMap::new()));
    }

    /// A problem replayed from the record (a handler's stored 402) has no `Problem` beside
    /// it: its document is read back for its title when it is small (up to 64 KiB), else
    /// its status says enough.
    #[tokio::test]
    async fn a_replayed_problem_document_is_read_back_when_small() {
        let replayed = |bytes: Vec<u8>| {
            Response::builder()
                .status(StatusCode::PAYMENT_REQUIRED)
                .header(header::CONTENT_TYPE, "application/problem+json")
                .header(header::RETRY_AFTER, "3")
                .body(crate::problem::full(bytes::Bytes::from(bytes)))
                .unwrap()
        };
        let document = |padding: usize| {
            serde_json::to_vec(&serde_json::json!({
                "type": "https://example.com/problems/declined",
                "title": "Card declined",
                "status": 402,
                "padding": "x".repeat(padding),
            }))
            .unwrap()
        };
        // Over a kilobyte but well under the limit.
        let small = refusal_as_status(replayed(document(4096)), None).await;
        assert_eq!(small.headers()["grpc-status"], "9");
        assert_eq!(small.headers()["grpc-message"], "Card declined");
        assert_eq!(
            small.headers()[GRPC_PROBLEM_HEADER],
            "https://example.com/problems/declined"
        );
        assert_eq!(small.headers()["grpc-retry-pushback-ms"], "3000");
        let at_limit = document(0).len();
        let exactly = refusal_as_status(replayed(document(64 * 1024 - at_limit)), None).await;
        assert_eq!(exactly.headers()["grpc-message"], "Card declined");
        let large = refusal_as_status(replayed(document(64 * 1024)), None).await;
        assert_eq!(large.headers()["grpc-status"], "9");
        assert_eq!(large.headers()["grpc-message"], "Payment Required");
        assert_eq!(large.headers()[GRPC_PROBLEM_HEADER], "about:blank");
    }
}
