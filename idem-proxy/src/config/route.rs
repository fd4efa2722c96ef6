//! A checked route: which requests, whose key, how bearer tokens are verified, which
//! statuses are stored, and its budget of new keys.

use std::fmt;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};

/// Whether a route's requests need a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRule {
    /// Refused with 400 without the header.
    Required,
    /// Protected with the header, passed through without it.
    Optional,
    /// Never protected, header or not.
    Exempt,
}

/// Whose key it is: each route's scope names the caller.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ScopeSource {
    /// A request header naming the caller: one an authenticating gateway in front of the
    /// proxy sets (`X-Account-Id`), or an API key. Its value is hashed, never stored.
    Header(HeaderName),
    /// A claim of the bearer token in `Authorization`, verified with a key; the claim's
    /// value is hashed, the token is never stored. A request without a valid token is
    /// refused with 401 before anything is claimed.
    JwtClaim {
        /// The claim (`sub`).
        claim: String,
        /// The verification key and algorithm.
        key: JwtKey,
        /// The audiences a token must name in `aud`, one of them; none: `aud` is not
        /// checked.
        audience: Vec<String>,
        /// The issuer a token must name in `iss`; none: `iss` is not checked.
        issuer: Option<String>,
    },
}

/// How bearer tokens are verified.
#[derive(Clone)]
#[non_exhaustive]
pub enum JwtKey {
    /// HS256, HS384 or HS512 with a shared secret.
    Secret {
        /// The algorithm.
        algorithm: jsonwebtoken::Algorithm,
        /// The secret's bytes.
        secret: Vec<u8>,
    },
    /// RS256/384/512, PS256/384/512, ES256/384 or EdDSA with a public key in PEM.
    PublicKeyPem {
        /// The algorithm.
        algorithm: jsonwebtoken::Algorithm,
        /// The PEM text.
        pem: Vec<u8>,
    },
    /// The keys an identity provider publishes at a JWKS URL, picked by the token's
    /// `kid`: fetched before the proxy serves, refreshed every `refresh` and early when a
    /// token names a key not known yet (at most every 30 s), so a rotation needs no
    /// restart. Each key verifies with its own `alg`, never the token's choice.
    Jwks {
        /// `https://` (this machine's TLS roots) or `http://`.
        url: http::Uri,
        /// How often the set is fetched again (default 5 min).
        refresh: std::time::Duration,
        /// The algorithm of keys that name none (`algorithm` in the file).
        algorithm: Option<jsonwebtoken::Algorithm>,
    },
}

impl fmt::Debug for JwtKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret.
        match self {
            Self::Secret { algorithm, .. } => write!(f, "Secret({algorithm:?})"),
            Self::PublicKeyPem { algorithm, .. } => write!(f, "PublicKeyPem({algorithm:?})"),
            Self::Jwks { url, refresh, .. } => write!(f, "Jwks({url}, every {refresh:?})"),
        }
    }
}

/// Which responses are stored, released or held, by status, over the default policy
/// (`idem_http::default_disposition`: 5xx and 408 held, other 4xx but 402 released, the
/// rest stored).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct StatusPolicy {
    /// Statuses stored and replayed.
    pub store: Vec<StatusCode>,
    /// Statuses whose key is forgotten: nothing happened, a retry runs again.
    pub release: Vec<StatusCode>,
    /// Statuses whose key is held until the lease ends: the effect may have happened.
    pub hold: Vec<StatusCode>,
}

/// One route: which requests, and how they are protected.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Route {
    /// A name for metrics and logs (default: the methods and the path).
    pub name: String,
    /// The methods it matches; empty matches every method, and protects all but GET,
    /// HEAD, OPTIONS and TRACE.
    pub methods: Vec<Method>,
    /// The path pattern: `/payments`, `/orders/{id}/refund`, `/files/{*rest}`.
    pub path: String,
    /// Whether its requests need a key (default required).
    pub key: KeyRule,
    /// The key's header (default `Idempotency-Key`).
    pub header: HeaderName,
    /// Whose key it is. Required where the key is not exempt.
    pub scope: Option<ScopeSource>,
    /// Body fields left out of the fingerprint: a top-level name or a JSON Pointer.
    pub ignore_fields: Vec<String>,
    /// The status policy.
    pub status: StatusPolicy,
    /// Response headers stored and replayed beyond idem-http's defaults
    /// (`idem_http::DEFAULT_STORED_HEADERS`): `x-charge-id`, say.
    pub store_headers: Vec<HeaderName>,
    /// How long the upstream may take to answer this route's requests with a response
    /// head, and (protected routes) to go on with its body (default: the file's
    /// `upstream_timeout`). A route of long uploads or long polls sets its own, and its
    /// lease follows, without raising every route's.
    pub upstream_timeout: Duration,
    /// How long a first request holds its key before a retry may take over (default 60 s).
    pub lease: Duration,
    /// How long answers are kept for retries (default 24 h).
    pub retention: Duration,
    /// The largest request body read to fingerprint it (default 1 MiB); larger is 413.
    pub max_request_body: usize,
    /// The largest response body stored (default 960 KiB); a larger one streams to its
    /// client and is stored without its body.
    pub max_response_body: usize,
    /// How many new keys one scope (caller) may create, per period (default: no limit):
    /// a caller that sends a new key with every retry fills the store, and past its
    /// budget it gets 429 with `Retry-After`, nothing stored. Retries of keys it already
    /// has replay as ever. Counted per replica (`idem_core::driver::TokenBucket`).
    pub key_budget: Option<KeyBudget>,
    /// Where the route starts in the file, for messages.
    pub line: usize,
}

/// A route's budget of new keys per scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyBudget {
    /// New keys at once, and per `per`.
    pub keys: u32,
    /// The period they refill over.
    pub per: Duration,
}
