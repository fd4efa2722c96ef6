//! Whose key it is: a route's scope, from a header or a verified token's claim.
//!
//! The caller's name is hashed before it reaches the store (`idem_http::scope::hashed`),
//! so the store never holds an API key or a subject id in clear, and the scope is
//! `"{hash}/{METHOD} {path}"`: one caller's key never meets another's, nor another
//! route's. A request without the header, or without a valid token, is refused with 401
//! before anything is claimed.

use http::request::Parts;
use idem_http::{Refusal, scope};
use jsonwebtoken::{DecodingKey, Validation};

use crate::config::{JwtKey, ScopeSource};
use crate::jwks::{Jwks, JwksError};

/// A route's scope, ready to read requests.
#[derive(Clone)]
pub(crate) enum Scope {
    Header(http::HeaderName),
    Jwt {
        claim: String,
        keys: Keys,
        /// The checks; a JWKS key's own algorithm replaces its algorithms.
        validation: Box<Validation>,
    },
}

/// Where a token's verification key comes from.
#[derive(Clone)]
pub(crate) enum Keys {
    /// One key, from the file.
    Fixed(DecodingKey),
    /// A provider's key set, by `kid`.
    Jwks(Jwks),
}

/// Why a scope could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScopeError {
    #[error(transparent)]
    Key(#[from] jsonwebtoken::errors::Error),
    #[error(transparent)]
    Jwks(#[from] JwksError),
}

impl Scope {
    /// The scope `source` describes; its key was checked when the file was read.
    /// `sets`: the key sets built so far, by URL and settings: routes that name the same
    /// set share it (one fetch, one refresher).
    pub(crate) fn new(
        source: &ScopeSource,
        sets: &mut std::collections::HashMap<String, Jwks>,
    ) -> Result<Self, ScopeError> {
        Ok(match source {
            ScopeSource::Header(name) => Self::Header(name.clone()),
            ScopeSource::JwtClaim {
                claim,
                key,
                audience,
                issuer,
            } => {
                let (algorithm, keys) = match key {
                    JwtKey::Secret { algorithm, secret } => {
                        (*algorithm, Keys::Fixed(DecodingKey::from_secret(secret)))
                    }
                    JwtKey::PublicKeyPem { algorithm, pem } => {
                        (*algorithm, Keys::Fixed(decoding_key(*algorithm, pem)?))
                    }
                    JwtKey::Jwks {
                        url,
                        refresh,
                        algorithm,
                    } => {
                        let id = format!("{url} {refresh:?} {algorithm:?}");
                        let jwks = match sets.get(&id) {
                            Some(jwks) => jwks.clone(),
                            None => {
                                let jwks = Jwks::new(url.clone(), *refresh, *algorithm)?;
                                sets.insert(id, jwks.clone());
                                jwks
                            }
                        };
                        // The algorithm is replaced by each key's own.
                        (jsonwebtoken::Algorithm::RS256, Keys::Jwks(jwks))
                    }
                };
                // The signature, the algorithm named here (never the token's own choice),
                // `exp` and `nbf` (with jsonwebtoken's 60 s of leeway for clocks); `aud` and `iss` where the file names them (a token's
                // `aud` is not checked otherwise: the library would refuse every token
                // that has one).
                let mut validation = Validation::new(algorithm);
                validation.validate_nbf = true;
                if audience.is_empty() {
                    validation.validate_aud = false;
                } else {
                    validation.set_audience(audience);
                    // Named in the file: a token without one is refused too.
                    validation.required_spec_claims.insert("aud".to_owned());
                }
                if let Some(issuer) = issuer {
                    validation.set_issuer(&[issuer]);
                    validation.required_spec_claims.insert("iss".to_owned());
                }
                Self::Jwt {
                    claim: claim.clone(),
                    keys,
                    validation: Box::new(validation),
                }
            }
        })
    }

    /// The scope of one request, or the 401 that refuses it. `host`: the host the
    /// request names, when it reaches the upstream (`preserve_host`) and so may select a
    /// tenant there: one host's key then never meets another's.
    pub(crate) fn of(&self, parts: &Parts, host: Option<&str>) -> Result<String, Refusal> {
        let principal = match self {
            // One value, not blank: a header sent twice could be the client's own beside
            // the gateway's, and a blank one would be a scope every such request shares.
            Self::Header(name) => {
                let mut values = parts.headers.get_all(name).iter();
                match (values.next(), values.next()) {
                    (Some(value), None) if !value.as_bytes().trim_ascii().is_empty() => {
                        scope::hashed(value.as_bytes())
                    }
                    _ => String::new(),
                }
            }
            Self::Jwt {
                claim,
                keys,
                validation,
            } => bearer(parts)
                .and_then(|token| verify(token, keys, validation))
                .and_then(|data| match data.claims.get(claim) {
                    Some(serde_json::Value::String(value)) if !value.is_empty() => {
                        Some(scope::hashed(value))
                    }
                    Some(serde_json::Value::Number(value)) => {
                        Some(scope::hashed(value.to_string()))
                    }
                    _ => None,
                })
                .unwrap_or_default(),
        };
        // An empty principal is refused with 401: never a scope every such request shares.
        // The host joins the principal, hashed, before `operation` bounds the scope's
        // length: a long host or path never makes a key too long.
        let principal = match host {
            Some(host) if !principal.is_empty() => {
                format!("{}.{principal}", scope::hashed(host.to_ascii_lowercase()))
            }
            _ => principal,
        };
        scope::operation(principal, parts)
    }
}

/// The claims of a token whose signature and checks hold; `None` (and why, at debug,
/// never the token) otherwise.
fn verify(
    token: &str,
    keys: &Keys,
    validation: &Validation,
) -> Option<jsonwebtoken::TokenData<serde_json::Map<String, serde_json::Value>>> {
    let verified = match keys {
        Keys::Fixed(key) => jsonwebtoken::decode(token, key, validation),
        Keys::Jwks(jwks) => {
            let header = jsonwebtoken::decode_header(token)
                .map_err(|err| tracing::debug!(error = ?err.kind(), "a bearer token was refused"))
                .ok()?;
            let Some(key) = jwks.key(header.kid.as_deref()) else {
                tracing::debug!("a bearer token names a key the JWKS does not hold");
                return None;
            };
            let mut validation = validation.clone();
            validation.algorithms = vec![key.algorithm];
            jsonwebtoken::decode(token, &key.key, &validation)
        }
    };
    verified
        .map_err(|err| tracing::debug!(error = ?err.kind(), "a bearer token was refused"))
        .ok()
}

/// The key sets the scope reads, to fetch before serving.
impl Scope {
    pub(crate) fn jwks(&self) -> Option<&Jwks> {
        match self {
            Self::Jwt {
                keys: Keys::Jwks(jwks),
                ..
            } => Some(jwks),
            _ => None,
        }
    }
}

/// The token of `Authorization: Bearer <token>`.
fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts
        .headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The verification key of a public-key algorithm, from PEM.
pub(crate) fn decoding_key(
    algorithm: jsonwebtoken::Algorithm,
    pem: &[u8],
) -> Result<DecodingKey, jsonwebtoken::errors::Error> {
    use jsonwebtoken::Algorithm::{ES256, ES384, EdDSA};
    match algorithm {
        ES256 | ES384 => DecodingKey::from_ec_pem(pem),
        EdDSA => DecodingKey::from_ed_pem(pem),
        _ => DecodingKey::from_rsa_pem(pem),
    }
}
