//! axum support (the `axum` feature, on by default): the [`Idempotent`] extractor for the
//! driver's context, and [`IntoResponse`] for [`Problem`] and [`Refusal`].
//!
//! A handler behind [`IdempotencyLayer`](crate::IdempotencyLayer) takes `Idempotent(ctx)`
//! and calls the outside world through [`Context::step`] (run once across takeovers) with
//! a key from [`Context::derive`] (so the other system deduplicates the calls a crash
//! repeats). See the crate docs' "Handlers" section for what to answer when a step fails.
//!
//! A handler can return `Result<_, Problem>` and use `?`, or answer
//! `problem.into_response()` as any axum response ([`Problem::into_http_response`] gives
//! the plain `http` response, for tower services).
//!
//! ```
//! use axum::{Json, Router, response::IntoResponse, routing::post};
//! use http::StatusCode;
//! use idem_http::Problem;
//!
//! async fn refund(Json(amount): Json<u64>) -> Result<impl IntoResponse, Problem> {
//!     let amount = check(amount)?; // a Problem becomes a 422 problem+json response
//!     Ok((StatusCode::CREATED, Json(amount)))
//! }
//!
//! fn check(amount: u64) -> Result<u64, Problem> {
//!     if amount == 0 {
//!         return Err(Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "zero-amount", "Nothing to refund"));
//!     }
//!     Ok(amount)
//! }
//!
//! async fn gone() -> axum::response::Response {
//!     Problem::new(StatusCode::GONE, "gone", "This route is retired").into_response()
//! }
//!
//! let app: Router = Router::new().route("/refunds", post(refund)).route("/old", post(gone));
//! # let _ = app;
//! ```
//!
//! A [`Disposition`] is a response part: `(Disposition::Release, problem)` answers the
//! problem and releases the key.

use std::convert::Infallible;
use std::ops::Deref;

use axum_core::body::Body as AxumBody;
use axum_core::extract::{FromRequestParts, OptionalFromRequestParts};
use axum_core::response::{IntoResponse, IntoResponseParts, Response, ResponseParts};
use http::StatusCode;
use http::request::Parts;
use idem_core::Context;

use crate::{Disposition, Problem, Refusal};

/// The driver's [`Context`] of a request [`IdempotencyLayer`](crate::IdempotencyLayer)
/// protects, as an axum extractor: steps that run once across retries and takeovers
/// ([`Context::step`]), keys for downstream calls ([`Context::derive`]), the fencing token
/// ([`Context::token`]). It derefs to the `Context`.
///
/// - On a route that requires the key, take `Idempotent`. A request that reaches the
///   handler without a context (the route is not behind the layer, or its method passes
///   through) is answered 500 `application/problem+json` (type
///   `tag:idem-http,2026:not-protected`) and the handler does not run: it is a wiring
///   mistake, and running the work unprotected would be worse.
/// - Where the key is optional ([`KeyRequirement::Optional`](crate::KeyRequirement)),
///   take `Option<Idempotent>`: `None` for a request sent without a key.
///
/// ```
/// use axum::{Json, Router, routing::post};
/// use idem_core::{Idempotency, MemoryStore, WorkError};
/// use idem_http::{Idempotent, IdempotencyLayer, KeyRequirement};
///
/// async fn charge(provider_key: &str, amount: u64) -> Result<String, WorkError<String>> {
///     // A real provider call sends `provider_key` as its own idempotency key.
///     Ok(format!("ch_{amount}_{}", &provider_key[..12]))
/// }
///
/// async fn create_payment(Idempotent(ctx): Idempotent, Json(amount): Json<u64>) -> Json<String> {
///     // Runs once per key, even when a retry takes over after a crash.
///     let provider_key = ctx.derive("provider");
///     match ctx.step("charge", || charge(&provider_key, amount)).await {
///         Ok(charge) => Json(charge),
///         Err(_) => Json("see the crate docs' Handlers section".to_owned()),
///     }
/// }
///
/// async fn update_profile(idem: Option<Idempotent>) -> &'static str {
///     if idem.is_some() { "updated, once per key" } else { "updated" }
/// }
///
/// let idem = Idempotency::new(MemoryStore::new());
/// let app: Router = Router::new()
///     .route("/payments", post(create_payment))
///     .route("/profile", axum::routing::put(update_profile))
///     .layer(
///         IdempotencyLayer::new(idem, |parts| Ok(format!("{} {}", parts.method, idem_http::scope::path(parts))))
///             .method(http::Method::PUT, KeyRequirement::Optional),
///     );
/// # let _ = app;
/// ```
#[derive(Clone, Debug)]
pub struct Idempotent(pub Context);

