//! # idem-http
//!
//! The `Idempotency-Key` HTTP header for any tower-based server (axum, tonic's HTTP stack,
//! plain hyper), following the IETF draft "The Idempotency-Key HTTP Header Field" and what
//! Stripe-style APIs do: a client sends a key with a POST, retries it after a timeout, and
//! gets the first response back, not a second charge.
//!
//! ```
//! use axum::{Router, extract::Request, middleware::{self, Next}, response::Response, routing::post};
//! use idem_core::{Idempotency, MemoryStore};
//! use idem_http::{IdempotencyLayer, scope};
//!
//! /// The caller your authentication verified.
//! #[derive(Clone)]
//! struct AccountId(String);
//!
//! async fn authenticate(mut request: Request, next: Next) -> Response {
//!     if let Some(account) = verify(request.headers()) {
//!         request.extensions_mut().insert(account);
//!     }
//!     next.run(request).await
//! }
//! # fn verify(_: &http::HeaderMap) -> Option<AccountId> { Some(AccountId("acct_42".into())) }
//!
//! let idem = Idempotency::new(MemoryStore::new()); // any idem store
//! let app: Router = Router::new()
//!     .route("/payments", post(|| async { "charged once" }))
//!     // The scope: who is asking, and for what ("acct_42/POST /payments"). Keys of two
//!     // scopes never meet; a request without an account is refused with 401.
//!     .layer(IdempotencyLayer::new(idem, scope::by_principal(|account: &AccountId| account.0.clone())))
//!     // Authentication runs first: the last `.layer()` is the outermost (see `scope`).
//!     .layer(middleware::from_fn(authenticate));
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
//! | same key while the first is still running | 409 with `Retry-After` (the lease's end, at most [`in_flight_retry_after`](IdempotencyLayer::in_flight_retry_after), 1 s by default), or a wait under `InFlightPolicy::Wait` |
//! | same key after the first got a response that was held (a 5xx), until its lease ends | 409 with `Retry-After` (the lease's end, at most [`held_retry_after`](IdempotencyLayer::held_retry_after), 30 s by default) from the replica that held it; from another, as while running |
//! | key refused by the driver's [`KeyPolicy`](idem_core::KeyPolicy) | 400, problem+json naming the rule |
//! | a new key over the scope's [`KeyBudget`](idem_core::driver::KeyBudget) | 429 with `Retry-After`; keys already stored still replay |
//! | store unavailable | 503 with `Retry-After`; the handler does not run |
//! | request body unreadable (the client went away mid-upload) | 400, nothing claimed |
//! | a route axum did not match | under `route_layer`, never seen: axum's 404; under `Router::layer`, protected, and the 404 released, never stored (or passed on untouched with [`leave_unmatched_routes`](IdempotencyLayer::leave_unmatched_routes)) |
//!
//! Problem types are tag URIs under [`PROBLEM_TYPE_BASE`] (or a base of your own, a link to
//! your documentation: [`problem_type_base`](IdempotencyLayer::problem_type_base)):
//! `missing-key`, `malformed-key`, `key-refused`, `too-many-new-keys`,
//! `request-too-large`, `unreadable-body`, `key-reused`, `in-flight`, `taken-over`,
//! `store-unavailable`, `response-not-stored`, `handler-failed`, `internal`, and the
//! extractor's `not-protected`.
//!
//! ## What a response becomes
//!
//! A [`Disposition`] per response: stored and replayed, released (nothing happened, a
//! retry runs the handler again), or held (the effect may have happened: the key stays
//! held until the lease ends, then a retry takes over). The status policy decides
//! ([`default_disposition`]: 5xx and 408 held; other 4xx released, as nothing was done,
//! but 402 stored;
//! the rest stored, each status with its reason in the table there); gRPC answers go by
//! their `grpc-status` ([`grpc_disposition`]); a handler overrides either by putting a
//! `Disposition` in the response's extensions. The default never releases a key whose
//! effect may have happened.
//!
//! A released key is forgotten: a retry runs the handler again, and so does a corrected
//! request under the same key (another body, after a 400 or a 422), as Stripe does. A
//! handler that checkpointed a step, or derived a key for another system
//! (`ctx.derive`), before answering released keeps the key for a takeover instead: its
//! retry resumes past that step with the same derived keys, and a corrected request under
//! the key is 422, because that work was done for the first request. Validate before
//! deriving keys, so that a refused request leaves nothing behind.
//!
//! Stored headers are an allowlist ([`DEFAULT_STORED_HEADERS`]); hop-by-hop headers never,
//! `Set-Cookie` only when enabled; trailers are stored with the body, but for hop-by-hop
//! names (a response stored without its body is stored without them, but for a gRPC
//! answer whose status decides, whose trailers hold it).
//! Responses are stored as a compact binary encoding of status, headers, body and
//! trailers ([`StoredResponse`]) through
//! [`Idempotency::execute_bytes`](idem_core::Idempotency::execute_bytes). A replay can be
//! adjusted before it is sent ([`on_replay`](IdempotencyLayer::on_replay)).
//!
//! ## Streams
//!
//! A protected response goes to its client as the handler writes it, frame by frame, at
//! the client's pace (a few frames buffered, no more): server-sent events arrive as they
//! are sent, and a large download is never held in memory.
//!
//! - A body that ends within [`max_response_body`](IdempotencyLayer::max_response_body)
//!   (and the store's room) is stored whole, trailers included, when it ends; retries
//!   replay it byte for byte.
//! - A body that passes the limit goes on streaming to its client, whole; its key is
//!   finished at once with the status and stored headers only, so retries get that
//!   status, an empty body and [`BODY_NOT_STORED_HEADER`] without waiting for the stream
//!   (an endless stream does not hold its key while it lasts). An error after that point
//!   reaches the client but not the record. A gRPC answer whose status decides waits for
//!   the `grpc-status` in its trailers, and is then stored without its body, trailers
//!   kept, or held; one whose handler chose to store it is finished at once, like any
//!   other, without its trailers.
//! - A client that goes away (before the response began, or while it streamed): the
//!   body is read on for the record, for at most a lease. A stream that ends by then is
//!   stored as above; one that does not finishes its key without the body (a gRPC
//!   answer whose status decides, still to come, is held), so a stream that never ends never
//!   holds its key for long. A client that stays connected but stops reading holds it
//!   while the connection lasts.
//! - A body that breaks off before the record is finished is sent to the client as an
//!   error (the connection is cut, not ended cleanly), and the key is held; for a
//!   response marked [`FinalHead`] (its status is its outcome, as an upstream's is to
//!   `idem proxy`), the head's disposition decides instead (a stored one is finished with
//!   the status and headers, without the body), and the client's cut comes once the key
//!   is finished.
//! - Trailers reach the client, and the record with the body: a tonic gRPC service keeps
//!   its `grpc-status`, fresh and replayed, and a replay of one stored without its body
//!   tells it when its status decided (in [`GRPC_ORIGINAL_STATUS_HEADER`]).
//!
//! ## gRPC
//!
//! A gRPC call (`content-type: application/grpc`) is protected like any POST, its key in
//! the call's metadata. What differs:
//!
//! - **Unary and server-streaming calls** are supported: the request is one message, read
//!   whole before the call runs. A call that streams its request (client streaming,
//!   bidirectional) is refused with `grpc-status` 12 UNIMPLEMENTED before anything is
//!   claimed: a second message, or a request still open 5 s after its first message.
//!   Exempt such methods ([`requirement_with`](IdempotencyLayer::requirement_with)), or
//!   call them without a key.
//! - **The layer's own refusals are gRPC statuses**, not problem documents: in flight is
//!   14 UNAVAILABLE with `grpc-retry-pushback-ms` (retry with the same key), a reused key
//!   9 FAILED_PRECONDITION (send a new key), a missing key 3 INVALID_ARGUMENT; the table
//!   is [`grpc_code`], and the problem type rides in [`GRPC_PROBLEM_HEADER`]. So is a
//!   [`Problem`] the service answers itself (a gRPC client cannot read problem+json),
//!   the same status fresh and replayed.
//! - **Answers are kept by their `grpc-status`** ([`grpc_disposition`]), in the headers
//!   of a trailers-only answer or in the trailers.
//! - **A replay whose message was too large to store** is 6 ALREADY_EXISTS, the first
//!   status in [`GRPC_ORIGINAL_STATUS_HEADER`] (when it decided, not a [`Disposition`] the
//!   handler chose): never OK without its message, which a client would decode as an
//!   empty one.
//!
//! ## What it survives
//!
//! - **The client goes away.** The handler runs inline, in the request's own task, and is
//!   moved to a task of its own the moment the client goes away (a disconnect, a timeout
//!   layer above dropping the request), or when its response streams: the work is never
//!   cancelled halfway; its response is stored and the client's retry replays it. A
//!   graceful shutdown waits for those handlers with [`Handlers::wait`].
//! - **Concurrent duplicates.** One runs the handler; the others get 409 (or wait).
//! - **Crashes.** A process that dies mid-handler leaves the key held until the lease
//!   ends; then a retry takes over. The handler reaches [`idem_core::Context`] with the
//!   [`Idempotent`] extractor (or from the request's extensions), for steps that run once
//!   across takeovers and keys for downstream calls. A handler that panics answers 500
//!   and holds its key.
//! - **A slow inner service.** The layer is ready when the inner service is: its
//!   backpressure (a concurrency limit, a load shedder) reaches the server.
//!
//! A protected request's body is read whole (within
//! [`max_request_body`](IdempotencyLayer::max_request_body)) to fingerprint it; the
//! response streams (see above).
//!
//! ## Keys from other places
//!
//! [`header`](IdempotencyLayer::header) reads another header (`webhook-id` for Standard
//! Webhooks: `examples/webhooks` verifies the signature outside the layer, before anything
//! is claimed, and runs each delivery once); [`key_with`](IdempotencyLayer::key_with)
//! takes the key from the request itself (an event id in the body);
//! [`requirement_with`](IdempotencyLayer::requirement_with) makes the key required,
//! optional or exempt per route, in one layer.
//!
//! ## Where things live
//!
//! - `layer/`: [`IdempotencyLayer`] and its settings (`config.rs`: the settings every
//!   service of a layer shares); `service/`: the service it builds, one request from its
//!   header to its answer (`request.rs`: up to the claim, or refused or passed on;
//!   `protected.rs`: the claim and the answer sent; `handler_response.rs`: the handler's
//!   response streamed and stored; `failures.rs`: a failed or shed handler's answer);
//!   `streaming.rs`: a response streamed while its record is finished; `handlers.rs`: the
//!   handlers that outlived their request; `answer.rs`: the driver's answer as a response
//!   or a problem.
//! - `key_header.rs`: reading `Idempotency-Key`; `request_fingerprint/`: what makes two
//!   requests the same (`json_parser.rs` and `json_canonical.rs`: JSON bodies;
//!   `urlencoded.rs`: queries and forms; `mod.rs`: the whole fingerprint; `tests/`: its
//!   tests by the same parts); `request_body.rs`: a compressed or multipart body by what
//!   it says; `request_read.rs`: a protected request's body read whole, a gRPC call's one
//!   message; `disposition.rs` and `grpc.rs`: what becomes of a response;
//!   `stored.rs`: how a response is stored; `problem.rs`: the problem documents;
//!   `body.rs`: the body type.
//! - [`scope`]: scopes from a verified principal; [`axum`]: the extractor and responses.
//! - [`observe`]: the metrics.
//!
//! ## Scopes, and where authentication goes
//!
//! The scope names whose key it is: build it from the principal your authentication layer
//! verified, with [`scope::by_principal`] (or [`scope::principal`] in a function of your
//! own), never from a raw header and never with a fallback such as `"anonymous"` that every
//! unauthenticated request would share. A principal that is itself a secret (an API key) is
//! named by its hash, [`scope::hashed`]. The authentication layer goes **outside** the
//! idempotency layer: with `Router::layer` the last call is the outermost, with tower's
//! `ServiceBuilder` the first; the [`scope`] module shows both.
//!
//! ## Composing with other layers
//!
//! Where the idempotency layer goes among the middlewares a service already stacks, and
//! why; each placement is tested on a real axum router (the test file in brackets).
//! "Outside" means the other middleware sees the request first: with `Router::layer` it
//! is added after this layer, with tower's `ServiceBuilder` before it.
//!
//! | middleware | place it | why |
//! |---|---|---|
//! | authentication | outside | the scope is built from the principal it verified; inside, there is no principal yet and every caller shares one scope ([`scope`] module; `handlers.rs`) |
//! | routing | `Router::route_layer` (or the layer inside `nest`, or on the outer router) | scopes and fingerprints use the path the outermost router received ([`scope::path`]), so nested routes never share answers; a request no route matched answers as without the layer (`routers.rs`, `traffic/answers.rs`) |
//! | load shedding, concurrency limits | inside | the layer waits for the inner service's readiness; a request `LoadShed` refuses never ran, so its key is released and the client gets 503 with `Retry-After` (`composition.rs`). A shedder outside never lets the request reach the layer, which is safe too |
//! | timeouts | outside | a timeout outside drops the layer's future: the handler finishes in a task of its own and stores its answer for the retry. Inside, it cuts the handler off, perhaps after its effect: the key is held for a lease, whatever status the timeout answers (408 included) (`composition.rs`) |
//! | response compression | outside | the answer is stored plain and compressed per try, as each retry's `Accept-Encoding` says; inside, the first try's encoding is stored and replayed to every retry (`composition.rs`) |
//! | request decompression | either | outside, the layer sees the decoded body; inside, the layer fingerprints a gzip or deflate body by what it decodes to, and a multipart body by its parts, so a retry compressed again or with a new boundary is the same request (`composition.rs`) |
//! | request ids, tracing | outside | a replay then carries the retry's own id; the layer never stores `x-request-id` ([`DEFAULT_STORED_HEADERS`]) (`composition.rs`) |
//! | retries (a client's, a gateway's) | outside, in the caller | every try carries the same key, so a retry of a request that ran is answered, not run again (idem-client's `composition.rs` and `retries.rs`); a retry middleware inside the layer would run the handler again under one claim, so do not put one there |
//! | gRPC (tonic) | around the service, inside the server's HTTP stack | refusals are gRPC statuses and answers are kept by their `grpc-status`; see "gRPC" above (`grpc.rs`) |
//!
//! ## axum
//!
//! With the `axum` feature (on by default), [`Idempotent`] extracts the driver's
//! [`Context`](idem_core::Context) (`Option<Idempotent>` where the key is optional),
//! [`Problem`] and [`Refusal`] are axum responses, and a [`Disposition`] is a response part;
//! see [`axum`]. Without the feature the crate needs only tower and http, and
//! handlers read the context from the request's extensions.
//!
//! ## Handlers
//!
//! A handler reaches the world through steps: `ctx.step(name, run)` runs `run` once across
//! retries and takeovers, and `ctx.derive(label)` is a key to send as the other system's own
//! idempotency key, the same for every run of this request, so a step that a crash makes run
//! twice is answered by that system, not repeated. The driver sees only the handler's
//! response, never the step's error: what `ctx.step` returns is the handler's to answer, and
//! the response's [`Disposition`] says what the layer does with it.
//!
//! | `ctx.step` returns | answer | [`Disposition`] | why |
//! |---|---|---|---|
//! | `Ok(value)` | the success (`201`) | `Store` (the default for 2xx) | the final answer, replayed to every retry |
//! | [`WorkError::Permanent`](idem_core::WorkError::Permanent) (`run` said so: the card was declined) | a 4xx (`402`, `422`) | `Store` (the default for 402; put it in the extensions for another 4xx, which the default releases) | final: a retry gets the same refusal, nothing runs again |
//! | [`WorkError::Retryable`](idem_core::WorkError::Retryable) (nothing took effect: the provider refused before acting) | `503` with `Retry-After` | `Release` (the default would hold a 5xx) | the key is released at once and a retry runs the handler again; steps already checkpointed are not run again |
//! | [`WorkError::Unknown`](idem_core::WorkError::Unknown) (the effect may have happened: a timeout) | `502` or `504` | `Hold` (the default for 5xx) | the key stays held until the lease ends, then a retry takes over and runs the step again with the same `ctx.derive` key, which the provider answers without acting twice; `Release` would let a retry race the effect, `Store` would keep an answer nobody knows is true |
//! | [`WorkError::Interrupted`](idem_core::WorkError::Interrupted), [`kind()`](idem_core::driver::Interrupted::kind) `LeaseLost` | `503` | `Hold` | another attempt took the key over, or this run's lease ended on its own clock with no renewal confirmed (a partition, a pause) and its steps were refused; a retry takes over after the lease, and nothing this run answers may replace what that attempt stores |
//! | `Interrupted`, `Store` | `503` with `Retry-After` | `Hold` | the step ran but its checkpoint could not be written: a takeover after the lease runs it again, under the same derived key |
//! | `Interrupted`, `Unstorable` | `500` | `Store` | the step ran and its value can never be checkpointed (too large, does not serialise): holding would run it again at every takeover, and fail again; a stored failure ends it, as idem-core stores this as the execution's permanent failure |
//! | `Interrupted`, `InvalidStepName`, `StepUndecodable`, `Codec`, `WrongEncoding` | `500` | `Hold` (the default) | a deployment's mistake (a step name breaking the rules, a step whose type changed: name it `charge.v2`; a retired codec key): hold, so that a fixed deployment takes over after the lease instead of a failure stored for good |
//! | `Interrupted`, `Compensating` | `500` | any | an earlier owner failed for good and the driver is undoing the completed steps ([`step_with_undo`](idem_core::Context::step_with_undo)); it finishes that whatever the handler answers |
//!
//! Every other variant ([`WorkError`](idem_core::WorkError) and
//! [`InterruptedKind`](idem_core::driver::InterruptedKind) are non-exhaustive): `500`, `Hold`.
//! Two things follow from the driver seeing only the response: the undos of
//! `step_with_undo` do not run on a handler's 4xx (undo in the handler, or answer `Hold` and
//! let a takeover decide), and [`Context::prepare_completion`](idem_core::Context::prepare_completion)
//! is not for handlers (the layer stores responses as raw bytes: it answers `WrongEncoding`).
//!
//! ```
//! use axum::response::{IntoResponse, Response};
//! use http::StatusCode;
//! use idem_core::{WorkError, driver::InterruptedKind};
//! use idem_http::{Disposition, Problem};
//!
//! /// What a handler answers when its provider call, run as a step, failed.
//! fn step_failed(err: WorkError<String>) -> Response {
//!     let (status, slug, disposition) = match &err {
//!         WorkError::Permanent(_) => (StatusCode::PAYMENT_REQUIRED, "payment-declined", Disposition::Store),
//!         WorkError::Retryable(_) => (StatusCode::SERVICE_UNAVAILABLE, "provider-unavailable", Disposition::Release),
//!         WorkError::Unknown(_) => (StatusCode::GATEWAY_TIMEOUT, "provider-timeout", Disposition::Hold),
//!         WorkError::Interrupted(i) => match i.kind() {
//!             InterruptedKind::LeaseLost | InterruptedKind::Store => {
//!                 (StatusCode::SERVICE_UNAVAILABLE, "interrupted", Disposition::Hold)
//!             }
//!             InterruptedKind::Unstorable => (StatusCode::INTERNAL_SERVER_ERROR, "unstorable", Disposition::Store),
//!             _ => (StatusCode::INTERNAL_SERVER_ERROR, "interrupted", Disposition::Hold),
//!         },
//!         _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal", Disposition::Hold),
//!     };
//!     let problem = Problem::new(status, slug, "The payment did not complete");
//!     let problem = if status == StatusCode::SERVICE_UNAVAILABLE { problem.retry_after(1) } else { problem };
//!     (disposition, problem).into_response()
//! }
//! # assert_eq!(step_failed(WorkError::Retryable("down".into())).extensions().get(), Some(&Disposition::Release));
//! ```
//!
//! `examples/payments.rs` is a whole service built this way.
//!
//! ## Testing a handler
//!
//! Put the handler behind the layer on a `idem_core::MemoryStore` whose clock
//! is a [`ManualClock`](idem_core::ManualClock), call the router with tower's `oneshot`, and
//! move the clock to end leases. Here the process "crashes" (the handler panics) after its
//! charge step; the retry within the lease gets 409; once the lease is over the retry takes
//! over, and the charge step is not run again: its checkpoint answers it.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
//! use std::time::Duration;
//!
//! use axum::{Router, body::Body, extract::State, routing::post};
//! use http::{Request, StatusCode};
//! use idem_core::{Idempotency, ManualClock, MemoryStore, WorkError};
//! use idem_http::{Idempotent, IdempotencyLayer, scope};
//! use tower::ServiceExt;
//!
//! #[derive(Clone, Default)]
//! struct Provider {
//!     charges: Arc<AtomicUsize>,
//!     crash_after_charge: Arc<AtomicBool>,
//! }
//!
//! async fn pay(State(provider): State<Provider>, Idempotent(ctx): Idempotent) -> (StatusCode, String) {
//!     let provider_key = ctx.derive("provider");
//!     let charge = ctx
//!         .step("charge", || async {
//!             provider.charges.fetch_add(1, Ordering::SeqCst); // the provider, called with provider_key
//!             Ok::<_, WorkError<()>>(format!("ch_{}", &provider_key[..16]))
//!         })
//!         .await;
//!     let Ok(charge) = charge else {
//!         return (StatusCode::INTERNAL_SERVER_ERROR, String::new());
//!     };
//!     if provider.crash_after_charge.swap(false, Ordering::SeqCst) {
//!         panic!("the process dies after the charge, before answering");
//!     }
//!     (StatusCode::CREATED, charge)
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//! let clock = ManualClock::new();
//! let idem = Idempotency::builder(MemoryStore::with_clock(clock.clone()))
//!     .lease(Duration::from_secs(30))
//!     .build()?;
//! let provider = Provider::default();
//! provider.crash_after_charge.store(true, Ordering::SeqCst);
//! let app = Router::new()
//!     .route("/payments", post(pay))
//!     .layer(IdempotencyLayer::new(idem, |parts| scope::operation("acct_42", parts)))
//!     .with_state(provider.clone());
//! let send = || {
//!     let request = Request::post("/payments").header("idempotency-key", "order-1187").body(Body::empty());
//!     app.clone().oneshot(request.unwrap())
//! };
//!
//! assert_eq!(send().await?.status(), StatusCode::INTERNAL_SERVER_ERROR); // the crash
//! assert_eq!(send().await?.status(), StatusCode::CONFLICT); // the key is held for the lease
//! clock.advance(Duration::from_secs(31));
//! assert_eq!(send().await?.status(), StatusCode::CREATED); // taken over, resumed
//! assert_eq!(provider.charges.load(Ordering::SeqCst), 1); // the step ran once
//! assert_eq!(send().await?.headers()["idempotent-replayed"], "true");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `tests/handlers.rs` runs the same scenario, and the scope and extractor cases.

