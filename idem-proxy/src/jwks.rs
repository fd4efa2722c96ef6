//! Verification keys from a JWKS URL (an identity provider's
//! `/.well-known/jwks.json`): fetched before the proxy serves, refreshed in the
//! background, and fetched again early (at most every 30 s) when a token names a key not
//! known yet, so that a provider's key rotation needs no restart.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio::sync::Notify;

/// The most a key set may weigh: providers publish a few keys, a few KiB.
const MAX_JWKS_BYTES: usize = 1 << 20;

/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The shortest time between two fetches that a token naming an unknown key asks for.
const UNKNOWN_KEY_SPACING: Duration = Duration::from_secs(30);

/// Why a key set could not be fetched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JwksError {
    /// The request failed (the provider unreachable, TLS refused, a timeout).
    #[error("cannot fetch the JWKS at {url}: {source}")]
    Fetch {
        /// The URL.
        url: http::Uri,
        /// Why.
        #[source]
        source: idem_core::BoxError,
    },
    /// The provider answered something else than 200.
    #[error("the JWKS at {url} answered {status}")]
    Status {
        /// The URL.
        url: http::Uri,
        /// Its answer.
        status: http::StatusCode,
    },
    /// The body is not a JWK set.
    #[error("the JWKS at {url} is not a JWK set: {source}")]
    Parse {
        /// The URL.
        url: http::Uri,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// No key of the set can verify a signature (all encryption keys, or algorithms the
    /// proxy does not verify, or keys without `alg` and no `algorithm` in the file).
    #[error(
        "the JWKS at {url} holds no signing key the proxy can use (keys without `alg` need `algorithm` in the scope)"
    )]
    NoKeys {
        /// The URL.
        url: http::Uri,
    },
    /// The TLS roots of this machine could not be loaded.
    #[error("cannot load this machine's TLS roots for the JWKS: {0}")]
    Roots(#[source] std::io::Error),
}

/// A key set as published, each key read on its own.
#[derive(serde::Deserialize)]
struct RawSet {
    keys: Vec<serde_json::Value>,
}

/// One verification key: the key, and the algorithm it verifies.
#[derive(Clone)]
pub(crate) struct Key {
    pub(crate) key: DecodingKey,
    pub(crate) algorithm: Algorithm,
}

/// A key set, shared by the routes that name its URL with the same settings; cheap to
/// clone.
#[derive(Clone)]
pub(crate) struct Jwks {
    inner: Arc<Inner>,
}

struct Inner {
    url: http::Uri,
    refresh: Duration,
    /// The algorithm of keys that name none.
    fallback: Option<Algorithm>,
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    /// By `kid`; a key without one under `None`.
    keys: RwLock<Arc<HashMap<Option<String>, Key>>>,
    last_fetch: Mutex<Option<Instant>>,
    /// Apart from the rest, so that the refresher waits on it without keeping the set.
    wake: Arc<Notify>,
}

impl Jwks {
    pub(crate) fn new(
        url: http::Uri,
        refresh: Duration,
        fallback: Option<Algorithm>,
    ) -> Result<Self, JwksError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = match hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(Arc::clone(&provider))
        {
            Ok(builder) => builder,
            // A machine without CA certificates still fetches over plain HTTP.
            Err(_) if url.scheme_str() == Some("http") => {
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|err| JwksError::Roots(std::io::Error::other(err)))?
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth();
                hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
            }
            Err(err) => return Err(JwksError::Roots(err)),
        };
        let https = builder.https_or_http().enable_http1().build();
        Ok(Self {
            inner: Arc::new(Inner {
                url,
                refresh,
                fallback,
                client: Client::builder(TokioExecutor::new()).build(https),
                keys: RwLock::new(Arc::new(HashMap::new())),
                last_fetch: Mutex::new(None),
                wake: Arc::new(Notify::new()),
            }),
        })
    }

    /// The key a token's `kid` names, or the only key of a set when the token names
    /// none. A `kid` not known yet wakes the refresher: a provider rotating its keys
    /// publishes the new one before signing with it.
    pub(crate) fn key(&self, kid: Option<&str>) -> Option<Key> {
        let keys = Arc::clone(
            &self
                .inner
                .keys
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let found = match kid {
            Some(kid) => keys.get(&Some(kid.to_owned())).cloned(),
            None if keys.len() == 1 => keys.values().next().cloned(),
            None => None,
        };
        if found.is_none() && kid.is_some() {
            self.inner.wake.notify_one();
        }
        found
    }

    /// Fetches the set now and keeps it; answers how many keys it holds.
    pub(crate) async fn fetch(&self) -> Result<usize, JwksError> {
        self.inner.fetch().await
    }

    /// Refreshes the set every `refresh`, and early when an unknown key is asked for,
    /// for as long as a route holds it. A failed refresh keeps the keys it had.
    pub(crate) fn spawn_refresh(&self) {
        // The task holds the set only while it fetches: once every route let go of it,
        // the task ends at its next wake-up.
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let wake = Arc::clone(&self.inner.wake);
        let refresh = self.inner.refresh;
        let spacing = UNKNOWN_KEY_SPACING.min(refresh);
        tokio::spawn(async move {
            loop {
                let woken = tokio::select! {
                    () = tokio::time::sleep(refresh) => false,
                    () = wake.notified() => true,
                };
                if woken {
                    // An unknown key soon after a fetch: fetched once the spacing is over.
                    let last = match weak.upgrade() {
                        Some(inner) => *inner
                            .last_fetch
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner),
                        None => return,
                    };
                    if let Some(at) = last {
                        tokio::time::sleep(spacing.saturating_sub(at.elapsed())).await;
                    }
                }
                let Some(inner) = weak.upgrade() else { return };
                if let Err(err) = inner.fetch().await {
                    tracing::warn!(error = %err, "refreshing the JWKS failed; the keys fetched before stay in use");
                }
            }
        });
    }
}

