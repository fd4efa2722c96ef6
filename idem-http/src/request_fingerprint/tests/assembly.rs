//! The fingerprint as a whole: which body kind counts how, pinned digits, no panics.

use proptest::prelude::*;

use super::json_generators::{Layout, tree};
use super::*;

#[test]
fn other_bodies_count_as_bytes() {
    let rule = FingerprintRule::default();
    let text = |body: &str| {
        rule.fingerprint(
            &parts("POST", "/x", "text/plain"),
            &Bytes::copy_from_slice(body.as_bytes()),
        )
    };
    assert_ne!(text("{\"a\":1,\"b\":2}"), text("{\"b\":2,\"a\":1}"));
    assert_eq!(text("same"), text("same"));
}

fn hex(fingerprint: Fingerprint) -> String {
    fingerprint
        .as_bytes()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The fingerprints of a JSON, a form and a plain request, digit for digit: a record
/// stored before an upgrade must match its retry after it, so any change to how a
/// request is fingerprinted shows here first (and needs a way to read the old ones).
#[test]
fn fingerprints_are_pinned_digit_for_digit() {
    let rule = FingerprintRule::default();
    let json = fp(
        &rule,
        "POST",
        "/checkout?b=2&a=1",
        r#"{"currency":"EUR","amount":500,"items":[1.50,{"z":null,"y":true}]}"#,
    );
    let form = with_type(&rule, "/checkout", FORM, "b=2&a=%20x&a=y");
    let plain = with_type(&rule, "/upload", "application/octet-stream", "\x00raw");
    assert_eq!(
        [hex(json), hex(form), hex(plain)],
        [
            "a30413d5015f375bd371358cda89c077e7fb3042c17dce7f9fb71a075a33dad5",
            "cedf91fecbbd6aaa2f1a0b12d74bdbba1a32b19cbf56fc3742d7b16e1dd47388",
            "1449b6f683634f3bf1bc40ab37f0f0d3c680f49442211a87b5bae6042684696d",
        ]
        .map(String::from)
    );
}

proptest! {
    #![proptest_config(idem_testkit::fuzz_config())]

    /// Nothing panics, whatever the body, content type and query.
    #[test]
    fn any_request_fingerprints(
        body in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..200),
            "[\\[\\]{}\",: 0-9eE.\\-a-z\\\\=&%+]{0,100}".prop_map(String::into_bytes),
            tree().prop_map(|tree| Layout::render(1, &tree).into_bytes()),
        ],
        content_type in prop_oneof![
            Just("application/json".to_string()),
            Just("application/problem+json; charset=utf-8".to_string()),
            Just(FORM.to_string()),
            Just("text/plain".to_string()),
            "[ -~]{0,30}",
        ],
        query in "([a-z]|%[0-9A-Fa-f]{2}|[=&+%]){0,20}",
    ) {
        let rule = rule_of(POINTERS);
        let (mut parts, ()) = http::Request::builder()
            .method("POST")
            .uri(format!("/pay?{query}"))
            .body(())
            .unwrap()
            .into_parts();
        if let Ok(value) = http::HeaderValue::from_str(&content_type) {
            parts.headers.insert(header::CONTENT_TYPE, value);
        }
        let body = Bytes::from(body);
        prop_assert_eq!(rule.fingerprint(&parts, &body), rule.fingerprint(&parts, &body));
    }
}
