//! The proxy in front of a real HTTP upstream on 127.0.0.1, in process: what clients get
//! and how many times the upstream ran.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use common::*;
use idem_core::{MemoryStore, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_answered_with_the_first_response_and_the_upstream_runs_once() {
    let up = Upstream::default();
    let addr = upstream(up.clone()).await;
    let proxy = proxy(&config(addr, ""), Arc::new(MemoryStore::new())).await;
    let url = proxy.url("/payments");

    let first = pay_once(&url, "acct_1", Some("k1"), r#"{"amount":5,"sent_at":1}"#).await;
    assert_eq!(first.0, StatusCode::CREATED, "{first:?}");
    // The same request again, its timestamp changed (ignored), its members reordered.
    let retry = pay_once(&url, "acct_1", Some("k1"), r#"{"sent_at":2, "amount":5}"#).await;
    assert_eq!(retry.0, StatusCode::CREATED);
    assert_eq!(retry.2, first.2, "the first response, byte for byte");
    assert_eq!(retry.1["idempotent-replayed"], "true");
    assert_eq!(up.runs("k1"), 1);

    // Another body under the key: 422, nothing runs.
    let changed = pay_once(&url, "acct_1", Some("k1"), r#"{"amount":6}"#).await;
    assert_eq!(changed.0, StatusCode::UNPROCESSABLE_ENTITY, "{changed:?}");
    // Another account's same key is its own operation.
    let other = pay_once(&url, "acct_2", Some("k1"), r#"{"amount":5}"#).await;
    assert_eq!(other.0, StatusCode::CREATED);
    assert_ne!(other.2, first.2);
    assert_eq!(up.runs("k1"), 2);

    // The upstream saw the key, and where the request came from; no hop-by-hop header.
    let seen = up.seen.lock().unwrap().clone().unwrap();
    assert_eq!(seen["idempotency-key"], "k1");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(
        seen["host"],
        addr.to_string().as_str(),
        "the upstream's own authority"
    );
    assert_eq!(seen["x-forwarded-host"], proxy.addr.to_string().as_str());
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_required_scopes_too_and_refusals_run_nothing() {
    let (up, proxy) = started("").await;
    let url = proxy.url("/payments");

    let no_key = pay_once(&url, "acct_1", None, "{}").await;
    assert_eq!(no_key.0, StatusCode::BAD_REQUEST, "{no_key:?}");
    assert!(no_key.2.contains("missing-key"), "{no_key:?}");

    let response = client()
        .post(&url)
        .header("idempotency-key", "k2")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401, "no account, no scope");
    assert_eq!(up.total(), 0);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_releases_the_key_and_a_silent_one_holds_it() {
    // Nothing listens on the upstream's port: 502, and the key is free for the retry.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = free.local_addr().unwrap();
    drop(free);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let unreachable = proxy(&config(dead, ""), Arc::clone(&store)).await;
    let first = pay_once(&unreachable.url("/payments"), "acct_1", Some("k3"), "{}").await;
    assert_eq!(first.0, StatusCode::BAD_GATEWAY, "{first:?}");
    assert!(first.2.contains("upstream-unreachable"), "{first:?}");
    unreachable.shutdown().await;

    // The same store, the upstream now up: the retry runs.
    let up = Upstream::default();
    let live = proxy(
        &config(upstream(up.clone()).await, "lease = \"3s\""),
        Arc::clone(&store),
    )
    .await;
    let retry = pay_once(&live.url("/payments"), "acct_1", Some("k3"), "{}").await;
    assert_eq!(retry.0, StatusCode::CREATED, "{retry:?}");
    assert_eq!(up.runs("k3"), 1);

    // An upstream slower than upstream_timeout (2 s): 504, and the key is held, since
    // the payment may have happened; a retry within the lease is 409.
    *up.delay.lock().unwrap() = Duration::from_millis(2500);
    let slow = pay_once(&live.url("/payments"), "acct_1", Some("k4"), "{}").await;
    assert_eq!(slow.0, StatusCode::GATEWAY_TIMEOUT, "{slow:?}");
    *up.delay.lock().unwrap() = Duration::ZERO;
    // Held for the lease (3 s from the last heartbeat): the retry at once is 409.
    let held = pay_once(&live.url("/payments"), "acct_1", Some("k4"), "{}").await;
    assert_eq!(held.0, StatusCode::CONFLICT, "{held:?}");
    assert!(held.1.contains_key("retry-after"));
    // Once the lease is over, a retry takes over and runs it (this upstream dropped the
    // first run when the proxy hung up; one that finished it would be asked again, under
    // the same key, which is why the lease should cover the upstream's longest call).
    tokio::time::sleep(Duration::from_millis(3300)).await;
    let taken_over = pay_once(&live.url("/payments"), "acct_1", Some("k4"), "{}").await;
    assert_eq!(taken_over.0, StatusCode::CREATED, "{taken_over:?}");
    live.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_policy_releases_what_the_upstream_says_did_nothing() {
    let (up, proxy) = started("status = { release = [409] }").await;
    let url = proxy.url("/payments");
    *up.status.lock().unwrap() = Some(StatusCode::CONFLICT);
    let first = pay_once(&url, "acct_1", Some("k5"), "{}").await;
    assert_eq!(first.0, StatusCode::CONFLICT);
    // Released: the retry reaches the upstream again.
    *up.status.lock().unwrap() = None;
    let retry = pay_once(&url, "acct_1", Some("k5"), "{}").await;
    assert_eq!(retry.0, StatusCode::CREATED, "{retry:?}");
    assert_eq!(up.runs("k5"), 2);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstreams_408_is_held_unless_the_route_releases_it() {
    // By default a 408 is held: after the proxy sent the whole request, it is a timeout
    // that may have cut the upstream off after its effect.
    let (up, proxy) = started("").await;
    let url = proxy.url("/payments");
    *up.status.lock().unwrap() = Some(StatusCode::REQUEST_TIMEOUT);
    assert_eq!(
        pay_once(&url, "acct_1", Some("k408"), "{}").await.0,
        StatusCode::REQUEST_TIMEOUT
    );
    *up.status.lock().unwrap() = None;
    let held = pay_once(&url, "acct_1", Some("k408"), "{}").await;
    assert_eq!(held.0, StatusCode::CONFLICT, "{held:?}");
    assert_eq!(up.runs("k408"), 1);
    proxy.shutdown().await;
    // An upstream whose 408 means "your body came too slowly, nothing ran" says so.
    let (up, proxy) = started("status = { release = [408] }").await;
    let url = proxy.url("/payments");
    *up.status.lock().unwrap() = Some(StatusCode::REQUEST_TIMEOUT);
    pay_once(&url, "acct_1", Some("k408"), "{}").await;
    *up.status.lock().unwrap() = None;
    let again = pay_once(&url, "acct_1", Some("k408"), "{}").await;
    assert_eq!(again.0, StatusCode::CREATED, "{again:?}");
    assert_eq!(up.runs("k408"), 2);
    proxy.shutdown().await;
}

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
async fn an_upstream_path_prefix_is_kept() {
    let up = Upstream::default();
    let addr = upstream(up.clone()).await;
    let toml = config(addr, "").replace(
        &format!("upstream = \"http://{addr}\""),
        &format!("upstream = \"http://{addr}/v1/\""),
    );
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let paid = pay_once(&proxy.url("/payments"), "acct_1", Some("k8"), "{}").await;
    assert_eq!(paid.0, StatusCode::CREATED, "{paid:?}");
    assert_eq!(up.runs("k8"), 1);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_still_gets_the_answer_on_its_retry() {
    let (up, proxy) = started("").await;
    let url = proxy.url("/payments");
    *up.delay.lock().unwrap() = Duration::from_millis(500);
    // The client gives up after 100 ms, while the upstream works.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let gone = impatient
        .post(&url)
        .header("x-account-id", "acct_1")
        .header("content-type", "application/json")
        .header("idempotency-key", "k9")
        .body("{}")
        .send()
        .await;
    assert!(gone.is_err(), "the client timed out");
    *up.delay.lock().unwrap() = Duration::ZERO;
    // Its retry, once the upstream finished, replays the answer.
    let mut answer = None;
    for _ in 0..50 {
        let retry = pay_once(&url, "acct_1", Some("k9"), "{}").await;
        if retry.0 == StatusCode::CREATED {
            answer = Some(retry);
            break;
        }
        assert_eq!(retry.0, StatusCode::CONFLICT, "{retry:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = answer.expect("the answer was stored");
    assert_eq!(answer.1["idempotent-replayed"], "true");
    assert_eq!(up.runs("k9"), 1);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_lets_the_request_in_flight_finish_and_store_its_answer() {
    let up = Upstream::default();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let addr = upstream(up.clone()).await;
    let first = proxy(&config(addr, ""), Arc::clone(&store)).await;
    *up.delay.lock().unwrap() = Duration::from_millis(800);
    let url = first.url("/payments");
    let arrived = up.arrived.notified();
    let in_flight = tokio::spawn(async move { pay_once(&url, "acct_1", Some("k10"), "{}").await });
    tokio::time::timeout(Duration::from_secs(10), arrived)
        .await
        .expect("the request reaches the upstream");
    let admin = first.admin;
    // Readiness turns 503 as the shutdown begins, while the request runs on.
    let stop = tokio::spawn(first.shutdown());
    let mut not_ready = false;
    for _ in 0..40 {
        let ready = client()
            .get(format!("http://{admin}/readyz"))
            .send()
            .await
            .expect("the admin listener serves until the requests in flight are done");
        if ready.status().as_u16() == 503 {
            not_ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(not_ready, "/readyz turned 503 once the shutdown began");
    let answered = in_flight.await.unwrap();
    assert_eq!(answered.0, StatusCode::CREATED, "{answered:?}");
    stop.await.unwrap();

    // Another replica on the same store replays it.
    *up.delay.lock().unwrap() = Duration::ZERO;
    let second = proxy(&config(addr, ""), store).await;
    let replay = pay_once(&second.url("/payments"), "acct_1", Some("k10"), "{}").await;
    assert_eq!(replay.2, answered.2);
    assert_eq!(replay.1["idempotent-replayed"], "true");
    assert_eq!(up.runs("k10"), 1);
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_readiness_answer_on_the_admin_listener() {
    let up = Upstream::default();
    let proxy = proxy(
        &config(upstream(up).await, ""),
        Arc::new(MemoryStore::new()),
    )
    .await;
    let health = client()
        .get(format!("http://{}/healthz", proxy.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let ready = client()
        .get(format!("http://{}/readyz", proxy.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status().as_u16(), 200);
    // No recorder was given in this process: /metrics says so.
    let metrics = client()
        .get(format!("http://{}/metrics", proxy.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status().as_u16(), 404);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_token_claim_scopes_keys_and_a_forged_token_is_refused() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
    let keys = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/keys");
    let up = Upstream::default();
    let addr = upstream(up.clone()).await;
    let toml = config(addr, "").replace(
        "scope = { header = \"x-account-id\" }",
        &format!(
            "scope = {{ jwt_claim = \"sub\", algorithm = \"ES256\", public_key_pem = \"{keys}/es256-public.pem\" }}"
        ),
    );
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let private = std::fs::read(format!("{keys}/es256-private.pem")).unwrap();
    let signer = EncodingKey::from_ec_pem(&private).unwrap();
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let token = |sub: &str, iat: u64| {
        encode(
            &Header::new(Algorithm::ES256),
            &serde_json::json!({ "sub": sub, "exp": exp, "iat": iat }),
            &signer,
        )
        .unwrap()
    };
    let send = |token: String| {
        let url = proxy.url("/payments");
        async move {
            client()
                .post(url)
                .bearer_auth(token)
                .header("idempotency-key", "k11")
                .body("{}")
                .send()
                .await
                .unwrap()
        }
    };
    let first = send(token("user_1", 1)).await;
    assert_eq!(first.status().as_u16(), 201);
    // `aud` and `iss` are not checked unless the file names them: a token with them is
    // taken (identity providers put both in every token).
    let with_aud = encode(
        &Header::new(Algorithm::ES256),
        &serde_json::json!({ "sub": "user_3", "exp": exp, "aud": "payments-api", "iss": "https://id.example" }),
        &signer,
    )
    .unwrap();
    assert_eq!(send(with_aud.clone()).await.status().as_u16(), 201);
    let first_body = first.text().await.unwrap();
    // A refreshed token of the same subject: the same scope, so a replay.
    let refreshed = send(token("user_1", 2)).await;
    assert_eq!(refreshed.headers()["idempotent-replayed"], "true");
    assert_eq!(refreshed.text().await.unwrap(), first_body);
    // Another subject's same key is its own.
    assert_eq!(send(token("user_2", 1)).await.status().as_u16(), 201);
    assert_eq!(up.runs("k11"), 3);

    // A token signed by another key, one with its signature cut, and none: 401, nothing runs.
    let mut forged = token("user_1", 3);
    forged.truncate(forged.rfind('.').unwrap() + 1);
    assert_eq!(send(forged).await.status().as_u16(), 401);
    let hmac = encode(
        &Header::new(Algorithm::HS256),
        &serde_json::json!({ "sub": "user_1", "exp": exp }),
        &EncodingKey::from_secret(b"a secret the proxy does not know, 32 bytes long"),
    )
    .unwrap();
    assert_eq!(
        send(hmac).await.status().as_u16(),
        401,
        "the algorithm is the file's, never the token's"
    );
    let none = client()
        .post(proxy.url("/payments"))
        .header("idempotency-key", "k11")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(none.status().as_u16(), 401);
    assert_eq!(up.runs("k11"), 3);
    proxy.shutdown().await;

    // With an audience and an issuer in the file, a token must name them.
    let strict = toml.replace(
        "public_key_pem = ",
        "audience = [\"payments-api\"], issuer = \"https://id.example\", public_key_pem = ",
    );
    let proxy = self::proxy(&strict, Arc::new(MemoryStore::new())).await;
    let send = |token: String| {
        let url = proxy.url("/payments");
        async move {
            client()
                .post(url)
                .bearer_auth(token)
                .header("idempotency-key", "k17")
                .body("{}")
                .send()
                .await
                .unwrap()
        }
    };
    assert_eq!(send(with_aud).await.status().as_u16(), 201);
    assert_eq!(
        send(token("user_1", 1)).await.status().as_u16(),
        401,
        "no aud"
    );
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_upstream_is_spoken_to_without_upgrade() {
    let up = Upstream::default();
    let addr = upstream(up.clone()).await;
    let toml = config(addr, "").replace(
        "upstream_timeout = \"2s\"",
        "upstream_timeout = \"2s\"\nupstream_http2 = true",
    );
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let first = pay_once(&proxy.url("/payments"), "acct_1", Some("k12"), "{}").await;
    assert_eq!(first.0, StatusCode::CREATED, "{first:?}");
    let retry = pay_once(&proxy.url("/payments"), "acct_1", Some("k12"), "{}").await;
    assert_eq!(retry.2, first.2);
    assert_eq!(up.runs("k12"), 1);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_stored_limit_streams_whole_and_is_replayed_without_its_body() {
    // 2 MiB, over the route's 64 KiB limit.
    let big = Router::new().route(
        "/export",
        post(|| async { (StatusCode::CREATED, "x".repeat(2 << 20)) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, big).await });
    let toml = format!(
        r#"
        upstream = "http://{addr}"
        [[routes]]
        methods = ["POST"]
        path = "/export"
        scope = {{ header = "x-account-id" }}
        max_response_body = 65536
        "#
    );
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let first = pay_once(&proxy.url("/export"), "acct_1", Some("k13"), "{}").await;
    assert_eq!(first.0, StatusCode::CREATED);
    assert_eq!(first.2.len(), 2 << 20, "the whole body reached the client");
    let retry = pay_once(&proxy.url("/export"), "acct_1", Some("k13"), "{}").await;
    assert_eq!(retry.0, StatusCode::CREATED);
    assert_eq!(retry.1[idem_http::BODY_NOT_STORED_HEADER], "true");
    assert!(retry.2.is_empty());
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_header_sent_twice_or_blank_is_refused() {
    let (up, proxy) = started("").await;
    let twice = client()
        .post(proxy.url("/payments"))
        .header("x-account-id", "victim")
        .header("x-account-id", "attacker")
        .header("idempotency-key", "k14")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(twice.status().as_u16(), 401);
    for blank in ["", "   "] {
        let refused = pay_once(&proxy.url("/payments"), blank, Some("k14"), "{}").await;
        assert_eq!(
            refused.0,
            StatusCode::UNAUTHORIZED,
            "{blank:?}: {refused:?}"
        );
    }
    assert_eq!(up.total(), 0);
    proxy.shutdown().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_framed_two_ways_reaches_the_client_framed_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // An upstream that says Content-Length: 5 and sends a chunked body of 256 KiB.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let chunk = "y".repeat(64 << 10);
                let mut answer = String::from(
                    "HTTP/1.1 201 Created\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
                );
                for _ in 0..4 {
                    answer.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
                }
                answer.push_str("0\r\n\r\n");
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    let proxy = proxy(&config(addr, ""), Arc::new(MemoryStore::new())).await;
    let first = pay_once(&proxy.url("/payments"), "acct_1", Some("k19"), "{}").await;
    assert_eq!(first.0, StatusCode::CREATED, "{:?}", first.1);
    assert_eq!(
        first.2.len(),
        256 << 10,
        "the whole body, as the chunks framed it"
    );
    if let Some(length) = first.1.get("content-length") {
        assert_eq!(length, "262144", "never the upstream's wrong length");
    }
    let retry = pay_once(&proxy.url("/payments"), "acct_1", Some("k19"), "{}").await;
    assert_eq!(retry.2.len(), 256 << 10);
    assert_eq!(retry.1["idempotent-replayed"], "true");
    proxy.shutdown().await;
}

/// How the raw upstream ends its answer after the head.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// `Content-Length: 100`, 7 bytes, then the connection closes.
    ShortThenClose,
    /// Chunked: one chunk, then the connection closes before the last chunk.
    ChunkThenClose,
    /// `Content-Length: 100`, 7 bytes, then nothing, the connection held open.
    ShortThenStall,
    /// Chunked: one chunk, then nothing, the connection held open.
    ChunkThenStall,
}

/// A raw HTTP/1.1 upstream on 127.0.0.1 that answers every request with a 201 head and a
/// body that does not end as its head says; it counts the requests it read.
async fn breaking_upstream(ending: Ending) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&requests);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let counted = Arc::clone(&counted);
            tokio::spawn(async move {
                let mut read = Vec::new();
                let mut buf = [0u8; 4096];
                // The head, and the body its Content-Length announces.
                loop {
                    let Ok(n) = socket.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    read.extend_from_slice(&buf[..n]);
                    let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&read[..end]).to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if read.len() >= end + 4 + length {
                        break;
                    }
                }
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let answer: &[u8] = match ending {
                    Ending::ShortThenClose | Ending::ShortThenStall => {
                        b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"id\":7"
                    }
                    Ending::ChunkThenClose | Ending::ChunkThenStall => {
                        b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n7\r\n{\"id\":7\r\n"
                    }
                };
                let _ = socket.write_all(answer).await;
                if let Ending::ShortThenStall | Ending::ChunkThenStall = ending {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
            });
        }
    });
    (addr, requests)
}

/// The promise at the edge: once the upstream's 201 head has arrived, the request ran.
/// A body that then breaks off (or does not finish in time) finishes the key with that
/// status, without the body; a retry gets it, marked, and never reaches the upstream
/// again. The key was held before, and forwarded again after the lease: two executions
/// of a request the proxy saw succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_whose_body_breaks_off_after_its_head_is_never_run_again() {
    for ending in [
        Ending::ShortThenClose,
        Ending::ChunkThenClose,
        Ending::ShortThenStall,
        Ending::ChunkThenStall,
    ] {
        let (addr, requests) = breaking_upstream(ending).await;
        let proxy = proxy(
            &config(addr, "lease = \"2s\""),
            Arc::new(MemoryStore::new()),
        )
        .await;
        let url = proxy.url("/payments");
        let send = || {
            client()
                .post(&url)
                .header("x-account-id", "acct_1")
                .header("content-type", "application/json")
                .header("idempotency-key", "k-broken")
                .body("{}")
                .send()
        };
        // The client's connection is cut: after the head, or before it reached the
        // client (hyper holds a head back until the body's first bytes).
        if let Ok(first) = send().await {
            assert_eq!(first.status().as_u16(), 201, "{ending:?}");
            assert!(first.bytes().await.is_err(), "{ending:?}: the body is cut");
        }
        // The cut comes once the key is finished: a retry it prompts at once is a replay,
        // not 409.
        let at_once = send().await.expect("the retry is answered");
        assert_eq!(
            at_once.headers()["idempotent-replayed"],
            "true",
            "{ending:?}"
        );
        // Past the lease: a held key would be taken over and forwarded again here.
        tokio::time::sleep(Duration::from_millis(2200)).await;
        let again = send().await.expect("the retry is answered");
        assert_eq!(again.status().as_u16(), 201, "{ending:?}");
        assert_eq!(again.headers()["idempotent-replayed"], "true", "{ending:?}");
        assert_eq!(
            again.headers()["idempotent-body-not-stored"],
            "true",
            "{ending:?}"
        );
        assert_eq!(
            requests.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "{ending:?}: the upstream ran it once"
        );
        proxy.shutdown().await;
    }
}

/// `max_response_body` above the driver's own 1 MiB: a 1.5 MiB answer is replayed whole.
/// The driver's cap was never raised, so such answers replayed with an empty body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_up_to_max_response_body_are_replayed_whole_past_a_mebibyte() {
    let (up, proxy) = started("max_request_body = 4194304\nmax_response_body = 4194304").await;
    let url = proxy.url("/payments");
    // The upstream echoes the request (within axum's 2 MiB default): a 1.5 MiB body
    // makes a 1.5 MiB answer.
    let body = format!("{{\"memo\":\"{}\"}}", "m".repeat(1536 * 1024));
    let first = pay_once(&url, "acct_1", Some("k-big"), &body).await;
    assert_eq!(first.0, StatusCode::CREATED, "{:?}", first.1);
    assert!(first.2.len() > 1536 * 1024);
    let again = pay_once(&url, "acct_1", Some("k-big"), &body).await;
    assert_eq!(again.1["idempotent-replayed"], "true");
    assert!(
        !again.1.contains_key("idempotent-body-not-stored"),
        "{:?}",
        again.1
    );
    assert_eq!(again.2, first.2, "the whole answer, replayed");
    assert_eq!(up.runs("k-big"), 1);
    proxy.shutdown().await;
}

/// With `preserve_host`, the upstream may serve one tenant per host: the host is part of
/// the scope, so the same caller, key and body on another host is another request. It
/// was in neither the scope nor the fingerprint, and b's retry replayed a's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_preserve_host_each_host_is_its_own_scope() {
    let up = Upstream::default();
    let addr = upstream(up.clone()).await;
    let toml = config(addr, "").replace("[defaults]", "preserve_host = true\n[defaults]");
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let url = proxy.url("/payments");
    let on = |host: &'static str| {
        client()
            .post(&url)
            .header("host", host)
            .header("x-account-id", "acct_1")
            .header("content-type", "application/json")
            .header("idempotency-key", "k-host")
            .body("{}")
            .send()
    };
    let a = on("a.example").await.unwrap();
    assert_eq!(a.status().as_u16(), 201);
    let b = on("b.example").await.unwrap();
    assert_eq!(b.status().as_u16(), 201);
    assert!(
        b.headers().get("idempotent-replayed").is_none(),
        "b's own answer"
    );
    let a_again = on("A.example").await.unwrap();
    assert_eq!(
        a_again.headers()["idempotent-replayed"],
        "true",
        "hosts are case-blind"
    );
    assert_eq!(up.runs("k-host"), 2, "once per host");
    // A long host never makes the key too long (it was a 500).
    let long = Box::leak(format!("{}.example", "h".repeat(200)).into_boxed_str());
    let far = on(long).await.unwrap();
    assert_eq!(far.status().as_u16(), 201);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_gets_a_scoped_key_that_two_callers_never_share() {
    let (up, proxy) = started("").await;
    let url = proxy.url("/payments");
    let scoped = |up: &Upstream| {
        let seen = up.seen.lock().unwrap().clone().expect("a request arrived");
        assert_eq!(
            seen["idempotency-key"], "order-1",
            "the client's key, as sent"
        );
        seen["idempotency-scoped-key"].to_str().unwrap().to_owned()
    };
    let (status, _, _) = pay_once(&url, "acct_a", Some("order-1"), "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    let a = scoped(&up);
    assert!(a.starts_with("idem-") && a.len() == 5 + 64, "{a}");
    // Another caller's same key: another scoped key.
    let (status, _, _) = pay_once(&url, "acct_b", Some("order-1"), "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    let b = scoped(&up);
    assert_ne!(a, b);
    // A client cannot name one: a keyless request to no route carries none of its own.
    let forged = client()
        .post(proxy.url("/free"))
        .header("idempotency-scoped-key", "idem-forged")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 201);
    let seen = up.seen.lock().unwrap().clone().unwrap();
    assert!(!seen.contains_key("idempotency-scoped-key"), "{seen:?}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_s_key_budget_refuses_new_keys_past_it_and_replays_the_rest() {
    let (up, proxy) = started(r#"key_budget = { keys = 2, per = "1h" }"#).await;
    let url = proxy.url("/payments");
    for key in ["k1", "k2"] {
        let (status, _, _) = pay_once(&url, "acct_a", Some(key), "{}").await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let (status, headers, body) = pay_once(&url, "acct_a", Some("k3"), "{}").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(headers.contains_key("retry-after"));
    // Keys it has replay; another caller has a budget of its own.
    let (status, headers, _) = pay_once(&url, "acct_a", Some("k1"), "{}").await;
    assert_eq!(
        (status, &headers["idempotent-replayed"]),
        (StatusCode::CREATED, &"true".parse().unwrap())
    );
    let (status, _, _) = pay_once(&url, "acct_b", Some("k3"), "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!((up.runs("k3"), up.total()), (1, 3));
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_budget_is_the_caller_s_across_the_paths_of_its_route() {
    let up = Upstream::default();
    let toml = config(
        upstream(up.clone()).await,
        r#"key_budget = { keys = 2, per = "1h" }"#,
    )
    .replace("path = \"/payments\"", "path = \"/{name}\"");
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let (status, _, _) = pay_once(&proxy.url("/payments"), "acct_a", Some("k1"), "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, _) = pay_once(&proxy.url("/free"), "acct_a", Some("k2"), "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    // Another path of the same route is no fresh budget.
    let (status, _, body) = pay_once(&proxy.url("/payments"), "acct_a", Some("k3"), "{}").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(up.total(), 2);
    proxy.shutdown().await;
}