impl Inner {
    async fn fetch(&self) -> Result<usize, JwksError> {
        *self
            .last_fetch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
        let url = &self.url;
        let fetch_failed = |source: idem_core::BoxError| JwksError::Fetch {
            url: url.clone(),
            source,
        };
        let request = http::Request::get(url.clone())
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::<Bytes>::new())
            .map_err(|err| fetch_failed(err.into()))?;
        let body = tokio::time::timeout(FETCH_TIMEOUT, async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|err| fetch_failed(err.into()))?;
            if response.status() != http::StatusCode::OK {
                return Err(JwksError::Status {
                    url: url.clone(),
                    status: response.status(),
                });
            }
            http_body_util::Limited::new(response.into_body(), MAX_JWKS_BYTES)
                .collect()
                .await
                .map(|collected| collected.to_bytes())
                .map_err(fetch_failed)
        })
        .await
        .map_err(|elapsed| fetch_failed(elapsed.into()))??;
        // Key by key: one a newer provider publishes that this library cannot read (an
        // encryption curve, a post-quantum key) must not take the others with it.
        let set: RawSet = serde_json::from_slice(&body).map_err(|source| JwksError::Parse {
            url: url.clone(),
            source,
        })?;
        let mut keys: HashMap<Option<String>, Key> = HashMap::new();
        for raw in set.keys {
            let Ok(jwk) = serde_json::from_value::<Jwk>(raw) else {
                continue;
            };
            let Some(key) = self.usable(&jwk) else {
                continue;
            };
            // Two keys under one `kid` (or two without one) cannot be told apart: the
            // first stands.
            let kid = jwk.common.key_id.clone();
            if keys.contains_key(&kid) {
                tracing::warn!(
                    kid = kid.as_deref().unwrap_or("(none)"),
                    "the JWKS names a key twice; the first is used"
                );
                continue;
            }
            keys.insert(kid, key);
        }
        if keys.is_empty() {
            return Err(JwksError::NoKeys { url: url.clone() });
        }
        let count = keys.len();
        *self
            .keys
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(keys);
        tracing::debug!(keys = count, "JWKS fetched");
        Ok(count)
    }

    /// A signing key's verification key and algorithm: its own `alg`, or the file's
    /// `algorithm` for a key that names none; never one the token chooses. Symmetric
    /// keys are never taken from a set anyone may read, and an Ed25519 key must have
    /// its 32 bytes (a shorter one would make the verifier panic).
    fn usable(&self, jwk: &Jwk) -> Option<Key> {
        use jsonwebtoken::jwk::AlgorithmParameters;
        match &jwk.algorithm {
            AlgorithmParameters::OctetKey(_) => return None,
            AlgorithmParameters::OctetKeyPair(pair) => {
                let x = base64::Engine::decode(
                    &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                    pair.x.trim_end_matches('='),
                )
                .ok()?;
                if x.len() != 32 {
                    return None;
                }
            }
            _ => {}
        }
        if jwk
            .common
            .public_key_use
            .as_ref()
            .is_some_and(|use_| *use_ != jsonwebtoken::jwk::PublicKeyUse::Signature)
        {
            return None;
        }
        let algorithm = match jwk.common.key_algorithm {
            Some(named) => Algorithm::from_str(&format!("{named:?}")).ok()?,
            None => self.fallback?,
        };
        if matches!(
            algorithm,
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512
        ) {
            return None;
        }
        let key = DecodingKey::from_jwk(jwk).ok()?;
        Some(Key { key, algorithm })
    }
}
