//! How a response is stored: a compact binary encoding of status, headers and body.
//!
//! ```text
//! "IDH" 0x02              magic and version
//! flags: u8               bit 0: the body was too large to store (the body is empty)
//! status: u16             big-endian, as every integer below
//! header count: u16
//!   name length: u16, name bytes, value length: u32, value bytes    (per header)
//! body length: u64
//! body: exactly that many bytes
//! trailer count: u16, then the trailers as the headers above          (version 3 only)
//! nothing after them
//! ```
//!
//! The body's length makes a response cut short at rest (a truncated value, a bad copy)
//! a [`DecodeError`], never a shorter body replayed to a client. A response with trailers
//! (gRPC's `grpc-status`) is written as version 3; one without as version 2, which
//! every earlier release reads. Version 1 (no body length, the body ran to the end)
//! still decodes, for records stored before.
//!
//! No JSON arrays of numbers: a 10 KiB body takes 10 KiB plus its headers.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

const MAGIC: &[u8; 4] = b"IDH\x02";
/// Version 2 followed by trailers.
const MAGIC_V3: &[u8; 4] = b"IDH\x03";
/// The first version, without a body length.
const MAGIC_V1: &[u8; 4] = b"IDH\x01";
const TOO_LARGE: u8 = 1;
/// The most fields a decoded map is sized for up front; real responses carry a few dozen.
const MAX_PRESIZED_FIELDS: usize = 256;

/// A response as the layer stores and replays it.
///
/// ```
/// use idem_http::StoredResponse;
/// use http::{HeaderMap, HeaderValue, StatusCode};
///
/// let mut headers = HeaderMap::new();
/// headers.insert("content-type", HeaderValue::from_static("application/json"));
/// let stored = StoredResponse::new(StatusCode::CREATED, headers, bytes::Bytes::from_static(b"{\"id\":7}"));
/// let bytes = stored.encode();
/// assert_eq!(StoredResponse::decode(&bytes)?, stored);
/// # Ok::<(), idem_http::DecodeError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The status code.
    pub status: StatusCode,
    /// The stored headers (the allowlisted ones).
    pub headers: HeaderMap,
    /// The body, byte for byte (empty when `body_too_large`).
    pub body: Bytes,
    /// The trailers sent after the body (gRPC's status travels here); empty when there
    /// were none.
    pub trailers: HeaderMap,
    /// True when the body was over the replay limit: it was sent to the first client and
    /// not stored.
    pub body_too_large: bool,
}

/// A stored response that does not decode: written by something else, or damaged.
///
/// ```
/// use idem_http::StoredResponse;
///
/// let err = StoredResponse::decode(b"{\"not\": \"a stored response\"}").unwrap_err();
/// assert!(err.to_string().contains("does not decode"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a stored response does not decode: {what}")]
pub struct DecodeError {
    what: &'static str,
}

fn corrupt(what: &'static str) -> DecodeError {
    DecodeError { what }
}

/// Reads the encoding front to back, handing out parts of the one buffer (no copies).
struct Reader(Bytes);

