//! Scopes that are never shared: one caller's key never meets another's.
//!
//! A key's scope says whose key it is. Two requests with the same key and the same scope
//! are one operation: the second gets the first one's response. So a scope must name the
//! authenticated caller, and a request without one must be refused, never given a
//! fallback such as `"anonymous"` that every such request shares.
//!
//! - [`principal`] reads the caller an authentication layer put in the request's
//!   extensions, by type, and refuses the request with 401
//!   (`tag:idem-http,2026:unauthenticated`) when there is none.
//! - [`by_principal`] is a ready scope function: `"{principal}/{METHOD} {path}"`.
//! - [`operation`] builds that scope from a principal name you computed yourself.
//! - [`hashed`] names a principal that is itself a secret (an API key) by its SHA-256,
//!   so the store never holds the secret and a long one still fits in a key part.
//!
//! Do not scope by the raw `Authorization` header: a token over 255 bytes (most JWTs)
//! makes the key invalid and every request a 500, the store keeps bearer tokens in clear,
//! and a token refreshed between two tries of one operation puts the retry in another
//! scope, so the handler runs twice. Scope by what the authentication layer verified: the
//! account or user id.
//!
//! # The layer order
//!
//! The authentication layer must run **before** the idempotency layer, that is sit
//! *outside* it. Inside it, the idempotency layer sees no principal: with these helpers
//! every request is refused with 401; with a fallback it would put every caller in one
//! scope and replay one caller's response to another.
//!
//! With axum's `Router::layer`, the **last** `.layer()` call is the outermost:
//!
//! ```
//! use axum::{Router, extract::Request, middleware::{self, Next}, response::Response, routing::post};
//! use idem_core::{Idempotency, MemoryStore};
//! use idem_http::{IdempotencyLayer, scope};
//!
//! /// What the authentication layer verified.
//! #[derive(Clone)]
//! struct User { id: u64 }
//!
//! async fn authenticate(mut request: Request, next: Next) -> Response {
//!     // A real service verifies a session or a token here.
//!     if request.headers().get("authorization").is_some_and(|v| v == "Bearer alice-token") {
//!         request.extensions_mut().insert(User { id: 7 });
//!     }
//!     next.run(request).await
//! }
//!
//! let idem = Idempotency::new(MemoryStore::new());
//! let app: Router = Router::new()
//!     .route("/payments", post(|| async { "charged once" }))
//!     .layer(IdempotencyLayer::new(idem, scope::by_principal(|user: &User| user.id)))
//!     .layer(middleware::from_fn(authenticate)); // last, so outermost: runs first
//! # let _ = app;
//! ```
//!
//! With tower's `ServiceBuilder`, the **first** `.layer()` call is the outermost:
//!
//! ```
//! # use axum::{Router, extract::Request, middleware::{self, Next}, response::Response, routing::post};
//! # use idem_core::{Idempotency, MemoryStore};
//! # use idem_http::{IdempotencyLayer, scope};
//! # #[derive(Clone)]
//! # struct User { id: u64 }
//! # async fn authenticate(request: Request, next: Next) -> Response { next.run(request).await }
//! use tower::ServiceBuilder;
//!
//! let idem = Idempotency::new(MemoryStore::new());
//! let app: Router = Router::new()
//!     .route("/payments", post(|| async { "charged once" }))
//!     .layer(
//!         ServiceBuilder::new()
//!             .layer(middleware::from_fn(authenticate)) // first, so outermost: runs first
//!             .layer(IdempotencyLayer::new(idem, scope::by_principal(|user: &User| user.id))),
//!     );
//! # let _ = app;
//! ```

use std::fmt::{Display, Write as _};

use http::StatusCode;
use http::request::Parts;
use idem_core::Fingerprint;
use idem_core::key::MAX_PART_LEN;

use crate::{Problem, Refusal};

