//! Whose key it is: a verified token's claim, a scope header sent twice or blank, the
//! host under `preserve_host`.

use std::sync::Arc;

use axum::http::StatusCode;
use idem_core::MemoryStore;

use crate::common::*;

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
