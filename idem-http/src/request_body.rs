//! What a request body says, whatever form it travelled in: a compressed body by what it
//! decodes to, a multipart form by its parts. A client that retries compresses again
//! (another level, another library) and picks a new multipart boundary, so the bytes
//! differ while the request is the same; the fingerprint must see the same request.

use std::convert::Infallible;
use std::io::Read;

use bytes::Bytes;
use http::{HeaderMap, header};

/// One part of a `multipart/form-data` body.
pub(crate) struct Part {
    pub(crate) name: Option<String>,
    pub(crate) file_name: Option<String>,
    /// The part's media type, lowercased, without parameters.
    pub(crate) content_type: Option<String>,
    pub(crate) bytes: Bytes,
}

/// A request body as the fingerprint reads it.
pub(crate) enum Content {
    /// The bytes, decoded when they came compressed.
    Plain(Bytes),
    /// A multipart form's parts, in order.
    Multipart(Vec<Part>),
}

/// How many times its compressed size a body may decode to for the fingerprint: what
/// JSON and forms compress to, with room; a zip bomb past it is fingerprinted as it came,
/// and costs no more memory than this. (A real body that compresses better than this and
/// decodes past 64 KiB is fingerprinted as its compressed bytes too: a retry compressed
/// otherwise gets 422.)
const MAX_EXPANSION: usize = 128;

/// What `body` says: decoded when `Content-Encoding` is `gzip`, `x-gzip` or `deflate`
/// and it decodes within `limit` bytes and [`MAX_EXPANSION`] times its size (64 KiB at
/// least; else its bytes as they are: a body that does not decode, or decodes past
/// that, is fingerprinted as it came), then split into its parts when it is
/// `multipart/form-data` that parses (else its bytes).
pub(crate) async fn content(headers: &HeaderMap, body: &Bytes, limit: usize) -> Content {
    let bound = limit.min(body.len().saturating_mul(MAX_EXPANSION).max(64 * 1024));
    let plain = decoded(headers, body, bound).unwrap_or_else(|| body.clone());
    if let Some(boundary) = multipart_boundary(headers) {
        if let Some(parts) = multipart(plain.clone(), boundary).await {
            return Content::Multipart(parts);
        }
    }
    Content::Plain(plain)
}

/// The body decoded from its one content coding, within `limit` bytes.
fn decoded(headers: &HeaderMap, body: &Bytes, limit: usize) -> Option<Bytes> {
    let coding = headers
        .get(header::CONTENT_ENCODING)?
        .to_str()
        .ok()?
        .trim()
        .to_ascii_lowercase();
    let reader: Box<dyn Read + '_> = match coding.as_str() {
        "gzip" | "x-gzip" => Box::new(flate2::read::MultiGzDecoder::new(&body[..])),
        "deflate" => Box::new(flate2::read::ZlibDecoder::new(&body[..])),
        _ => return None,
    };
    let mut out = Vec::new();
    // One byte past the limit tells a body that decodes past it (a zip bomb, say).
    reader
        .take((limit as u64).saturating_add(1))
        .read_to_end(&mut out)
        .ok()?;
    (out.len() <= limit).then(|| Bytes::from(out))
}

/// The boundary of a `multipart/form-data` body.
fn multipart_boundary(headers: &HeaderMap) -> Option<String> {
    let content_type = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = content_type.split(';').next()?.trim();
    if !essence.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    multer::parse_boundary(content_type).ok()
}

