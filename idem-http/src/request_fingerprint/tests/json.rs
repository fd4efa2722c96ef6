//! JSON bodies: what counts (digits, values) and what does not (order, layout,
//! escapes, ignored fields), and the parser against serde_json.

use proptest::prelude::*;

use super::json_generators::{Layout, json_value, numbers_of, tree};
use super::*;
use crate::request_fingerprint::json_canonical::canonical_number;

#[test]
fn json_key_order_does_not_matter_and_everything_else_does() {
    let rule = FingerprintRule::default();
    let a = fp(
        &rule,
        "POST",
        "/pay?x=1",
        r#"{"amount":500,"currency":"EUR"}"#,
    );
    assert_eq!(
        a,
        fp(
            &rule,
            "POST",
            "/pay?x=1",
            r#"{ "currency": "EUR", "amount": 500 }"#
        )
    );
    assert_ne!(
        a,
        fp(
            &rule,
            "POST",
            "/pay?x=1",
            r#"{"amount":501,"currency":"EUR"}"#
        )
    );
    assert_ne!(
        a,
        fp(
            &rule,
            "PATCH",
            "/pay?x=1",
            r#"{"amount":500,"currency":"EUR"}"#
        )
    );
    assert_ne!(
        a,
        fp(
            &rule,
            "POST",
            "/pay?x=2",
            r#"{"amount":500,"currency":"EUR"}"#
        )
    );
    assert_ne!(
        a,
        fp(
            &rule,
            "POST",
            "/other?x=1",
            r#"{"amount":500,"currency":"EUR"}"#
        )
    );
}

#[test]
fn ignored_fields_by_name_and_by_pointer() {
    let rule = FingerprintRule::Default {
        ignored: Arc::from(["sent_at".to_string(), "/meta/trace_id".to_string()]),
    };
    let a = fp(
        &rule,
        "POST",
        "/pay",
        r#"{"amount":5,"sent_at":"10:00","meta":{"trace_id":"a","v":1}}"#,
    );
    let b = fp(
        &rule,
        "POST",
        "/pay",
        r#"{"amount":5,"sent_at":"10:01","meta":{"trace_id":"b","v":1}}"#,
    );
    assert_eq!(a, b);
    let c = fp(
        &rule,
        "POST",
        "/pay",
        r#"{"amount":5,"sent_at":"10:01","meta":{"trace_id":"b","v":2}}"#,
    );
    assert_ne!(a, c, "fields not ignored still count");
}

#[test]
fn integers_read_without_parsing_print_as_serde_json_prints_them() {
    for text in [
        "0",
        "-0",
        "7",
        "-5",
        "500",
        "999999999999999999",
        "-999999999999999999",
        "1000000000000000000",
        "18446744073709551615",
    ] {
        let printed = serde_json::from_str::<serde_json::Number>(text)
            .unwrap()
            .to_string();
        assert_eq!(canonical_number(text), printed, "{text}");
    }
}