/// The principal of type `T` that an authentication layer put in the request's
/// extensions; a 401 `application/problem+json` refusal (type
/// `tag:idem-http,2026:unauthenticated`) when there is none.
///
/// Use it in a scope function of your own; [`by_principal`] is the common case.
///
/// ```
/// use http::Request;
/// use idem_http::scope;
///
/// #[derive(Clone, Debug)]
/// struct AccountId(String);
///
/// let (mut parts, ()) = Request::post("/payments").body(()).unwrap().into_parts();
/// // No principal: refused, never a shared scope.
/// let refused = scope::principal::<AccountId>(&parts).unwrap_err().into_http_response();
/// assert_eq!(refused.status(), 401);
///
/// parts.extensions.insert(AccountId("acct_42".into()));
/// assert_eq!(scope::principal::<AccountId>(&parts).ok().map(|a| a.0.as_str()), Some("acct_42"));
/// ```
///
/// # Errors
/// The 401 refusal, when the extensions hold no `T`.
pub fn principal<T: Send + Sync + 'static>(parts: &Parts) -> Result<&T, Refusal> {
    parts.extensions.get::<T>().ok_or_else(|| {
        // Debug only: unauthenticated clients are common. A route where every request
        // ends here has its authentication layer inside the idempotency layer.
        tracing::debug!(
            principal = std::any::type_name::<T>(),
            "no principal in the request extensions: refusing (is the authentication layer outside IdempotencyLayer?)"
        );
        unauthenticated()
    })
}

fn unauthenticated() -> Refusal {
    Problem::new(
        StatusCode::UNAUTHORIZED,
        "unauthenticated",
        "Authentication required",
    )
    .detail(
        "An idempotency key belongs to the caller who sent it, and this request carries no \
         authenticated caller. Nothing was done.",
    )
    .into()
}

/// A scope function for [`IdempotencyLayer::new`](crate::IdempotencyLayer::new): the
/// principal of type `T` from the request's extensions, named by `name`, plus the method
/// and path ([`operation`]). A request without a principal, or whose principal's name is
/// empty, is refused with 401 (see [`principal`]).
///
/// The name must tell principals apart (an account or user id, never a display name).
///
/// ```
/// use http::Request;
/// use idem_http::scope;
///
/// #[derive(Clone)]
/// struct User { id: u64 }
///
/// let scope = scope::by_principal(|user: &User| user.id);
/// let (mut parts, ()) = Request::post("/payments").body(()).unwrap().into_parts();
/// assert_eq!(scope(&parts).unwrap_err().into_http_response().status(), 401);
/// parts.extensions.insert(User { id: 7 });
/// assert_eq!(scope(&parts).unwrap(), "7/POST /payments");
/// ```
pub fn by_principal<T, D, F>(
    name: F,
) -> impl Fn(&Parts) -> Result<String, Refusal> + Clone + Send + Sync + 'static
where
    T: Send + Sync + 'static,
    D: Display,
    F: Fn(&T) -> D + Clone + Send + Sync + 'static,
{
    move |parts: &Parts| {
        let principal = principal::<T>(parts)?;
        operation(name(principal), parts)
    }
}

/// The scope `"{principal}/{METHOD} {path}"` (the query is not part of it: it is in the
/// request's fingerprint).
///
/// - An empty `principal` is refused with 401, like a missing one: it would be shared.
/// - A scope that would not fit in a key part (255 bytes), or that holds a control
///   character, becomes `sha256:` and the hex SHA-256 of its principal, method and path:
///   still one scope per principal and route, never an invalid key.
///
/// Scopes of two different (principal, method, path) never coincide: a method has no
/// `/` or space and a path has no space, so the scope reads back unambiguously.
///
/// ```
/// use http::Request;
/// use idem_http::scope;
///
/// let (parts, ()) = Request::post("/payments?dry_run=1").body(()).unwrap().into_parts();
/// assert_eq!(scope::operation("acct_42", &parts).unwrap(), "acct_42/POST /payments");
/// assert_eq!(scope::operation("", &parts).unwrap_err().into_http_response().status(), 401);
/// let long = "a".repeat(300);
/// assert!(scope::operation(&long, &parts).unwrap().starts_with("sha256:"));
/// ```
///
/// # Errors
/// The 401 refusal, for an empty principal.
pub fn operation(principal: impl Display, parts: &Parts) -> Result<String, Refusal> {
    let principal = principal.to_string();
    if principal.is_empty() {
        return Err(unauthenticated());
    }
    let scope = format!("{principal}/{} {}", parts.method, path(parts));
    if scope.len() <= MAX_PART_LEN && !scope.chars().any(char::is_control) {
        return Ok(scope);
    }
    let digest = Fingerprint::builder()
        .field("idem-http scope")
        .field(&principal)
        .field(parts.method.as_str())
        .field(path(parts))
        .finish();
    // No readable scope has this form: each holds a space, this one none.
    Ok(format!("sha256:{}", hex(digest.as_bytes())))
}

