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
use jsonwebtoken::jwk::{Jwk, JwkSet};
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

/// One verification key: the key, and the algorithm it verifies.
#[derive(Clone)]
pub(crate) struct Key {
    pub(crate) key: DecodingKey,
    pub(crate) algorithm: Algorithm,
}

/// A key set, shared by the routes that name its URL; cheap to clone.
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
    wake: Notify,
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
                wake: Notify::new(),
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
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let refresh = self.inner.refresh;
        tokio::spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let woken = tokio::select! {
                    () = tokio::time::sleep(refresh) => false,
                    () = inner.wake.notified() => true,
                };
                if woken {
                    let recent = inner
                        .last_fetch
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .is_some_and(|at| at.elapsed() < UNKNOWN_KEY_SPACING.min(refresh));
                    if recent {
                        continue;
                    }
                }
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
        let set: JwkSet = serde_json::from_slice(&body).map_err(|source| JwksError::Parse {
            url: url.clone(),
            source,
        })?;
        let keys: HashMap<Option<String>, Key> = set
            .keys
            .iter()
            .filter_map(|jwk| Some((jwk.common.key_id.clone(), self.usable(jwk)?)))
            .collect();
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
    /// `algorithm` for a key that names none; never one the token chooses.
    fn usable(&self, jwk: &Jwk) -> Option<Key> {
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
        let key = DecodingKey::from_jwk(jwk).ok()?;
        Some(Key { key, algorithm })
    }
}