impl Idempotent {
    /// The context.
    ///
    /// ```
    /// # fn f(idem: idem_http::Idempotent) {
    /// let ctx: idem_core::Context = idem.into_inner();
    /// # let _ = ctx;
    /// # }
    /// ```
    pub fn into_inner(self) -> Context {
        self.0
    }
}

impl Deref for Idempotent {
    type Target = Context;

    fn deref(&self) -> &Context {
        &self.0
    }
}

impl From<Idempotent> for Context {
    fn from(idempotent: Idempotent) -> Self {
        idempotent.0
    }
}

/// The rejection of a request that reached an `Idempotent` handler unprotected.
fn not_protected() -> Problem {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "not-protected",
        "The request is not protected by IdempotencyLayer",
    )
    .detail(
        "This handler needs the idempotency layer's context, and the request reached it \
         without one: the route is not behind IdempotencyLayer, or its method passes \
         through the layer. Nothing was done.",
    )
}

impl<S: Send + Sync> FromRequestParts<S> for Idempotent {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        match parts.extensions.get::<Context>() {
            Some(ctx) => Ok(Self(ctx.clone())),
            None => {
                // The server's wiring, not the client: say so where operators look.
                tracing::error!(
                    method = %parts.method,
                    path = crate::scope::path(parts),
                    "a handler extracting Idempotent was reached without IdempotencyLayer's context"
                );
                Err(not_protected())
            }
        }
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for Idempotent {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Option<Self>, Infallible> {
        Ok(parts.extensions.get::<Context>().cloned().map(Self))
    }
}

/// A problem as an axum response: its status, `application/problem+json`, and
/// `Retry-After` when set.
impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        self.into_bytes_response().map(AxumBody::from)
    }
}

/// The refusal's response, as an axum response.
impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        self.into_http_response().map(AxumBody::new)
    }
}

/// A disposition as a part of an axum response: it goes in the response's extensions,
/// where the layer reads it, overriding the status policy for this response.
///
/// ```
/// use axum::{Router, response::IntoResponse, routing::post};
/// use http::StatusCode;
/// use idem_http::{Disposition, Problem};
///
/// async fn pay() -> impl IntoResponse {
///     // The provider refused before doing anything: nothing happened, so release the key
///     // now (a 503 would otherwise be held until the lease ends).
///     let problem = Problem::new(StatusCode::SERVICE_UNAVAILABLE, "provider-unavailable", "Try again")
///         .retry_after(1);
///     (Disposition::Release, problem)
/// }
/// let app: Router = Router::new().route("/payments", post(pay));
/// # let _ = app;
/// ```
impl IntoResponseParts for Disposition {
    type Error = Infallible;

    fn into_response_parts(self, mut parts: ResponseParts) -> Result<ResponseParts, Infallible> {
        parts.extensions_mut().insert(self);
        Ok(parts)
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    async fn parts_of(response: Response) -> (StatusCode, http::HeaderMap, bytes::Bytes) {
        let (parts, body) = response.into_parts();
        (
            parts.status,
            parts.headers,
            body.collect().await.unwrap().to_bytes(),
        )
    }

    /// A problem and a refusal answer as themselves from an axum handler (`Result<_,
    /// Problem>`, `Result<_, Refusal>`).
    #[tokio::test]
    async fn problems_and_refusals_are_their_own_responses() {
        let problem = Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "zero-amount",
            "Nothing to pay",
        )
        .retry_after(3);
        let (status, headers, body) = parts_of(problem.clone().into_response()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(headers["content-type"], "application/problem+json");
        assert_eq!(headers["retry-after"], "3");
        let document: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(document["type"], "tag:idem-http,2026:zero-amount");
        let (status, _, refused) = parts_of(Refusal::from(problem).into_response()).await;
        assert_eq!((status, refused), (StatusCode::UNPROCESSABLE_ENTITY, body));
        let response = http::Response::builder()
            .status(StatusCode::CONFLICT)
            .header("x-reason", "below-minimum")
            .body(crate::Body::from(bytes::Bytes::from_static(b"too small")))
            .unwrap();
        let (status, headers, body) = parts_of(Refusal::from(response).into_response()).await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(headers["x-reason"], "below-minimum");
        assert_eq!(body, "too small");
    }
}
