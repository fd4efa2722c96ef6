//! Bearer tokens verified with the keys a provider publishes at a JWKS URL, served on
//! 127.0.0.1 by the test: picked by `kid`, rotated without a restart, each key verifying
//! with its own algorithm.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use common::*;
use idem_core::MemoryStore;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};

const KEYS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/keys");
const ISSUER: &str = "https://id.example/";

/// The JWK of a P-256 public key in PEM, under `kid`.
fn jwk(public_pem: &str, kid: &str) -> serde_json::Value {
    let pem = std::fs::read_to_string(format!("{KEYS}/{public_pem}")).unwrap();
    let der: String = pem
        .lines()
        .filter(|line| !line.starts_with("-----"))
        .collect();
    let der = STANDARD.decode(der).unwrap();
    // A P-256 SubjectPublicKeyInfo ends with the uncompressed point: 0x04, x, y.
    let point = &der[der.len() - 64..];
    serde_json::json!({
        "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": kid,
        "x": URL_SAFE_NO_PAD.encode(&point[..32]),
        "y": URL_SAFE_NO_PAD.encode(&point[32..]),
    })
}

/// A provider's JWKS endpoint: the set it serves now, and how often it was fetched.
#[derive(Clone, Default)]
struct Provider {
    set: Arc<Mutex<serde_json::Value>>,
    fetches: Arc<AtomicUsize>,
}

