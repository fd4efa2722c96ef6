//! # idem-http
//!
//! The `Idempotency-Key` HTTP header for any tower-based server (axum, tonic's HTTP stack,
//! plain hyper), following the IETF draft "The Idempotency-Key HTTP Header Field" and what
//! Stripe-style APIs do: a client sends a key with a POST, retries it after a timeout, and
//! gets the first response back, not a second charge.
//!
//! ```
//! use axum::{Router, routing::post};
//! use idem_core::{Idempotency, MemoryStore};
//! use idem_http::IdempotencyLayer;
//!
//! let idem = Idempotency::new(MemoryStore::new()); // any idem store
//! let app: Router = Router::new()
//!     .route("/payments", post(|| async { "charged once" }))
//!     .layer(IdempotencyLayer::new(idem, |parts| {
//!         // The scope: who is asking, and for what. Keys of two scopes never meet.
//!         let principal = parts.headers.get("x-account").and_then(|v| v.to_str().ok()).unwrap_or("anonymous");
//!         Ok(format!("{principal}/{} {}", parts.method, parts.uri.path()))
//!     }));
//! # let _ = app;
//! ```
//!
//! ## The answers
//!
//! | situation | answer |
//! |---|---|
//! | key missing where required | 400, `application/problem+json` saying the header is required |
//! | key malformed | 400, problem+json naming the rule it broke |
//! | request body over the limit | 413, before anything is claimed |
//! | same key, same request, first time | the handler runs once; its response goes to the client and is stored |
//! | same key, same request, again | the stored status, headers and body, byte for byte, plus `Idempotent-Replayed: true` |
//! | same key, different request | 422, problem+json; never the original request, response or fingerprint |
//! | same key while the first is still running | 409 with `Retry-After` (whole seconds, rounded up), or a wait under `InFlightPolicy::Wait` |
//! | key refused by the driver's [`KeyPolicy`](idem_core::KeyPolicy) | 400, problem+json naming the rule |
//! | a new key over the scope's [`KeyBudget`](idem_core::driver::KeyBudget) | 429 with `Retry-After`; keys already stored still replay |
//! | store unavailable | 503 with `Retry-After`; the handler does not run |
//!
//! Problem types are tag URIs under [`PROBLEM_TYPE_BASE`]: `missing-key`,
//! `malformed-key`, `key-refused`, `too-many-new-keys`, `request-too-large`, `key-reused`,
//! `in-flight`, `taken-over`,
//! `store-unavailable`, `response-not-stored`, `handler-failed`, `internal`.
//!
//! ## What a response becomes
//!
//! A [`Disposition`] per response: stored and replayed, released (nothing happened, a
//! retry runs the handler again), or held (the effect may have happened: the key stays
//! held until the lease ends, then a retry takes over). The status policy decides
//! ([`default_disposition`]: 5xx held, 408/425/429 released, the rest stored); a handler
//! overrides it by putting a `Disposition` in the response's extensions. The default never
//! releases a key whose effect may have happened.
//!
//! Stored headers are an allowlist ([`DEFAULT_STORED_HEADERS`]); hop-by-hop headers never,
//! `Set-Cookie` only when enabled. Responses are stored as a compact binary encoding of
//! status, headers and body ([`StoredResponse`]) through
//! [`Idempotency::execute_bytes`](idem_core::Idempotency::execute_bytes).
//!
//! ## What it survives
//!
//! - **The client goes away.** The handler runs in a task of its own: a disconnect or a
//!   timeout layer above does not cancel the work halfway; its response is stored and the
//!   client's retry replays it.
//! - **Concurrent duplicates.** One runs the handler; the others get 409 (or wait).
//! - **Crashes.** A process that dies mid-handler leaves the key held until the lease
//!   ends; then a retry takes over. The handler reaches [`idem_core::Context`] through the
//!   request's extensions (`axum::Extension<Context>`), for steps that run once across
//!   takeovers and keys for downstream calls.
//!
//! Request and response bodies of protected requests are read whole into memory (within
//! their limits): the layer is for API calls, not file transfers.
//!
//! ## Where things live
//!
//! - `layer.rs`: [`IdempotencyLayer`] and its settings; `service.rs`: the service it
//!   builds, one request from its header to its answer; `answer.rs`: the driver's answer
//!   as a response or a problem.
//! - `key_header.rs`: reading `Idempotency-Key`; `request_fingerprint.rs`: what makes two
//!   requests the same; `disposition.rs`: what becomes of a response; `stored.rs`: how a
//!   response is stored; `problem.rs`: the problem documents; `body.rs`: the body type.
//! - [`observe`]: the metrics.

#![warn(missing_docs)]

mod answer;
mod body;
mod disposition;
mod grpc;
mod handlers;
mod key_header;
mod layer;
pub mod observe;
mod problem;
mod request_fingerprint;
mod service;
mod stored;
mod streaming;

pub use body::Body;
pub use disposition::{Disposition, default_disposition};
pub use grpc::grpc_disposition;
pub use handlers::Handlers;
pub use key_header::KeyHeaderError;
pub use layer::{
    DEFAULT_HEADER, DEFAULT_IN_FLIGHT_RETRY_AFTER, DEFAULT_MAX_REQUEST_BODY,
    DEFAULT_MAX_RESPONSE_BODY, DEFAULT_STORED_HEADERS, IdempotencyLayer, KeyRequirement,
};
pub use problem::{PROBLEM_TYPE_BASE, Problem, Refusal};
pub use service::{BODY_NOT_STORED_HEADER, IdempotencyService, REPLAYED_HEADER};
pub use stored::{DecodeError, StoredResponse};

/// The workspace README's examples, compiled and run as doc tests here, where idem-core,
/// the SQLite store, the testkit, axum and this crate are all in reach.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
