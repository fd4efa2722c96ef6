//! A route's scope checked: a header, or a bearer token's claim with its verification
//! key (a secret, a public key, or a provider's JWKS).

use std::ops::Range;
use std::time::Duration;

use http::HeaderName;
use toml::Spanned;

use super::file::{Locator, ScopeFile};
use super::{ConfigError, JwtKey, ScopeSource};

/// The keys of a JWKS URL: `algorithm` only for keys that name none.
fn jwks_key(
    at: &Locator<'_>,
    span: &Range<usize>,
    scope: &ScopeFile,
) -> Result<JwtKey, ConfigError> {
    let text = scope.jwks_url.as_deref().unwrap_or_default();
    let url: http::Uri = text
        .parse()
        .ok()
        .filter(|url: &http::Uri| {
            let loopback = url.host().is_some_and(|host| {
                host == "localhost"
                    || host
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            });
            // Keys fetched in clear could be swapped on the way: plain HTTP only from
            // this machine (a local mirror).
            url.authority().is_some()
                && (url.scheme_str() == Some("https")
                    || url.scheme_str() == Some("http") && loopback)
        })
        .ok_or_else(|| {
            at.error(
                span.clone(),
                format!(
                    "`jwks_url` = {text:?}: write the provider's https://.../.well-known/jwks.json (plain http only on this machine)"
                ),
            )
        })?;
    // A provider's key set signs every tenant's tokens (Firebase, Entra's common keys):
    // only the issuer tells this deployment's from another's.
    if scope.issuer.as_deref().is_none_or(str::is_empty) {
        return Err(at.error(
            span.clone(),
            "a `jwks_url` scope needs `issuer`: the provider signs other tenants' tokens with the same keys, and only `iss` tells yours apart; write issuer = \"https://id.example/\" as your tokens name it (and `audience`, your API's)",
        ));
    }
    let refresh = match &scope.jwks_refresh {
        None => Duration::from_secs(300),
        Some(text) => humantime::parse_duration(text)
            .ok()
            .filter(|refresh| (Duration::from_secs(1)..=Duration::from_secs(7 * 24 * 3600)).contains(refresh))
            .ok_or_else(|| {
                at.error(span.clone(), format!("`jwks_refresh` = {text:?}: write a period from 1 s to 7 days, such as \"5m\""))
            })?,
    };
    let algorithm = match &scope.algorithm {
        None => None,
        Some(text) => Some(
            text.parse::<jsonwebtoken::Algorithm>()
                .ok()
                .filter(|algorithm| {
                    !matches!(
                        algorithm,
                        jsonwebtoken::Algorithm::HS256
                            | jsonwebtoken::Algorithm::HS384
                            | jsonwebtoken::Algorithm::HS512
                    )
                })
                .ok_or_else(|| {
                    at.error(span.clone(), format!("`algorithm` = {text:?} for a JWKS's keys without `alg`: write RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384 or EdDSA (a shared secret never comes from a public key set)"))
                })?,
        ),
    };
    Ok(JwtKey::Jwks {
        url,
        refresh,
        algorithm,
    })
}