impl Reader {
    fn take(&mut self, n: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        if self.0.len() < n {
            return Err(corrupt(what));
        }
        Ok(self.0.split_to(n))
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        let bytes = self.take(2, what)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let bytes = self.take(4, what)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// A count, then that many fields (headers or trailers).
    /// The fields, in a map with `room` for more (a replay adds `idempotent-replayed`).
    fn fields(&mut self, room: usize) -> Result<HeaderMap, DecodeError> {
        let count = self.u16("no header count")?;
        // Sized by what the bytes left can hold, and capped: a damaged count must not
        // allocate (nor overflow the map's size limit, which panics) before the fields
        // are read. A field takes at least 7 bytes; the map grows past the cap if needed.
        let room_for = (self.0.len() / 7)
            .min(usize::from(count))
            .min(MAX_PRESIZED_FIELDS);
        let mut fields = HeaderMap::try_with_capacity(room_for + room)
            .map_err(|_| corrupt("more headers than a header map holds"))?;
        for _ in 0..count {
            let name_len = self.u16("a truncated header")?;
            let name =
                HeaderName::from_bytes(&self.take(usize::from(name_len), "a truncated header")?)
                    .map_err(|_| corrupt("an invalid header name"))?;
            let value_len = self.u32("a truncated header")? as usize;
            let value = HeaderValue::from_maybe_shared(self.take(value_len, "a truncated header")?)
                .map_err(|_| corrupt("an invalid header value"))?;
            fields
                .try_append(name, value)
                .map_err(|_| corrupt("more headers than a header map holds"))?;
        }
        Ok(fields)
    }
}

/// A count, then each field; header maps hold far fewer than 65 536 entries of under
/// 4 GiB each in practice, and the encoding refuses to go wrong if one ever does, by
/// dropping what does not fit.
fn write_fields(out: &mut Vec<u8>, map: &HeaderMap) {
    // Counted, then written, by two passes over the same fields: no list of them is kept.
    let fields = || {
        map.iter()
            .filter(|(name, value)| {
                name.as_str().len() <= usize::from(u16::MAX) && u32::try_from(value.len()).is_ok()
            })
            .take(usize::from(u16::MAX))
    };
    out.extend_from_slice(&(fields().count() as u16).to_be_bytes());
    for (name, value) in fields() {
        out.extend_from_slice(&(name.as_str().len() as u16).to_be_bytes());
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
}

impl StoredResponse {
    /// A complete response to store.
    pub fn new(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        Self {
            status,
            headers,
            body,
            trailers: HeaderMap::new(),
            body_too_large: false,
        }
    }

    /// The same response with these trailers after its body.
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue, StatusCode};
    /// use idem_http::StoredResponse;
    ///
    /// let mut trailers = HeaderMap::new();
    /// trailers.insert("grpc-status", HeaderValue::from_static("0"));
    /// let stored = StoredResponse::new(StatusCode::OK, HeaderMap::new(), bytes::Bytes::new())
    ///     .with_trailers(trailers);
    /// assert_eq!(StoredResponse::decode(&stored.encode())?.trailers["grpc-status"], "0");
    /// # Ok::<(), idem_http::DecodeError>(())
    /// ```
    #[must_use]
    pub fn with_trailers(mut self, trailers: HeaderMap) -> Self {
        self.trailers = trailers;
        self
    }

    /// A response whose body was too large to store: its status and headers only.
    pub fn without_body(status: StatusCode, headers: HeaderMap) -> Self {
        Self {
            status,
            headers,
            body: Bytes::new(),
            trailers: HeaderMap::new(),
            body_too_large: true,
        }
    }

    /// The bytes to store.
    pub fn encode(&self) -> Vec<u8> {
        let size = |map: &HeaderMap| -> usize {
            map.iter()
                .map(|(name, value)| 6 + name.as_str().len() + value.len())
                .sum()
        };
        let trailers = !self.trailers.is_empty();
        // The magic (4), the flags (1), the status (2), the header count (2) and the body's
        // length (8); with trailers, their count (2).
        let fixed = 17 + if trailers { 2 } else { 0 };
        let mut out = Vec::with_capacity(
            fixed + size(&self.headers) + self.body.len() + size(&self.trailers),
        );
        out.extend_from_slice(if trailers { MAGIC_V3 } else { MAGIC });
        out.push(if self.body_too_large { TOO_LARGE } else { 0 });
        out.extend_from_slice(&self.status.as_u16().to_be_bytes());
        write_fields(&mut out, &self.headers);
        out.extend_from_slice(&(self.body.len() as u64).to_be_bytes());
        out.extend_from_slice(&self.body);
        if trailers {
            write_fields(&mut out, &self.trailers);
        }
        out
    }

    /// Reads bytes written by [`StoredResponse::encode`].
    ///
    /// # Errors
    /// [`DecodeError`] for anything else.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        Self::decode_shared(Bytes::copy_from_slice(bytes))
    }