#![warn(missing_docs)]

mod answer;
#[cfg(feature = "axum")]
pub mod axum;
mod body;
mod disposition;
mod grpc;
mod handlers;
mod held;
mod key_header;
mod layer;
pub mod observe;
mod problem;
mod request_body;
mod request_fingerprint;
mod request_read;
pub mod scope;
mod service;
mod stored;
mod streaming;

#[cfg(feature = "axum")]
pub use axum::Idempotent;
pub use body::Body;
pub use disposition::{Disposition, FinalHead, default_disposition};
pub use grpc::{GRPC_ORIGINAL_STATUS_HEADER, GRPC_PROBLEM_HEADER, grpc_code, grpc_disposition};
pub use handlers::Handlers;
pub use key_header::KeyHeaderError;
pub use layer::{
    DEFAULT_HEADER, DEFAULT_HELD_RETRY_AFTER, DEFAULT_IN_FLIGHT_RETRY_AFTER,
    DEFAULT_MAX_REQUEST_BODY, DEFAULT_MAX_RESPONSE_BODY, DEFAULT_STORED_HEADERS, IdempotencyLayer,
    KeyRequirement,
};
pub use problem::{PROBLEM_TYPE_BASE, Problem, Refusal};
pub use service::{BODY_NOT_STORED_HEADER, IdempotencyService, REPLAYED_HEADER};
pub use stored::{DecodeError, StoredResponse};
