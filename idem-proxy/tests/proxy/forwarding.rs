//! What the upstream is sent and what is replayed: headers named in the file, the
//! forwarding headers, and method and path overrides (headers, query, forms).

use std::sync::Arc;
use std::time::Duration;

use idem_core::MemoryStore;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_named_in_the_file_are_replayed_and_forwarding_headers_are_the_proxys() {
    let up = Upstream::default();
    let proxy = proxy(
        &config(
            upstream(up.clone()).await,
            "store_headers = [\"x-charge-id\"]",
        ),
        Arc::new(MemoryStore::new()),
    )
    .await;
    let first = client()
        .post(proxy.url("/payments"))
        .header("x-account-id", "acct_1")
        .header("idempotency-key", "k16")
        .header("content-type", "application/json")
        .header("x-forwarded-for", "203.0.113.9")
        .header("x-forwarded-proto", "https")
        .body("{}")
        .send()
        .await
        .unwrap();
    let charge = first.headers()["x-charge-id"].clone();
    let seen = up.seen.lock().unwrap().clone().unwrap();
    assert_eq!(
        seen["x-forwarded-for"], "127.0.0.1",
        "a client's claim is replaced"
    );
    assert_eq!(seen["x-forwarded-proto"], "http");
    let retry = pay_once(&proxy.url("/payments"), "acct_1", Some("k16"), "{}").await;
    assert_eq!(retry.1["idempotent-replayed"], "true");
    assert_eq!(retry.1["x-charge-id"], charge);
    proxy.shutdown().await;
}

/// A protected route matched one method and path; a request that names another (an
/// override header a trusted gateway let through, `_method` in the query) would have the
/// upstream act on that one under this route's key. Refused with 400, nothing claimed
/// or forwarded; exempt routes are a plain reverse proxy and pass them on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_and_path_overrides_are_refused_on_protected_routes() {
    let up = Upstream::default();
    let addr = upstream(up.clone()).await;
    let toml = config(addr, "").replace("[defaults]", "trust_forwarded_headers = true\n[defaults]");
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let send = |path: &str, header: Option<(&'static str, &'static str)>| {
        let mut request = client()
            .post(proxy.url(path))
            .header("x-account-id", "acct_1")
            .header("content-type", "application/json")
            .header("idempotency-key", "k-override")
            .body("{}");
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        request.send()
    };
    for (path, header) in [
        ("/payments", Some(("x-http-method-override", "DELETE"))),
        ("/payments", Some(("x-original-url", "/admin/refunds"))),
        ("/payments?_method=DELETE", None),
        ("/payments?%5Fmethod=PUT", None),
        // As PHP reads names.
        ("/payments?.method=PUT", None),
        ("/payments?%20_method=PUT", None),
    ] {
        let refused = send(path, header).await.unwrap();
        assert_eq!(refused.status().as_u16(), 400, "{path} {header:?}");
        let body = refused.text().await.unwrap();
        assert!(body.contains("method-override"), "{body}");
    }
    assert_eq!(up.total(), 0, "nothing forwarded");
    // Refused before anything was claimed: the real request runs.
    let real = send("/payments", None).await.unwrap();
    assert_eq!(real.status().as_u16(), 201);
    assert_eq!(up.runs("k-override"), 1);
    // An override naming the request's own method or path changes nothing.
    let same = send("/payments", Some(("x-http-method-override", "POST")))
        .await
        .unwrap();
    assert_eq!(same.status().as_u16(), 201);
    // An unprotected path passes them on, as a plain reverse proxy does.
    let free = send("/free?_method=PUT", Some(("x-http-method-override", "PUT")))
        .await
        .unwrap();
    assert_eq!(free.status().as_u16(), 201);
    proxy.shutdown().await;

    // Without `trust_forwarded_headers` the proxy removes the headers: nothing to refuse
    // (Google's API clients send `X-HTTP-Method-Override` as a matter of course).
    let proxy = self::proxy(&config(addr, ""), Arc::new(MemoryStore::new())).await;
    let plain = client()
        .post(proxy.url("/payments"))
        .header("x-account-id", "acct_1")
        .header("content-type", "application/json")
        .header("idempotency-key", "k-override-2")
        .header("x-http-method-override", "GET")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status().as_u16(), 201);
    let seen = up.seen.lock().unwrap().clone().unwrap();
    assert!(
        !seen.contains_key("x-http-method-override"),
        "removed on the way"
    );
    proxy.shutdown().await;
}

