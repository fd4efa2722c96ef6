//! What becomes of a gRPC answer: every call answers HTTP 200, and `grpc-status` says how
//! it went.

use http::HeaderMap;

use crate::Disposition;

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