/// The request's path as the outermost axum router received it (`OriginalUri`), when
/// the layer sits inside `Router::nest` or `nest_service`, which strip their prefix from
/// the URI the inner service gets; otherwise the URI's own path.
///
/// Use it, not `parts.uri.path()`, wherever a scope or a fingerprint of your own names the
/// route: behind `nest("/tenants/a", ..)` and `nest("/tenants/b", ..)` the stripped path
/// is the same `/payments` for both, and one tenant's retry would replay the other's
/// answer. [`operation`], [`by_principal`] and the layer's default fingerprint use it.
///
/// - A rewrite made before the router (tower-http's `NormalizePath` around it, a gateway
///   stripping a prefix) is what the router receives, so it counts.
/// - A rewrite made between the router and this layer (a `map_request` that aliases one
///   path to another) does not, unless it also sets `OriginalUri` to the path it wants
///   to count (as `idem proxy` does with the path it makes plain).
/// - Without the `axum` feature this is the URI's own path: under axum's `nest`, scope by
///   the full path yourself.
///
/// ```
/// use http::Request;
/// use idem_http::scope;
///
/// let (parts, ()) = Request::post("/payments?dry_run=1").body(()).unwrap().into_parts();
/// assert_eq!(scope::path(&parts), "/payments");
/// ```
pub fn path(parts: &Parts) -> &str {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::OriginalUri(original)) = parts.extensions.get() {
        return original.path();
    }
    parts.uri.path()
}

/// A principal's name for a principal that is itself a secret (an API key sent on every
/// request): 64 hex digits of its SHA-256, so the store never holds the secret, and a
/// long one (a 1 KB key) still fits in a scope.
///
/// For high-entropy secrets only (generated keys): a hash of a guessable secret (a
/// password) can be guessed back. And only for a secret that stays the same across the
/// tries of one operation: a token that is refreshed (a JWT, an OAuth access token) puts
/// a retry in another scope; scope those by the subject the authentication layer
/// verified.
///
/// ```
/// use idem_http::scope;
///
/// let name = scope::hashed("sk_live_51H8...".repeat(100));
/// assert_eq!(name.len(), 64);
/// assert_eq!(name, scope::hashed("sk_live_51H8...".repeat(100)));
/// assert_ne!(name, scope::hashed("sk_live_other"));
/// ```
pub fn hashed(secret: impl AsRef<[u8]>) -> String {
    let digest = Fingerprint::builder()
        .field("idem-http principal")
        .field(secret)
        .finish();
    hex(digest.as_bytes())
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{byte:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use http::Request;

    use super::*;

    fn parts(uri: &str) -> Parts {
        Request::post(uri).body(()).unwrap().into_parts().0
    }

    fn is_lower_hex(text: &str) -> bool {
        text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    }

    /// A readable scope while it fits the key's rules; past 255 bytes, or with a control
    /// character, the digest of its parts (which tells routes apart).
    #[test]
    fn a_scope_is_readable_while_it_fits_and_a_digest_otherwise() {
        // "/POST " and the path: 6 + 9 bytes around the principal.
        let at_limit = "a".repeat(MAX_PART_LEN - 15);
        let scope = operation(&at_limit, &parts("/payments")).unwrap();
        assert_eq!(scope, format!("{at_limit}/POST /payments"));
        let past = operation(format!("{at_limit}a"), &parts("/payments")).unwrap();
        let control = operation("acct\n42", &parts("/payments")).unwrap();
        for digest in [&past, &control] {
            let hex = digest.strip_prefix("sha256:").expect(digest);
            assert!(is_lower_hex(hex), "{digest}");
        }
        assert_ne!(
            control,
            operation("acct\n42", &parts("/refunds")).unwrap(),
            "the route counts in the digest"
        );
        assert_ne!(
            past,
            operation(format!("{at_limit}b"), &parts("/payments")).unwrap(),
            "and the principal: two tenants never share a digest"
        );
    }

    #[test]
    fn a_hashed_principal_is_its_digest_in_hex() {
        assert!(is_lower_hex(&hashed("sk_live_1")));
        assert_eq!(hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
    }
}
