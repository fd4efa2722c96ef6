//! Which route a request takes: unmatched requests, a route without methods, and the
//! spellings of one path (doubled slashes, escapes, dot segments, a trailing slash, a
//! redirect to the other slash).

use std::sync::Arc;

use axum::http::StatusCode;
use idem_core::MemoryStore;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmatched_requests_pass_unprotected_or_are_refused() {
    let up = Upstream::default();
    let addr = upstream(up.clone()).await;
    let passing = proxy(&config(addr, ""), Arc::new(MemoryStore::new())).await;
    for _ in 0..2 {
        let free = pay_once(&passing.url("/free"), "acct_1", Some("k6"), "{}").await;
        assert_eq!(free.0, StatusCode::CREATED);
    }
    assert_eq!(up.runs("k6"), 2, "unprotected: a plain reverse proxy");
    passing.shutdown().await;

    let rejecting = proxy(
        &config(addr, "").replace("[defaults]", "unmatched = \"reject\"\n[defaults]"),
        Arc::new(MemoryStore::new()),
    )
    .await;
    let refused = pay_once(&rejecting.url("/free"), "acct_1", Some("k7"), "{}").await;
    assert_eq!(refused.0, StatusCode::NOT_FOUND, "{refused:?}");
    assert_eq!(up.runs("k7"), 0);
    rejecting.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_spelling_of_the_path_is_the_same_route() {
    let (up, proxy) = started("").await;
    let first = pay_once(&proxy.url("/payments"), "acct_1", Some("k15"), "{}").await;
    assert_eq!(first.0, StatusCode::CREATED);
    for spelling in ["//payments", "/pay%6Dents", "/x/../payments", "/./payments"] {
        let retry = pay_once(&proxy.url(spelling), "acct_1", Some("k15"), "{}").await;
        assert_eq!(retry.2, first.2, "{spelling}: {retry:?}");
        assert_eq!(retry.1["idempotent-replayed"], "true", "{spelling}");
    }
    // A trailing slash is the route too.
    let slashed = pay_once(&proxy.url("/payments/"), "acct_1", None, "{}").await;
    assert_eq!(
        slashed.0,
        StatusCode::BAD_REQUEST,
        "the key is required there too"
    );
    assert_eq!(up.runs("k15"), 1);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_without_methods_protects_writes_and_lets_reads_pass() {
    let up = Upstream::default();
    let addr = upstream(up.clone()).await;
    let toml = config(addr, "").replace("[[routes]]", "[[routes]]\npath = \"/any\"\n\n[[routes]]");
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let read = client().get(proxy.url("/any")).send().await.unwrap();
    assert_eq!(read.status().as_u16(), 200, "a read needs no key");
    let write = pay_once(&proxy.url("/any"), "acct_1", None, "{}").await;
    assert_eq!(write.0, StatusCode::BAD_REQUEST, "{write:?}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_segments_sent_as_is_are_the_same_route() {
    let (up, proxy) = started("").await;
    let first = pay_once(&proxy.url("/payments"), "acct_1", Some("k18"), "{}").await;
    assert_eq!(first.0, StatusCode::CREATED);
    // reqwest would resolve these itself: sent raw, as a client could.
    for path in ["/x/../payments", "/./payments", "/payments/%2e%2e/payments"] {
        let answer = raw(
            proxy.addr,
            &format!(
                "POST {path} HTTP/1.1\r\nhost: proxy\r\nx-account-id: acct_1\r\nidempotency-key: k18\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
            ),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 201"), "{path}: {answer}");
        assert!(
            answer.contains("idempotent-replayed: true"),
            "{path}: {answer}"
        );
    }
    assert_eq!(up.runs("k18"), 1);
    proxy.shutdown().await;
}

/// `/payments/` takes the route of `/payments`, and is the same operation: a retry
/// spelled with the trailing `/` is a replay. It had a scope of its own and ran again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_spelled_with_a_trailing_slash_is_the_same_operation() {
    let (up, proxy) = started("").await;
    let first = pay_once(&proxy.url("/payments"), "acct_1", Some("k-slash"), "{}").await;
    assert_eq!(first.0, StatusCode::CREATED);
    let again = pay_once(&proxy.url("/payments/"), "acct_1", Some("k-slash"), "{}").await;
    assert_eq!(again.1["idempotent-replayed"], "true", "{again:?}");
    assert_eq!(again.2, first.2);
    assert_eq!(up.runs("k-slash"), 1);
    proxy.shutdown().await;
}

/// An upstream that redirects `/slashy` to `/slashy/` (Starlette, Werkzeug): both
/// spellings are one operation at the proxy, so the redirect is released, never kept, or
/// the client following it with its key would be replayed the redirect forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_the_other_slash_is_followed_not_replayed() {
    let extra = "[[routes]]\nmethods = [\"POST\"]\npath = \"/slashy\"";
    let (up, proxy) = started(extra).await;
    let answer = pay_once(&proxy.url("/slashy"), "acct_1", Some("k-redirect"), "{}").await;
    assert_eq!(answer.0, StatusCode::CREATED, "{answer:?}");
    assert_eq!(up.runs("k-redirect"), 1);
    // The same operation again, by either spelling: the 201 replayed.
    let again = pay_once(&proxy.url("/slashy"), "acct_1", Some("k-redirect"), "{}").await;
    assert_eq!(again.0, StatusCode::CREATED, "{again:?}");
    assert_eq!(up.runs("k-redirect"), 1);
    proxy.shutdown().await;
}