/// Rails, Laravel and Symfony also read `_method` from a form's body: a protected form
/// that names another method is refused before anything is claimed; any other form
/// reaches the upstream whole, however its body arrived; a form over the route's body
/// limit is the layer's 413, as without the check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forms_method_override_is_refused_and_other_forms_pass_whole() {
    let (up, proxy) = started("max_request_body = 200").await;
    let form = |body: &'static str, path: &'static str| {
        client()
            .post(proxy.url(path))
            .header("x-account-id", "acct_1")
            .header(
                "content-type",
                "application/x-www-form-urlencoded; charset=utf-8",
            )
            .header("idempotency-key", "k-form")
            .body(body)
            .send()
    };
    for (body, path) in [
        ("amount=5&_method=DELETE", "/payments"),
        ("_method=PUT", "/payments"),
        // As PHP reads names: `+` is a space, and a leading one goes.
        ("amount=5&+_method=DELETE", "/payments"),
        ("amount=5&%2Emethod=DELETE", "/payments"),
        ("amount=5", "/payments?+_method=DELETE"),
        // PHP ends a name at a NUL.
        ("amount=5&_method%00x=DELETE", "/payments"),
    ] {
        let refused = form(body, path).await.unwrap();
        assert_eq!(refused.status().as_u16(), 400, "{body} {path}");
        assert!(refused.text().await.unwrap().contains("method-override"));
    }
    // A multipart form (an HTML form with a file), and a POST without a content type,
    // which Rack reads as a form.
    let multipart = "--XyZ\r\ncontent-disposition: form-data; name=\"amount\"\r\n\r\n5\r\n--XyZ\r\ncontent-disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--XyZ--\r\n";
    let multipart = client()
        .post(proxy.url("/payments"))
        .header("x-account-id", "acct_1")
        .header("content-type", "multipart/form-data; boundary=XyZ")
        .header("idempotency-key", "k-form")
        .body(multipart)
        .send()
        .await
        .unwrap();
    assert_eq!(multipart.status().as_u16(), 400);
    let untyped = client()
        .post(proxy.url("/payments"))
        .header("x-account-id", "acct_1")
        .header("idempotency-key", "k-form")
        .body("_method=DELETE")
        .send()
        .await
        .unwrap();
    assert_eq!(untyped.status().as_u16(), 400);
    // Laravel reads a JSON body's top level as its input; a multipart body multer cannot
    // read is searched for the name.
    for (content_type, body) in [
        ("application/json", r#"{"amount":5,"_method":"DELETE"}"#),
        ("application/merge-patch+json", r#"{"_method":"PUT"}"#),
        (
            "multipart/form-data; boundary=XyZ",
            "--XyZ\r\nContent-Disposition: form-data; NAME=\"_METHOD\"\r\n\r\nDELETE",
        ),
        (
            "multipart/form-data",
            "--a\r\ncontent-disposition: form-data; name=_method\r\n\r\nPUT\r\n--a--",
        ),
    ] {
        let refused = client()
            .post(proxy.url("/payments"))
            .header("x-account-id", "acct_1")
            .header("content-type", content_type)
            .header("idempotency-key", "k-form")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status().as_u16(), 400, "{content_type} {body}");
    }
    assert_eq!(up.total(), 0, "nothing forwarded");
    // `_method` below the top level, or as a value, is the request's own business.
    let nested = client()
        .post(proxy.url("/payments"))
        .header("x-account-id", "acct_1")
        .header("content-type", "application/json")
        .header("idempotency-key", "k-nested")
        .body(r#"{"meta":{"_method":"DELETE"},"note":"_method"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(nested.status().as_u16(), 201);

    // A form whose length is over the limit is refused at once, before its client sends
    // it (no `100 Continue`).
    let mut socket = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST /payments HTTP/1.1\r\nhost: {}\r\nx-account-id: acct_1\r\nidempotency-key: k-form\r\ncontent-type: application/x-www-form-urlencoded\r\ncontent-length: 10000000\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n",
        proxy.addr
    );
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut answer = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut answer))
        .await
        .expect("answered within 10 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // A form sent in pieces, by a client on a raw socket: read ahead, then forwarded whole.
    let body = "amount=5&method_note=x&note=_method";
    let mut socket = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST /payments HTTP/1.1\r\nhost: {}\r\nx-account-id: acct_1\r\nidempotency-key: k-form\r\ncontent-type: application/x-www-form-urlencoded\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        proxy.addr,
        body.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(&body.as_bytes()[..10]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    socket.write_all(&body.as_bytes()[10..]).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_string(&mut answer))
        .await
        .expect("answered within 10 s")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(
        answer.contains(body),
        "the whole form reached the upstream: {answer}"
    );
    assert_eq!(up.runs("k-form"), 1);

    // Over the limit: the layer's own refusal.
    let long = form(
        "amount=5&memo=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "/payments",
    )
    .await
    .unwrap();
    assert_eq!(long.status().as_u16(), 413);
    assert_eq!(up.runs("k-form"), 1);
    proxy.shutdown().await;
}