pub(super) fn scope_of(
    at: &Locator<'_>,
    spanned: &Spanned<ScopeFile>,
) -> Result<ScopeSource, ConfigError> {
    let scope = spanned.get_ref();
    let span = spanned.span();
    match (&scope.header, &scope.jwt_claim) {
        (Some(header), None) => {
            if scope.algorithm.is_some()
                || scope.secret_env.is_some()
                || scope.public_key_pem.is_some()
                || scope.jwks_url.is_some()
                || scope.jwks_refresh.is_some()
                || scope.audience.is_some()
                || scope.issuer.is_some()
            {
                return Err(at.error(span.clone(), "a header scope takes no `algorithm`, `secret_env`, `public_key_pem`, `jwks_url`, `jwks_refresh`, `audience` or `issuer`"));
            }
            let name = HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
                at.error(span.clone(), format!("scope header {header:?} is not a header name"))
            })?;
            if name == http::header::AUTHORIZATION {
                return Err(at.error(span.clone(), "scope = { header = \"authorization\" } would put a new scope on every refreshed token (a retry after a refresh would run again): use scope = { jwt_claim = \"sub\", ... } to scope by the verified subject"));
            }
            Ok(ScopeSource::Header(name))
        }
        (None, Some(claim)) => {
            let algorithm_text = scope.algorithm.as_deref().unwrap_or("HS256");
            let algorithm: jsonwebtoken::Algorithm = algorithm_text.parse().map_err(|_| {
                at.error(span.clone(), format!("`algorithm` = {algorithm_text:?}: write HS256, HS384, HS512, RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384 or EdDSA"))
            })?;
            let hmac = matches!(
                algorithm,
                jsonwebtoken::Algorithm::HS256
                    | jsonwebtoken::Algorithm::HS384
                    | jsonwebtoken::Algorithm::HS512
            );
            if scope.jwks_refresh.is_some() && scope.jwks_url.is_none() {
                return Err(at.error(span.clone(), "`jwks_refresh` goes with `jwks_url`"));
            }
            let key = match (&scope.secret_env, &scope.public_key_pem, hmac) {
                (None, None, _) if scope.jwks_url.is_some() => jwks_key(at, &span, scope)?,
                _ if scope.jwks_url.is_some() => {
                    return Err(at.error(span.clone(), "a scope's keys come from one place: `jwks_url`, `public_key_pem` or `secret_env`"));
                }
                (Some(var), None, true) => {
                    let secret = std::env::var(var).map_err(|_| {
                        at.error(span.clone(), format!("`secret_env` names {var}, which is not set in the proxy's environment: export it (the secret never goes in this file)"))
                    })?;
                    // As long as the hash's output (RFC 7518, section 3.2).
                    let least = match algorithm {
                        jsonwebtoken::Algorithm::HS384 => 48,
                        jsonwebtoken::Algorithm::HS512 => 64,
                        _ => 32,
                    };
                    if secret.len() < least {
                        return Err(at.error(span.clone(), format!("the secret in {var} is {} bytes: an {algorithm_text} secret needs at least {least}", secret.len())));
                    }
                    JwtKey::Secret {
                        algorithm,
                        secret: secret.into_bytes(),
                    }
                }
                (None, Some(file), false) => {
                    let pem = std::fs::read(file).map_err(|err| {
                        at.error(span.clone(), format!("cannot read `public_key_pem` {file}: {err}"))
                    })?;
                    let parsed = crate::scope::decoding_key(algorithm, &pem).map(drop);
                    parsed.map_err(|err| {
                        at.error(span.clone(), format!("`public_key_pem` {file} is not a {algorithm_text} public key in PEM: {err}"))
                    })?;
                    JwtKey::PublicKeyPem { algorithm, pem }
                }
                _ if hmac => {
                    return Err(at.error(span.clone(), format!("{algorithm_text} tokens are verified with a secret: write secret_env = \"JWT_SECRET\", an environment variable holding it")));
                }
                _ => {
                    return Err(at.error(span.clone(), format!("{algorithm_text} tokens are verified with a public key: write public_key_pem = \"/etc/idem/jwt.pem\"")));
                }
            };
            if claim.is_empty() {
                return Err(at.error(span.clone(), "`jwt_claim` is empty: name the claim that names the caller, usually \"sub\""));
            }
            if scope
                .audience
                .as_ref()
                .is_some_and(|a| a.is_empty() || a.iter().any(String::is_empty))
            {
                return Err(at.error(span.clone(), "`audience` lists the audiences a token may name, none of them empty; leave it out not to check `aud`"));
            }
            Ok(ScopeSource::JwtClaim {
                claim: claim.clone(),
                key,
                audience: scope.audience.clone().unwrap_or_default(),
                issuer: scope.issuer.clone().filter(|i| !i.is_empty()),
            })
        }
        _ => Err(at.error(
            span,
            "a scope is either { header = \"x-account-id\" } or { jwt_claim = \"sub\", secret_env = \"JWT_SECRET\" }, exactly one of them",
        )),
    }
}
