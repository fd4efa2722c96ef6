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

/// More of the format, digit for digit: a multipart form by its parts (a named field, a
/// file with its name and type, a part with neither), fields left out by name and by JSON
/// Pointer, JSON strings that need escaping and escapes in the input, numbers in other
/// forms, and a `+json` media type in capitals.
#[test]
fn more_fingerprints_are_pinned_digit_for_digit() {
    let rule = FingerprintRule::default();
    let part = |name: Option<&str>,
                file_name: Option<&str>,
                content_type: Option<&str>,
                bytes: &'static [u8]| crate::request_body::Part {
        name: name.map(str::to_owned),
        file_name: file_name.map(str::to_owned),
        content_type: content_type.map(str::to_owned),
        bytes: Bytes::from_static(bytes),
    };
    let multipart = |rule: &FingerprintRule| {
        rule.fingerprint_of(
            &parts("POST", "/upload?x=1", "multipart/form-data; boundary=b"),
            &Bytes::from_static(b"(the raw body, which a default rule does not read)"),
            &Content::Multipart(vec![
                part(Some("amount"), None, None, b"500"),
                part(
                    Some("receipt"),
                    Some("r.pdf"),
                    Some("application/pdf"),
                    b"%PDF\x00",
                ),
                part(None, None, Some("text/plain"), b""),
            ]),
        )
    };
    let ignoring = rule_of(&["sent_at", "/meta/trace"]);
    let ignored_json = fp(
        &ignoring,
        "POST",
        "/checkout",
        r#"{"amount":500,"sent_at":"now","meta":{"trace":"t1","id":7}}"#,
    );
    let ignored_form = with_type(&ignoring, "/checkout", FORM, "amount=500&sent_at=now");
    let escapes = fp(
        &rule,
        "POST",
        "/notes",
        r#"{"note":"caf\u00e9 \"quoted\"\n\u0001","caf\u00e9":"\/","é":"é"}"#,
    );
    let numbers = fp(
        &rule,
        "POST",
        "/numbers",
        r#"[1e3,-0,1E+3,0.1,100000000000000000000,-1.5e-7,12345678901234567890123]"#,
    );
    let suffix = with_type(
        &rule,
        "/problems",
        "Application/Problem+JSON; charset=UTF-8",
        r#"{"b":1,"a":2}"#,
    );
    assert_eq!(
        [
            hex(multipart(&rule)),
            hex(multipart(&rule_of(&["amount"]))),
            hex(ignored_json),
            hex(ignored_form),
            hex(escapes),
            hex(numbers),
            hex(suffix),
        ],
        [
            "85696ee115c731fa31df911be2fa38b1c56322d74ac7ecf9c26fba3b3a0b7716",
            "79b4663ca31c664edbdad39c7aa74ae094f27c357c560197b6da56dd562ef783",
            "1c874ec48e0d23439f05354736ba03b0665ed6c95231b115b3697f7e480ded8d",
            "b3dd4dbae7dbfb7038297434075eb74a763d38fdb34024c2bd0d1e45fdb89944",
            "149cdca2c94941f9dd76d0783cf79cee7d62673789f44559f9e429a2b73c0f5d",
            "d56fc8cd6a04a594db6cd0a4e4ffccbe37d8332c2c4fb9352b804769af6031fd",
            "e3b00701dc4f4b1277e0d476d54dca52124b101c2d2b7292676e3b9f5bdcfcc9",
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
