//! The request fingerprint's tests, by the part of a request they read, and the
//! helpers they share.

use super::*;

mod assembly;
mod json;
mod json_generators;
mod urlencoded;

fn parts(method: &str, uri: &str, content_type: &str) -> Parts {
    let (parts, ()) = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", content_type)
        .body(())
        .unwrap()
        .into_parts();
    parts
}

fn fp(rule: &FingerprintRule, method: &str, uri: &str, body: &str) -> Fingerprint {
    rule.fingerprint(
        &parts(method, uri, "application/json; charset=utf-8"),
        &Bytes::copy_from_slice(body.as_bytes()),
    )
}

fn with_type(rule: &FingerprintRule, uri: &str, content_type: &str, body: &str) -> Fingerprint {
    rule.fingerprint(
        &parts("POST", uri, content_type),
        &Bytes::copy_from_slice(body.as_bytes()),
    )
}

const FORM: &str = "application/x-www-form-urlencoded";

fn rule_of(ignored: &[&str]) -> FingerprintRule {
    FingerprintRule::Default {
        ignored: ignored.iter().map(|field| field.to_string()).collect(),
    }
}

const POINTERS: &[&str] = &[
    "a", "/b", "/a/0", "/b/c", "/c~1d", "/c~0d/1", "/0/a", "/", "//", "/a/01", "/a/+1", "/b/-",
    "/b/c/0/a",
];