async fn provider(keys: Vec<serde_json::Value>) -> (Provider, String) {
    let provider = Provider::default();
    *provider.set.lock().unwrap() = serde_json::json!({ "keys": keys });
    let app = Router::new()
        .route(
            "/.well-known/jwks.json",
            get(|State(p): State<Provider>| async move {
                p.fetches.fetch_add(1, Ordering::SeqCst);
                axum::Json(p.set.lock().unwrap().clone())
            }),
        )
        .with_state(provider.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/.well-known/jwks.json",
        listener.local_addr().unwrap()
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (provider, url)
}

fn token(private_pem: &str, kid: &str, sub: &str) -> String {
    let private = std::fs::read(format!("{KEYS}/{private_pem}")).unwrap();
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some(kid.to_owned());
    encode(
        &header,
        &serde_json::json!({ "sub": sub, "exp": exp, "iss": ISSUER }),
        &EncodingKey::from_ec_pem(&private).unwrap(),
    )
    .unwrap()
}

async fn pay(url: &str, token: &str, key: &str) -> u16 {
    client()
        .post(url)
        .bearer_auth(token)
        .header("idempotency-key", key)
        .body("{}")
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn with_jwks(upstream: std::net::SocketAddr, jwks_url: &str) -> String {
    config(upstream, "").replace(
        "scope = { header = \"x-account-id\" }",
        &format!(
            "scope = {{ jwt_claim = \"sub\", jwks_url = \"{jwks_url}\", jwks_refresh = \"1s\", issuer = \"{ISSUER}\" }}"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_come_from_the_jwks_by_kid_and_a_rotation_needs_no_restart() {
    // Beside key `a`: a symmetric key anyone reading the set could sign with, and a key
    // this library cannot read (an X25519 encryption key): neither is used, and neither
    // takes key `a` with it.
    let (provider, jwks_url) = provider(vec![
        jwk("es256-public.pem", "a"),
        serde_json::json!({ "kty": "oct", "alg": "HS256", "kid": "shared", "k": URL_SAFE_NO_PAD.encode(b"a secret anyone can read, 32 bytes") }),
        serde_json::json!({ "kty": "OKP", "crv": "X25519", "use": "enc", "kid": "enc", "x": URL_SAFE_NO_PAD.encode([7u8; 32]) }),
    ])
    .await;
    let up = Upstream::default();
    let proxy = proxy(
        &with_jwks(upstream(up.clone()).await, &jwks_url),
        Arc::new(MemoryStore::new()),
    )
    .await;
    assert!(
        provider.fetches.load(Ordering::SeqCst) >= 1,
        "fetched before serving"
    );
    let url = proxy.url("/payments");

    let signed_a = token("es256-private.pem", "a", "user-1");
    assert_eq!(pay(&url, &signed_a, "k1").await, 201);
    // A key the provider does not publish yet.
    let signed_b = token("es256-b-private.pem", "b", "user-1");
    assert_eq!(pay(&url, &signed_b, "k2").await, 401);
    // Key `a`'s kid on a token key `b` signed: the kid picks the key, the signature fails.
    let forged = token("es256-b-private.pem", "a", "user-1");
    assert_eq!(pay(&url, &forged, "k3").await, 401);
    // An HMAC token naming key `a` (the public key as its secret): the key's algorithm
    // decides, never the token's.
    let public = std::fs::read(format!("{KEYS}/es256-public.pem")).unwrap();
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("a".to_owned());
    let confused = encode(
        &header,
        &serde_json::json!({ "sub": "user-1", "exp": u64::MAX / 2, "iss": ISSUER }),
        &EncodingKey::from_secret(&public),
    )
    .unwrap();
    assert_eq!(pay(&url, &confused, "k4").await, 401);
    // An HMAC token signed with the published symmetric key.
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("shared".to_owned());
    let shared = encode(
        &header,
        &serde_json::json!({ "sub": "user-1", "exp": u64::MAX / 2, "iss": ISSUER }),
        &EncodingKey::from_secret(b"a secret anyone can read, 32 bytes"),
    )
    .unwrap();
    assert_eq!(pay(&url, &shared, "k5").await, 401);
    // Another tenant's token, signed by the same provider's key: another issuer.
    let private = std::fs::read(format!("{KEYS}/es256-private.pem")).unwrap();
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some("a".to_owned());
    let other_tenant = encode(
        &header,
        &serde_json::json!({ "sub": "user-1", "exp": u64::MAX / 2, "iss": "https://other.example/" }),
        &EncodingKey::from_ec_pem(&private).unwrap(),
    )
    .unwrap();
    assert_eq!(pay(&url, &other_tenant, "k6").await, 401);

    // The provider rotates: `b` is published, and tokens it signs are verified soon,
    // with no restart.
    *provider.set.lock().unwrap() = serde_json::json!({
        "keys": [jwk("es256-public.pem", "a"), jwk("es256-b-private.pem".replace("private", "public").as_str(), "b")]
    });
    let mut status = 0;
    for _ in 0..100 {
        status = pay(&url, &signed_b, "k2").await;
        if status == 201 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 201, "the rotated key was never picked up");
    // The same subject under either key is one caller: its key replays.
    let replay = client()
        .post(&url)
        .bearer_auth(&signed_a)
        .header("idempotency-key", "k2")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(up.total(), 2);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_that_cannot_be_fetched_stops_the_start() {
    let (provider, jwks_url) = provider(vec![]).await;
    let up = Upstream::default();
    let toml = with_jwks(upstream(up).await, &jwks_url);
    let mut config = idem_proxy::Config::parse("test.toml", &toml).unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.admin_listen = "127.0.0.1:0".parse().unwrap();
    // An empty set: no key to verify with.
    let err = idem_proxy::Proxy::bind(config.clone(), "test.toml", Arc::new(MemoryStore::new()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no signing key"), "{err}");
    assert_eq!(provider.fetches.load(Ordering::SeqCst), 1);
    // Nothing listening there.
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = gone.local_addr().unwrap().port();
    drop(gone);
    let toml = toml.replace(&jwks_url, &format!("http://127.0.0.1:{port}/jwks.json"));
    let mut config = idem_proxy::Config::parse("test.toml", &toml).unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.admin_listen = "127.0.0.1:0".parse().unwrap();
    let err = idem_proxy::Proxy::bind(config, "test.toml", Arc::new(MemoryStore::new()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cannot fetch the JWKS"), "{err}");
}

#[test]
fn a_jwks_scope_needs_an_issuer_and_https_off_this_machine() {
    let with = |scope: &str| {
        format!(
            "upstream = \"http://127.0.0.1:8000\"\n[defaults]\nscope = {{ jwt_claim = \"sub\", {scope} }}\n[[routes]]\npath = \"/payments\"\n"
        )
    };
    let refused = |text: String| match idem_proxy::Config::parse("idem.toml", &text) {
        Err(idem_proxy::ConfigError::Invalid { message, .. }) => message,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let message = refused(with(r#"jwks_url = "https://id.example/jwks.json""#));
    assert!(message.contains("needs `issuer`"), "{message}");
    let message = refused(with(
        r#"jwks_url = "http://id.example/jwks.json", issuer = "https://id.example/""#,
    ));
    assert!(
        message.contains("plain http only on this machine"),
        "{message}"
    );
    let message = refused(with(
        r#"jwks_url = "https://id.example/jwks.json", issuer = "https://id.example/", algorithm = "HS256""#,
    ));
    assert!(message.contains("a shared secret never comes"), "{message}");
    assert!(
        idem_proxy::Config::parse(
            "idem.toml",
            &with(r#"jwks_url = "https://id.example/jwks.json", issuer = "https://id.example/""#)
        )
        .is_ok()
    );
}