#[test]
fn json_numbers_count_by_their_digits() {
    let rule = FingerprintRule::default();
    let json = |body: &str| fp(&rule, "POST", "/pay", body);
    assert_ne!(
        json(r#"{"amount":18446744073709551617}"#),
        json(r#"{"amount":18446744073709551618}"#)
    );
    assert_ne!(
        json(r#"{"amount":-9223372036854775809}"#),
        json(r#"{"amount":-9223372036854775810}"#)
    );
    assert_ne!(
        json(r#"{"rate":0.1000000000000000000001}"#),
        json(r#"{"rate":0.1}"#)
    );
    assert_ne!(json("[1e400]"), json("[2e400]"));
    // serde_json reads 1e-400 as 0.0.
    assert_ne!(json("[1e-400]"), json("[0.0]"));
    assert_ne!(json("1"), json("1.0"));
    // The same digits, however the body is laid out, are the same request.
    assert_eq!(
        json(r#"{"b":18446744073709551617,"a":[0.1000000000000000000001]}"#),
        json("{ \"a\" : [ 0.1000000000000000000001 ] ,\n \"b\":18446744073709551617 }")
    );
    assert_eq!(
        json(r#"{"s":"\u0041\u00e9\ud83d\ude00"}"#),
        json(r#"{"s":"Aé😀"}"#)
    );
    // Duplicate names: the last one counts, as serde_json has it.
    assert_eq!(json(r#"{"a":1,"a":2}"#), json(r#"{"a":2}"#));
}

/// The JSON fingerprint as it was before numbers kept their text, for a request
/// without a query, with its `remove` on serde_json's `Value`.
fn before(ignored: &[&str], body: &[u8]) -> Fingerprint {
    fn remove(value: &mut serde_json::Value, field: &str) {
        use serde_json::Value;
        let Some(pointer) = field.strip_prefix('/') else {
            if let Value::Object(map) = value {
                map.remove(field);
            }
            return;
        };
        let (parent, last) = match pointer.rsplit_once('/') {
            Some((parent, last)) => (format!("/{parent}"), last),
            None => (String::new(), pointer),
        };
        let last = last.replace("~1", "/").replace("~0", "~");
        match value.pointer_mut(&parent) {
            Some(Value::Object(map)) => {
                map.remove(&last);
            }
            Some(Value::Array(items)) => {
                if let Ok(index) = last.parse::<usize>() {
                    if index < items.len() {
                        items.remove(index);
                    }
                }
            }
            _ => {}
        }
    }
    let mut value: serde_json::Value = serde_json::from_slice(body).unwrap();
    for field in ignored {
        remove(&mut value, field);
    }
    Fingerprint::builder()
        .field("POST")
        .field("/pay")
        .field("")
        .field("json")
        .field(Fingerprint::of_json(&value).unwrap().as_bytes())
        .finish()
}

#[test]
fn bodies_serde_json_reads_exactly_keep_their_fingerprint() {
    for body in [
        r#"{"amount":500,"currency":"EUR","meta":{"at":1.5,"n":-3,"z":-0}}"#,
        r#"[1e5, 100000.0, 12.50, 0.1, 1E-7, -0.0, 18446744073709552000, 1e+5, 0.0000001, 1e-07]"#,
        r#"{"s":"\u0041\n\t\b\f\r\u001f\u007f\"\\\/é😀","":null,"t":[true,false]}"#,
        r#"{"a":[{"x":1},{"y":2},{"z":3}],"b":{"c":[1,2,3]},"c/d":4,"c~d":[5,6]}"#,
        r#"{"a":1,"a":2}"#,
        r#"{"b":1,"a":2,"b":3,"a":4,"c":{"y":1,"x":2,"y":3,"x":{"q":1,"p":2}},"a":5}"#,
        r#"{"z":1,"y":2,"x":3,"w":4,"v":5,"u":6,"t":7,"s":8,"r":9,"q":10,"p":11,"o":12,"n":13}"#,
        r#"{"":1,"a":2,"":3,"é":4,"e":5}"#,
        "  \n[]\t",
    ] {
        assert_fingerprints_as_before(body);
    }
}

/// `body` fingerprints as it did before numbers kept their text, whole and without the
/// fields of [`POINTERS`].
fn assert_fingerprints_as_before(body: &str) {
    let parts = parts("POST", "/pay", "application/json");
    let body_bytes = Bytes::copy_from_slice(body.as_bytes());
    assert_eq!(
        rule_of(&[]).fingerprint(&parts, &body_bytes),
        before(&[], body.as_bytes()),
        "{body}"
    );
    assert_eq!(
        rule_of(POINTERS).fingerprint(&parts, &body_bytes),
        before(POINTERS, body.as_bytes()),
        "{body} without {POINTERS:?}"
    );
}

#[test]
fn ignored_pointers_with_escapes_and_indices() {
    let rule = rule_of(&["/a~1b/1", "/c~0d/x", "/list/0/id"]);
    let json = |body: &str| fp(&rule, "POST", "/pay", body);
    assert_eq!(
        json(r#"{"a/b":[1,2,3],"c~d":{"x":1,"y":2},"list":[{"id":7,"v":1}]}"#),
        json(r#"{"a/b":[1,9,3],"c~d":{"x":5,"y":2},"list":[{"id":8,"v":1}]}"#)
    );
    assert_ne!(
        json(r#"{"a/b":[1,2,3],"c~d":{"x":1,"y":2},"list":[{"id":7,"v":1}]}"#),
        json(r#"{"a/b":[1,2,4],"c~d":{"x":1,"y":2},"list":[{"id":7,"v":1}]}"#)
    );
}

/// An index on the way to a field is read as serde_json's `pointer_mut` reads it (no
/// sign, no leading zero), and a last index one past the end removes nothing.
#[test]
fn ignored_pointers_with_indices_serde_json_refuses() {
    const IGNORED: &[&str] = &["/list/+1/id", "/list/01/id", "/list/2"];
    let rule = rule_of(IGNORED);
    let body = r#"{"list":[{"id":7},{"id":8}]}"#;
    assert_eq!(json_fp(&rule, body), before(IGNORED, body.as_bytes()));
    assert_ne!(
        json_fp(&rule, body),
        json_fp(&rule, r#"{"list":[{"id":7},{"id":9}]}"#)
    );
}

#[test]
fn nesting_beyond_serde_jsons_limit_counts_as_bytes() {
    for depth in [126, 127, 128, 129] {
        let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let serde = serde_json::from_str::<serde_json::Value>(&body).is_ok();
        assert_eq!(Parser::parse(body.as_bytes()).is_some(), serde, "{depth}");
        assert_eq!(serde, depth <= 127);
    }
}

#[test]
fn what_serde_json_refuses_is_refused() {
    for body in [
        "",
        " ",
        "01",
        "-",
        "1.",
        ".5",
        "+1",
        "1e",
        "1e+",
        "[1,]",
        "{\"a\":1,}",
        "{a:1}",
        "[1 2]",
        "nul",
        "truex",
        "\"\\u12\"",
        "\"\\u+123\"",
        "\"\\ud800\"",
        "\"\\udc00\"",
        "\"\\ud800\\u0041\"",
        "\"\\x\"",
        "\"a\u{1}\"",
        "\"abc",
        "[",
        "{\"a\"}",
        "\u{feff}{}",
        "NaN",
        "[Infinity]",
        "{}{}",
        "1 2",
    ] {
        assert!(
            serde_json::from_str::<serde_json::Value>(body).is_err(),
            "{body:?}"
        );
        assert!(Parser::parse(body.as_bytes()).is_none(), "{body:?}");
    }
    assert!(Parser::parse(b"\"\xff\"").is_none());
}

fn json_fp(rule: &FingerprintRule, body: &str) -> Fingerprint {
    rule.fingerprint(
        &parts("POST", "/pay", "application/json"),
        &Bytes::copy_from_slice(body.as_bytes()),
    )
}

proptest! {
    #![proptest_config(idem_testkit::fuzz_config())]

    /// Key order, whitespace and string escapes do not count; one number's digits do.
    #[test]
    fn json_layout_does_not_count_and_digits_do(
        mut tree in tree(),
        seeds in any::<[u64; 3]>(),
        choice in any::<usize>(),
    ) {
        let rule = FingerprintRule::default();
        let a = Layout::render(seeds[0], &tree);
        let b = Layout::render(seeds[1], &tree);
        prop_assert!(Parser::parse(a.as_bytes()).is_some(), "{}", a);
        prop_assert_eq!(json_fp(&rule, &a), json_fp(&rule, &b), "{} vs {}", a, b);
        let mut numbers = numbers_of(&mut tree);
        if !numbers.is_empty() {
            let count = numbers.len();
            numbers[choice % count].change_a_digit(choice / count);
            let c = Layout::render(seeds[2], &tree);
            prop_assert_ne!(json_fp(&rule, &a), json_fp(&rule, &c), "{} vs {}", a, c);
        }
    }

    /// A body serde_json reads exactly fingerprints as it did before, ignored fields
    /// and all.
    #[test]
    fn json_fingerprints_are_what_they_were(value in json_value()) {
        let body = serde_json::to_string(&value).unwrap();
        let parts = parts("POST", "/pay", "application/json");
        let bytes = Bytes::copy_from_slice(body.as_bytes());
        prop_assert_eq!(rule_of(&[]).fingerprint(&parts, &bytes), before(&[], body.as_bytes()));
        prop_assert_eq!(
            rule_of(POINTERS).fingerprint(&parts, &bytes),
            before(POINTERS, body.as_bytes())
        );
    }

    /// Objects whose names repeat, in any order, some written with escapes that decode
    /// to another member's name, fingerprint as serde_json reads them: each name once,
    /// with its last value, ignored fields and all.
    #[test]
    fn repeated_and_escaped_names_read_as_serde_json_reads_them(
        members in prop::collection::vec((0..8usize, 0..100u32, any::<bool>()), 0..40),
    ) {
        // Pairs of spellings of one name: plain, and with an escape.
        const NAMES: [&str; 8] = ["a", "\\u0061", "b", "\\u0062", "c~d", "c~\\u0064", "é", "\\u00e9"];
        let body = |nested: bool| {
            let inner = members
                .iter()
                .map(|(name, value, object)| {
                    if *object && nested {
                        format!(r#""{}":{{"{}":{value},"a":[{value}]}}"#, NAMES[*name], NAMES[*value as usize % 8])
                    } else {
                        format!(r#""{}":{value}"#, NAMES[*name])
                    }
                })
                .collect::<Vec<_>>()
                .join(",");
            format!("{{{inner}}}")
        };
        let parts = parts("POST", "/pay", "application/json");
        for nested in [false, true] {
            let body = body(nested);
            let bytes = Bytes::copy_from_slice(body.as_bytes());
            prop_assert_eq!(
                rule_of(&[]).fingerprint(&parts, &bytes),
                before(&[], body.as_bytes()),
                "{}", body
            );
            // Pointers into these bodies: a name written with an escape, members of
            // nested objects, an element of a nested array.
            for ignored in [POINTERS, &["/c~0d", "/é/a", "/a/a/0", "/b/é", "b"]] {
                prop_assert_eq!(
                    rule_of(ignored).fingerprint(&parts, &bytes),
                    before(ignored, body.as_bytes()),
                    "{} without {:?}", body, ignored
                );
            }
        }
    }

    /// The parser takes what serde_json takes, but for numbers beyond an f64.
    #[test]
    fn parser_accepts_what_serde_json_accepts(
        body in prop_oneof![
            "[\\[\\]{}\",: \n0-9eE.+\\-tfnrulasx\\\\]{0,40}",
            proptest::collection::vec(any::<u8>(), 0..40)
                .prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
            tree().prop_map(|tree| Layout::render(7, &tree)),
        ],
        cut in any::<usize>(),
    ) {
        let body = body.as_bytes();
        // Mangled by a cut, a valid body is a boundary case.
        for body in [body, &body[..cut % (body.len() + 1)]] {
            let serde = serde_json::from_slice::<serde_json::Value>(body);
            let ours = Parser::parse(body).is_some();
            match serde {
                Ok(_) => prop_assert!(ours, "{:?}", String::from_utf8_lossy(body)),
                Err(err) if err.to_string().starts_with("number out of range") => {}
                Err(err) => prop_assert!(!ours, "{:?}: {}", String::from_utf8_lossy(body), err),
            }
        }
    }
}

#[test]
fn many_repeated_names_keep_their_last_values_as_serde_json_does() {
    // Enough members that the sort is not a plain insertion sort: ten names, each five
    // times with a different value, in an order that mixes them.
    let members: Vec<String> = (0..50)
        .map(|i| format!(r#""n{}":{i}"#, (i * 7) % 10))
        .collect();
    let body = format!("{{{}}}", members.join(","));
    assert_fingerprints_as_before(&body);
    // Each name's last value counts, whatever came before it.
    let last: Vec<String> = (40..50)
        .map(|i| format!(r#""n{}":{i}"#, (i * 7) % 10))
        .collect();
    let rule = rule_of(&[]);
    assert_eq!(
        json_fp(&rule, &body),
        json_fp(&rule, &format!("{{{}}}", last.join(",")))
    );
}