/// The parts of a multipart body, or `None` when it does not parse.
async fn multipart(body: Bytes, boundary: String) -> Option<Vec<Part>> {
    let stream = futures_util::stream::once(async move { Ok::<_, Infallible>(body) });
    let mut form = multer::Multipart::new(stream, boundary);
    let mut parts = Vec::new();
    while let Some(field) = form.next_field().await.ok()? {
        let name = field.name().map(str::to_owned);
        let file_name = field.file_name().map(str::to_owned);
        let content_type = field
            .content_type()
            .map(|mime| mime.essence_str().to_ascii_lowercase());
        let bytes = field.bytes().await.ok()?;
        parts.push(Part {
            name,
            file_name,
            content_type,
            bytes,
        });
    }
    Some(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| {
                (
                    http::HeaderName::from_static(name),
                    http::HeaderValue::from_str(value).unwrap(),
                )
            })
            .collect()
    }

    fn gzip(bytes: &[u8]) -> Bytes {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap().into()
    }

    fn plain(content: Content) -> Bytes {
        match content {
            Content::Plain(bytes) => bytes,
            Content::Multipart(_) => panic!("not multipart"),
        }
    }

    #[tokio::test]
    async fn gzip_decodes_within_the_limit_and_else_stays_as_it_came() {
        let gz = headers(&[("content-encoding", "gzip")]);
        let body = gzip(b"{\"amount\":500}");
        assert_eq!(
            plain(content(&gz, &body, 1024).await),
            &b"{\"amount\":500}"[..]
        );
        // Past the limit, or not gzip at all: the bytes as they came, never an error.
        assert_eq!(plain(content(&gz, &body, 4).await), body);
        // A bomb: far more than 128 times its size, past 64 KiB.
        let bomb = gzip(&vec![b'a'; 4 * 1024 * 1024]);
        assert!(bomb.len() * 128 < 4 * 1024 * 1024);
        assert_eq!(plain(content(&gz, &bomb, 64 * 1024 * 1024).await), bomb);
        // Within 64 KiB a body decodes however well it compressed.
        let dense = vec![b'a'; 64 * 1024];
        let small = gzip(&dense);
        assert!(small.len() * 128 < dense.len());
        assert_eq!(plain(content(&gz, &small, 1024 * 1024).await), dense);
        let past = gzip(&vec![b'a'; 64 * 1024 + 1]);
        assert_eq!(plain(content(&gz, &past, 1024 * 1024).await), past);
        let broken = Bytes::from_static(b"not gzip");
        assert_eq!(plain(content(&gz, &broken, 1024).await), broken);
        // deflate is zlib's format (RFC 9110 §8.4.1.2), and a coding's name has any case.
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        zlib.write_all(b"{\"amount\":500}").unwrap();
        let deflated = Bytes::from(zlib.finish().unwrap());
        let deflate = headers(&[("content-encoding", " Deflate ")]);
        assert_eq!(
            plain(content(&deflate, &deflated, 1024).await),
            &b"{\"amount\":500}"[..]
        );
        let other = headers(&[("content-encoding", "br")]);
        assert_eq!(plain(content(&other, &body, 1024).await), body);
    }

    #[tokio::test]
    async fn multipart_is_read_by_its_parts() {
        let ct = headers(&[("content-type", "multipart/form-data; boundary=XyZ")]);
        let body = Bytes::from_static(
            b"--XyZ\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n500\r\n--XyZ\r\nContent-Disposition: form-data; name=\"receipt\"; filename=\"r.pdf\"\r\nContent-Type: Application/PDF\r\n\r\n%PDF\r\n--XyZ--\r\n",
        );
        let Content::Multipart(parts) = content(&ct, &body, 1024).await else {
            panic!("multipart");
        };
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name.as_deref(), Some("amount"));
        assert_eq!(parts[0].bytes, &b"500"[..]);
        assert_eq!(parts[1].file_name.as_deref(), Some("r.pdf"));
        assert_eq!(parts[1].content_type.as_deref(), Some("application/pdf"));
        assert_eq!(parts[1].bytes, &b"%PDF"[..]);
        // A body that does not parse as its boundary says: its bytes.
        let broken = Bytes::from_static(b"--other\r\n\r\nx");
        assert_eq!(plain(content(&ct, &broken, 1024).await), broken);
    }
}
