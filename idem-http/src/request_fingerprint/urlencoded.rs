//! Query strings and form bodies (`application/x-www-form-urlencoded`): pairs decoded
//! to bytes, framed in name order.

pub(super) const FORM: &str = "application/x-www-form-urlencoded";

/// `application/x-www-form-urlencoded` pairs, percent-decoded to bytes, split as
/// `form_urlencoded::parse` splits them. Not `form_urlencoded::parse` itself: it decodes
/// bytes that are not UTF-8 to U+FFFD, so `a=%FF` and `a=%FE` would be one request.
pub(super) fn form_pairs(input: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    fn decode(input: &[u8]) -> Vec<u8> {
        let plus_as_space: Vec<u8> = input
            .iter()
            .map(|&b| if b == b'+' { b' ' } else { b })
            .collect();
        percent_encoding::percent_decode(&plus_as_space).collect()
    }
    input
        .split(|&b| b == b'&')
        .filter(|sequence| !sequence.is_empty())
        .map(|sequence| match sequence.iter().position(|&b| b == b'=') {
            Some(at) => (decode(&sequence[..at]), decode(&sequence[at + 1..])),
            None => (decode(sequence), Vec::new()),
        })
        .collect()
}

/// The pairs sorted by name, repeated names in their order (a stable sort), each name and
/// value length-prefixed. No pairs give no bytes, as an absent query did before pairs
/// were sorted.
pub(super) fn framed_pairs(mut pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<u8> {
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    for (name, value) in &pairs {
        for part in [name, value] {
            out.extend_from_slice(&(part.len() as u64).to_be_bytes());
            out.extend_from_slice(part);
        }
    }
    out
}