    /// [`StoredResponse::decode`] of bytes the response may share: its body and header
    /// values are parts of `bytes`, not copies (a `Vec<u8>` converts without a copy).
    ///
    /// ```
    /// use http::{HeaderMap, StatusCode};
    /// use idem_http::StoredResponse;
    ///
    /// let stored = StoredResponse::new(StatusCode::CREATED, HeaderMap::new(), "ok".into());
    /// let decoded = StoredResponse::decode_shared(stored.encode())?;
    /// assert_eq!((decoded.status, &decoded.body[..]), (StatusCode::CREATED, &b"ok"[..]));
    /// # Ok::<(), idem_http::DecodeError>(())
    /// ```
    ///
    /// # Errors
    /// [`DecodeError`] for anything but what [`StoredResponse::encode`] wrote.
    pub fn decode_shared(bytes: impl Into<Bytes>) -> Result<Self, DecodeError> {
        let mut reader = Reader(bytes.into());
        let magic = reader.take(4, "no header")?;
        let magic = &magic[..];
        let (sized, with_trailers) = (magic == MAGIC || magic == MAGIC_V3, magic == MAGIC_V3);
        let sized = if sized {
            true
        } else if magic == MAGIC_V1 {
            false
        } else {
            return Err(corrupt(
                "not a stored HTTP response (or of another version)",
            ));
        };
        let flags = reader.take(1, "no flags")?[0];
        let status = StatusCode::from_u16(reader.u16("no status")?)
            .map_err(|_| corrupt("an invalid status code"))?;
        let headers = reader.fields(1)?;
        let body = if sized {
            let length = reader.take(8, "no body length")?;
            let length = u64::from_be_bytes(length[..].try_into().unwrap_or([0xff; 8]));
            let length = usize::try_from(length)
                .map_err(|_| corrupt("a body of another length than recorded"))?;
            reader.take(length, "a body of another length than recorded")?
        } else {
            std::mem::take(&mut reader.0)
        };
        let trailers = if with_trailers {
            reader.fields(0)?
        } else {
            HeaderMap::new()
        };
        if !reader.0.is_empty() {
            return Err(corrupt("bytes after the response"));
        }
        Ok(Self {
            status,
            headers,
            body,
            trailers,
            body_too_large: flags & TOO_LARGE != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailers_survive_and_a_response_without_them_stays_version_2() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("5"));
        trailers.insert("grpc-message", HeaderValue::from_static("not found"));
        let plain = StoredResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::from_static(b"x"));
        assert_eq!(&plain.encode()[..4], MAGIC);
        let with = plain.clone().with_trailers(trailers);
        let bytes = with.encode();
        assert_eq!(&bytes[..4], MAGIC_V3);
        assert_eq!(StoredResponse::decode(&bytes).unwrap(), with);
        for end in 0..bytes.len() {
            assert!(StoredResponse::decode(&bytes[..end]).is_err(), "{end}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(StoredResponse::decode(&longer).is_err());
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// The stored format, byte for byte: records written by an earlier build must read
    /// the same after an upgrade, so any change to the format shows here first.
    #[test]
    fn the_format_is_pinned_byte_for_byte() {
        let mut headers = HeaderMap::new();
        headers.append("link", HeaderValue::from_static("<a>"));
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("link", HeaderValue::from_static("<b>"));
        let stored = StoredResponse::new(StatusCode::CREATED, headers, Bytes::from_static(b"{}"));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let with_trailers = stored.clone().with_trailers(trailers);
        let too_large = StoredResponse::without_body(StatusCode::OK, HeaderMap::new());
        assert_eq!(
            [
                hex(&stored.encode()),
                hex(&with_trailers.encode()),
                hex(&too_large.encode())
            ],
            [
                // "IDH", version 2, not too large, 201, three fields (link twice, then
                // content-type: a name's values stay together), the body's length, "{}".
                "494448020000c9000300046c696e6b000000033c613e00046c696e6b000000033c623e000c\
                 636f6e74656e742d74797065000000106170706c69636174696f6e2f6a736f6e000000000000\
                 00027b7d",
                // Version 3: the same, then one trailer field, grpc-status: 0.
                "494448030000c9000300046c696e6b000000033c613e00046c696e6b000000033c623e000c\
                 636f6e74656e742d74797065000000106170706c69636174696f6e2f6a736f6e000000000000\
                 00027b7d0001000b677270632d7374617475730000000130",
                // Version 2, too large, 200, no fields, an empty body.
                "494448020100c800000000000000000000",
            ]
            .map(String::from)
        );
    }

    fn unhex(hex: &str) -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(&hex[at..at + 2], 16).expect("hex"))
            .collect()
    }

    /// Records as earlier builds wrote them, literally, read back: version 1 (no body
    /// length), version 2 with a non-UTF-8 and an empty value, and version 3 too large
    /// with trailers (a gRPC answer whose body was not kept).
    #[test]
    fn records_written_before_read_back_the_same() {
        // Version 1: 201, location: /p/7, then the body to the end.
        let v1 = unhex("494448010000c9000100086c6f636174696f6e000000042f702f376f6b");
        let mut headers = HeaderMap::new();
        headers.insert("location", HeaderValue::from_static("/p/7"));
        assert_eq!(
            StoredResponse::decode(&v1).unwrap(),
            StoredResponse::new(StatusCode::CREATED, headers, Bytes::from_static(b"ok"))
        );
        // Version 2: 200, x-raw: 0xe9 (Latin-1, not UTF-8), x-empty: "", no body.
        let v2 = unhex(
            "494448020000c800020005782d72617700000001e90007782d656d707479000000000000000000000000",
        );
        let mut headers = HeaderMap::new();
        headers.insert("x-raw", HeaderValue::from_bytes(b"\xe9").unwrap());
        headers.insert("x-empty", HeaderValue::from_static(""));
        let expected = StoredResponse::new(StatusCode::OK, headers, Bytes::new());
        assert_eq!(StoredResponse::decode(&v2).unwrap(), expected);
        assert_eq!(expected.encode(), v2, "and written the same way today");
        // Version 3, too large: 200, no fields, an empty body, then grpc-status: 0.
        let v3 =
            unhex("494448030100c8000000000000000000000001000b677270632d7374617475730000000130");
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let expected =
            StoredResponse::without_body(StatusCode::OK, HeaderMap::new()).with_trailers(trailers);
        assert_eq!(StoredResponse::decode(&v3).unwrap(), expected);
        assert_eq!(expected.encode(), v3, "and written the same way today");
    }

    /// A damaged header count must be a `DecodeError`: sizing the map by it would
    /// allocate for it, or panic past the map's size limit (a count from 24 576 on),
    /// before a single field is read.
    #[test]
    fn a_header_count_no_map_can_hold_is_an_error_never_a_panic() {
        for count in [24_575u16, 24_576, 24_577, u16::MAX] {
            let mut headers_only = b"IDH\x02\x00\x00\xc8".to_vec();
            headers_only.extend_from_slice(&count.to_be_bytes());
            let decoded = std::panic::catch_unwind(|| StoredResponse::decode(&headers_only));
            assert!(decoded.expect("no panic").is_err(), "{count}");
            let mut trailers = b"IDH\x03\x00\x00\xc8\x00\x00".to_vec();
            trailers.extend_from_slice(&[0; 8]);
            trailers.extend_from_slice(&count.to_be_bytes());
            let decoded = std::panic::catch_unwind(|| StoredResponse::decode(&trailers));
            assert!(decoded.expect("no panic").is_err(), "{count}");
        }
    }

    /// A record whose fields are more distinct names than a header map holds (32 768) is
    /// refused as it is read, never a panic.
    #[test]
    fn more_distinct_headers_than_a_map_holds_is_an_error_never_a_panic() {
        let count: u16 = 40_000;
        let mut record = b"IDH\x02\x00\x00\xc8".to_vec();
        record.extend_from_slice(&count.to_be_bytes());
        for field in 0..count {
            let name = format!("h{field}");
            record.extend_from_slice(&(name.len() as u16).to_be_bytes());
            record.extend_from_slice(name.as_bytes());
            record.extend_from_slice(&0u32.to_be_bytes());
        }
        record.extend_from_slice(&0u64.to_be_bytes());
        let decoded = std::panic::catch_unwind(|| StoredResponse::decode(&record));
        let err = decoded
            .expect("no panic")
            .expect_err("more headers than a map holds");
        assert!(
            err.to_string()
                .contains("more headers than a header map holds"),
            "{err}"
        );
    }

    /// A header map holds any number of values under one name: a response with tens of
    /// thousands of them is stored, and replays whole.
    #[test]
    fn many_values_of_one_header_survive() {
        let mut headers = HeaderMap::new();
        for _ in 0..30_000 {
            headers.append("link", HeaderValue::from_static("a"));
        }
        let stored = StoredResponse::new(StatusCode::OK, headers, Bytes::new());
        assert_eq!(StoredResponse::decode(&stored.encode()).unwrap(), stored);
    }

    #[test]
    fn every_byte_and_repeated_headers_survive() {
        let mut headers = HeaderMap::new();
        headers.append("link", HeaderValue::from_static("<a>; rel=next"));
        headers.append("link", HeaderValue::from_static("<b>; rel=prev"));
        headers.insert("location", HeaderValue::from_static("/payments/7"));
        let body: Vec<u8> = (0..=255).chain(0..=255).collect();
        let stored = StoredResponse::new(StatusCode::CREATED, headers, Bytes::from(body));
        let bytes = stored.encode();
        assert_eq!(StoredResponse::decode(&bytes).unwrap(), stored);
        // Compact: the body plus a few bytes per header, not JSON.
        let cut = &bytes[..bytes.len() - 1];
        assert!(
            StoredResponse::decode(cut).is_err(),
            "a body cut short is refused"
        );
        let mut v1 = bytes.clone();
        v1[3] = 1;
        v1.drain(v1.len() - stored.body.len() - 8..v1.len() - stored.body.len());
        assert_eq!(
            StoredResponse::decode(&v1).unwrap(),
            stored,
            "version 1 still reads"
        );
        assert!(bytes.len() < stored.body.len() + 100, "{}", bytes.len());
    }

    #[test]
    fn a_body_too_large_is_remembered_as_such() {
        let stored = StoredResponse::without_body(StatusCode::OK, HeaderMap::new());
        let decoded = StoredResponse::decode(&stored.encode()).unwrap();
        assert!(decoded.body_too_large && decoded.body.is_empty());
    }

    #[test]
    fn damaged_bytes_are_errors_never_panics() {
        let stored = StoredResponse::new(
            StatusCode::OK,
            HeaderMap::from_iter([(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain"),
            )]),
            Bytes::from_static(b"ok"),
        );
        let bytes = stored.encode();
        for end in 0..bytes.len() - 2 {
            assert!(StoredResponse::decode(&bytes[..end]).is_err(), "{end}");
        }
        assert!(StoredResponse::decode(b"{\"json\": true}").is_err());
        let mut bad_status = bytes.clone();
        bad_status[5..7].copy_from_slice(&1000u16.to_be_bytes());
        assert!(StoredResponse::decode(&bad_status).is_err());
    }

    proptest::proptest! {
        #![proptest_config(idem_testkit::fuzz_config())]

        /// Any stored bytes decode or answer a `DecodeError`; a valid encoding with
        /// bytes cut off or appended is refused, never misread.
        #[test]
        fn any_stored_bytes(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400), cut in 0usize..64) {
            let _ = StoredResponse::decode(&bytes);
            let mut headers = HeaderMap::new();
            headers.insert("location", HeaderValue::from_static("/p/1"));
            let valid = StoredResponse::new(StatusCode::OK, headers, Bytes::from(bytes.clone())).encode();
            let short = &valid[..valid.len().saturating_sub(cut + 1)];
            proptest::prop_assert!(StoredResponse::decode(short).is_err());
        }

        /// Random bytes behind each valid magic: the decoder's paths past the first
        /// check, which wholly random bytes almost never reach.
        #[test]
        fn any_bytes_behind_a_valid_magic(version in 1u8..=3, bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
            let mut record = b"IDH".to_vec();
            record.push(version);
            record.extend_from_slice(&bytes);
            let _ = StoredResponse::decode(&record);
        }
    }
}
