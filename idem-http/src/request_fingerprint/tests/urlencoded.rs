//! Query strings and form bodies: pairs in any order, decoded as form_urlencoded does.

use proptest::prelude::*;

use super::*;

#[test]
fn query_pairs_in_any_order_are_the_same_request() {
    let rule = FingerprintRule::default();
    let q = |uri: &str| fp(&rule, "POST", uri, "{}");
    assert_eq!(q("/pay?a=1&b=2"), q("/pay?b=2&a=1"));
    assert_eq!(q("/pay?a=%20"), q("/pay?a=+"), "decoded alike");
    assert_eq!(q("/pay?a=x&&b=y"), q("/pay?b=y&a=x"));
    assert_eq!(q("/pay"), q("/pay?"));
    // A repeated name keeps its order.
    assert_ne!(q("/pay?a=1&a=2"), q("/pay?a=2&a=1"));
    assert_eq!(q("/pay?a=1&b=0&a=2"), q("/pay?b=0&a=1&a=2"));
    // Framing: one pair holding "&" and "=" is not two pairs.
    assert_ne!(q("/pay?a=1%26b%3D2"), q("/pay?a=1&b=2"));
    assert_ne!(q("/pay?a%3D1=2"), q("/pay?a=1%3D2"));
    // Bytes that are not UTF-8 are not merged into one replacement character.
    assert_ne!(q("/pay?a=%FF"), q("/pay?a=%FE"));
    assert_ne!(q("/pay?a=1"), q("/pay?a=2"));
    assert_ne!(q("/pay?a=1"), q("/pay"));
}

#[test]
fn form_bodies_in_any_order_are_the_same_request() {
    let rule = FingerprintRule::Default {
        ignored: Arc::from(["sent_at".to_string(), "/amount".to_string()]),
    };
    let form = |body: &str| with_type(&rule, "/pay", FORM, body);
    assert_eq!(
        form("amount=500&currency=EUR"),
        form("currency=EUR&amount=500")
    );
    assert_eq!(
        form("amount=500&currency=EUR"),
        with_type(
            &rule,
            "/pay",
            "Application/X-WWW-Form-Urlencoded; charset=utf-8",
            "currency=EUR&amount=500"
        )
    );
    assert_eq!(form("a=%20&b=c"), form("b=c&a=+"));
    assert_ne!(form("a=1&a=2"), form("a=2&a=1"));
    assert_ne!(form("amount=500"), form("amount=501"));
    // A top-level name is left out; a JSON Pointer is for JSON only.
    assert_eq!(
        form("amount=5&sent_at=10%3A00"),
        form("sent_at=10%3A01&amount=5")
    );
    assert_eq!(form("amount=5&sent_at=1&sent_at=2"), form("amount=5"));
    assert_ne!(form("amount=5"), form("amount=6"));
    // Body kinds never collide.
    let body = "amount=500";
    assert_ne!(form(body), with_type(&rule, "/pay", "text/plain", body));
    assert_ne!(
        with_type(&rule, "/pay", FORM, "{}"),
        with_type(&rule, "/pay", "application/json", "{}")
    );
}

proptest! {
    #![proptest_config(idem_testkit::fuzz_config())]

    /// Pairs are split and decoded as form_urlencoded does, where it does not replace
    /// bytes that are not UTF-8.
    #[test]
    fn form_pairs_are_form_urlencodeds(
        input in prop_oneof![
            "[a-c=&+% 0-9A-F]{0,30}",
            "([a-c]|%[0-9A-Fa-f]{2}|[=&+%]){0,20}",
        ],
    ) {
        let ours = form_pairs(input.as_bytes());
        let theirs: Vec<_> = form_urlencoded::parse(input.as_bytes()).collect();
        prop_assert_eq!(ours.len(), theirs.len());
        for ((name, value), (their_name, their_value)) in ours.iter().zip(&theirs) {
            if let (Ok(name), Ok(value)) = (std::str::from_utf8(name), std::str::from_utf8(value)) {
                prop_assert_eq!(name, their_name);
                prop_assert_eq!(value, their_value);
            }
        }
    }
}
