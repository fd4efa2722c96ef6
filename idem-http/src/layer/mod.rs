//! The layer and its configuration.

mod config;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, Method, StatusCode, header};
use idem_core::{Fingerprint, Idempotency};
use tower::Layer;

use crate::disposition::{Disposition, default_disposition};
use crate::handlers::Handlers;
use crate::problem::PROBLEM_TYPE_BASE;
use crate::request_fingerprint::FingerprintRule;
use crate::service::IdempotencyService;
use crate::{Body, Refusal};

use config::is_axum_route;
pub(crate) use config::{Config, is_hop_by_hop};

/// The default header: `Idempotency-Key` (header names are case-insensitive; `http` spells
/// them in lower case).
///
/// ```
/// assert_eq!(idem_http::DEFAULT_HEADER, "idempotency-key");
/// ```
pub const DEFAULT_HEADER: HeaderName = HeaderName::from_static("idempotency-key");
/// The default limit on a request body the layer reads to fingerprint it: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 1024 * 1024;
/// The default limit on a response body the layer stores to replay it: 960 KiB, so that a
/// stored response with its headers stays under the driver's default 1 MiB cap. A store
/// that holds less (DynamoDB's items hold 400 000 bytes) lowers it by itself: the layer
/// never buffers more than the record has room for.
pub const DEFAULT_MAX_RESPONSE_BODY: usize = 960 * 1024;
/// The default longest `Retry-After` of a 409 for a key in flight: 1 s. The lease's end is
/// when a crashed first request could be taken over, not when a live one will finish, so
/// the hint is capped: a handler that takes 300 ms is polled again after 1 s, not 60.
pub const DEFAULT_IN_FLIGHT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The default longest `Retry-After` of a 409 for a key this layer holds after answering
/// its first request (a 5xx, a response it could not store): 30 s. Nothing runs under
/// such a key; it is free at its lease's end, which the answer says, capped so that an
/// operator's release (`idem release`) is noticed within half a minute.
pub const DEFAULT_HELD_RETRY_AFTER: Duration = Duration::from_secs(30);

/// Whether requests of a method need the header.
///
/// ```
/// use http::Method;
/// use idem_core::{Idempotency, MemoryStore};
/// use idem_http::{IdempotencyLayer, KeyRequirement};
///
/// let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| Ok(idem_http::scope::path(parts).to_owned()))
///     .method(Method::PUT, KeyRequirement::Optional) // protected when the client sends a key
///     .method(Method::PATCH, KeyRequirement::Ignored); // never protected
/// # let _ = layer;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyRequirement {
    /// A request without the header is refused with 400.
    Required,
    /// A request with the header is protected; one without passes through.
    Optional,
    /// Requests pass through untouched, header or not.
    Ignored,
}

/// The headers stored by default: what a client needs to read the response again.
///
/// | stored and replayed | why |
/// |---|---|
/// | `Content-Type`, `Content-Encoding`, `Content-Language`, `Content-Disposition` | how to read the stored body |
/// | `Location`, `Content-Location`, `Link` | where the result is: a created resource's address |
/// | `ETag`, `Last-Modified` | the validators of the result the first request made |
/// | `Cache-Control`, `Expires`, `Vary` | what caches may do with that result |
///
/// Not stored, because each try has its own: `X-Request-Id`, `traceparent` and other
/// tracing headers (a replay carrying the first try's id would tie the retry's logs to
/// another request; put a request-id layer outside this one and the replay gets the
/// retry's id), `Date`, `Server`, rate-limit counters, and `Set-Cookie` (a session; see
/// [`IdempotencyLayer::store_set_cookie`]). Hop-by-hop headers and `Content-Length` are
/// never stored. Add or drop one for a route with [`IdempotencyLayer::store_header`] and
/// [`IdempotencyLayer::skip_header`] on that route's layer (`route_layer`).
pub const DEFAULT_STORED_HEADERS: [HeaderName; 12] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_LANGUAGE,
    header::LOCATION,
    header::ETAG,
    header::LAST_MODIFIED,
    header::LINK,
    header::CACHE_CONTROL,
    header::EXPIRES,
    header::VARY,
    header::CONTENT_DISPOSITION,
    header::CONTENT_LOCATION,
];

/// A tower [`Layer`] that makes requests carrying an `Idempotency-Key` header safe to
/// retry: the handler runs once per key, and every retry gets the first response back.
///
/// Defaults, each changed by the method of the same name:
///
/// | setting | default |
/// |---|---|
/// | [`scope`](IdempotencyLayer::new) | required: the function you pass to `new` |
/// | [`methods`](IdempotencyLayer::method) | POST and PATCH require the header; other methods pass through |
/// | [`header`](IdempotencyLayer::header) | `Idempotency-Key` |
/// | [`fingerprint`](IdempotencyLayer::ignore_json_fields) | method, path, query pairs in name order, and body: JSON canonicalised (numbers by their exact digits), form pairs in name order |
/// | [`max_request_body`](IdempotencyLayer::max_request_body) | 1 MiB, then 413 before anything is claimed |
/// | [`requirement_with`](IdempotencyLayer::requirement_with) | none: the methods decide |
/// | [`max_response_body`](IdempotencyLayer::max_response_body) | 960 KiB or the store's room, then streamed once and stored without the body |
/// | [`disposition`](IdempotencyLayer::disposition) | [`default_disposition`]: 5xx and 408 held, other 4xx but 402 released, the rest stored |
/// | [`in_flight_retry_after`](IdempotencyLayer::in_flight_retry_after) | 1 s at most |
/// | [`held_retry_after`](IdempotencyLayer::held_retry_after) | 30 s at most |
/// | [`route_label`](IdempotencyLayer::route_label) | none |
/// | [`problem_type_base`](IdempotencyLayer::problem_type_base) | [`PROBLEM_TYPE_BASE`] |
/// | [`on_replay`](IdempotencyLayer::on_replay) | none |
/// | [`leave_unmatched_routes`](IdempotencyLayer::leave_unmatched_routes) | off: a request no route matched goes to axum's fallback without a key, and is protected with one |
/// | [`stored_headers`](IdempotencyLayer::stored_headers) | [`DEFAULT_STORED_HEADERS`]; never hop-by-hop; `Set-Cookie` only when [enabled](IdempotencyLayer::store_set_cookie) |
/// | [`shadow`](IdempotencyLayer::shadow) | off |
///
/// Lease, retention, heartbeats and what a duplicate does while the first request runs
/// ([`InFlightPolicy`](idem_core::InFlightPolicy)) are the [`Idempotency`]'s settings.
///
/// ```
/// use axum::{Router, routing::post};
/// use idem_core::{Idempotency, MemoryStore};
/// use idem_http::{IdempotencyLayer, scope};
///
/// /// What the authentication layer (placed outside this one) put in the extensions.
/// #[derive(Clone)]
/// struct AccountId(String);
///
/// let idem = Idempotency::new(MemoryStore::new());
/// let app: Router = Router::new()
///     .route("/payments", post(|| async { "charged" }))
///     // One tenant's key never replays another's response: scope by the verified
///     // principal; a request without one is refused with 401, never shared.
///     .layer(IdempotencyLayer::new(idem, scope::by_principal(|account: &AccountId| account.0.clone())));
/// # let _ = app;
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer {
    // Shared: axum may call `layer` once per request (a layered handler with state), so
    // each service takes a reference, not a copy.
    config: Arc<Config>,
}

impl IdempotencyLayer {
    /// A layer over `idem` (any store), with `scope` naming the scope of each request's
    /// key: the authenticated principal, plus the method and route, say, so that one
    /// tenant's key can never replay another's response. The scope function may refuse a
    /// request with a response of its own ([`Refusal`], made from a
    /// [`Problem`](crate::Problem) or any response).
    pub fn new<F>(idem: impl Into<Idempotency>, scope: F) -> Self
    where
        F: Fn(&Parts) -> Result<String, Refusal> + Send + Sync + 'static,
    {
        Self {
            config: Arc::new(Config {
                idem: idem.into(),
                handlers: Handlers::default(),
                scope: Arc::new(scope),
                requirement: None,
                key_with: None,
                in_flight_retry_after: DEFAULT_IN_FLIGHT_RETRY_AFTER,
                held_retry_after: DEFAULT_HELD_RETRY_AFTER,
                held: Arc::default(),
                route_label: None,
                problem_base: Arc::from(PROBLEM_TYPE_BASE),
                on_replay: None,
                leave_unmatched: false,
                methods: vec![
                    (Method::POST, KeyRequirement::Required),
                    (Method::PATCH, KeyRequirement::Required),
                ],
                header: DEFAULT_HEADER,
                fingerprint: FingerprintRule::default(),
                max_request_body: DEFAULT_MAX_REQUEST_BODY,
                max_response_body: DEFAULT_MAX_RESPONSE_BODY,
                disposition: Arc::new(default_disposition),
                stored_headers: DEFAULT_STORED_HEADERS.to_vec(),
                store_set_cookie: false,
                shadow: false,
            }),
        }
    }

    /// The settings to change: this layer's own copy once a clone shares them.
    fn config_mut(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// Whether requests of `method` need the header (see [`KeyRequirement`]).
    #[must_use]
    pub fn method(mut self, method: Method, requirement: KeyRequirement) -> Self {
        self.config_mut().methods.retain(|(m, _)| *m != method);
        self.config_mut().methods.push((method, requirement));
        self
    }

    /// Whether a request needs the header, decided per request (by route, say) before
    /// the [`method`](IdempotencyLayer::method) settings; `None` leaves it to them. One
    /// layer serves routes that require a key, routes where it is optional, and routes
    /// exempt from it.
    ///
    /// ```
    /// use idem_core::{Idempotency, MemoryStore};
    /// use idem_http::{IdempotencyLayer, KeyRequirement};
    ///
    /// let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| Ok(idem_http::scope::path(parts).to_owned()))
    ///     .requirement_with(|parts| match idem_http::scope::path(parts) {
    ///         "/webhooks/ping" => Some(KeyRequirement::Ignored),
    ///         path if path.starts_with("/search") => Some(KeyRequirement::Optional),
    ///         _ => None, // POST and PATCH require it, as by default
    ///     });
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn requirement_with<F>(mut self, requirement: F) -> Self
    where
        F: Fn(&Parts) -> Option<KeyRequirement> + Send + Sync + 'static,
    {
        self.config_mut().requirement = Some(Arc::new(requirement));
        self
    }

    /// The longest `Retry-After` a 409 for a key in flight carries (default
    /// [`DEFAULT_IN_FLIGHT_RETRY_AFTER`], 1 s): the answer says the lease's end when it
    /// is sooner. At least one second: the header counts whole seconds.
    #[must_use]
    pub fn in_flight_retry_after(mut self, longest: Duration) -> Self {
        self.config_mut().in_flight_retry_after = longest;
        self
    }

    /// The longest `Retry-After` a 409 carries for a key this layer holds (default
    /// [`DEFAULT_HELD_RETRY_AFTER`], 30 s): its first request was answered with a
    /// response the layer neither stored nor released (a 5xx under
    /// [`default_disposition`], a response it could not store), so nothing runs under
    /// the key, and a retry runs only once the lease ends. The answer says that end,
    /// capped by this, where a key in flight says at most
    /// [`in_flight_retry_after`](Self::in_flight_retry_after).
    ///
    /// Only the replica that held the key knows it (the store answers "in flight" for
    /// both): a retry that reaches another replica is answered as for work in flight.
    /// At most 10 000 held keys are remembered at once.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::{Idempotency, MemoryStore};
    /// use idem_http::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| Ok(idem_http::scope::path(parts).to_owned()))
    ///     .held_retry_after(Duration::from_secs(10));
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn held_retry_after(mut self, longest: Duration) -> Self {
        self.config_mut().held_retry_after = longest;
        self
    }

    /// Adds a `route` label to this layer's metrics (`idem_http_requests_total`,
    /// `idem_http_shadow_total`), so that each route's answers can be told apart. A name
    /// of your choosing, from a small set: a label's every value is a time series of its
    /// own, so never a path with ids in it. Place a layer per route (axum's
    /// `route_layer`) to label each; without a label, the metrics have none.
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use idem_core::{Idempotency, MemoryStore};
    /// use idem_http::IdempotencyLayer;
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let layer = IdempotencyLayer::new(idem, |parts| Ok(idem_http::scope::path(parts).to_owned()));
    /// let app: Router = Router::new()
    ///     .route("/payments", post(|| async { "charged" }))
    ///     .route_layer(layer.route_label("payments"));
    /// # let _ = app;
    /// ```
    #[must_use]
    pub fn route_label(mut self, name: impl Into<String>) -> Self {
        // Shared, so that labelling each answer costs a reference count.
        let name: Arc<str> = Arc::from(name.into());
        self.config_mut().route_label = Some(metrics::SharedString::from(name));
        self
    }

    /// The base of the layer's problem types (default [`PROBLEM_TYPE_BASE`], tag URIs):
    /// a link to your own documentation, say `https://docs.example.com/problems/`, to
    /// which each slug (`in-flight`, `key-reused`, ...) is appended.
    #[must_use]
    pub fn problem_type_base(mut self, base: impl Into<String>) -> Self {
        self.config_mut().problem_base = Arc::from(base.into());
        self
    }

    /// Adjusts every replayed response before it is sent (a header of your own, say);
    /// the stored record is unchanged.
    ///
    /// ```
    /// use http::HeaderValue;
    /// use idem_core::{Idempotency, MemoryStore};
    /// use idem_http::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| Ok(idem_http::scope::path(parts).to_owned()))
    ///     .on_replay(|response| {
    ///         response.headers_mut().insert("cache-status", HeaderValue::from_static("idem; hit"));
    ///     });
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn on_replay<F>(mut self, adjust: F) -> Self
    where
        F: Fn(&mut http::Response<Body>) + Send + Sync + 'static,
    {
        self.config_mut().on_replay = Some(Arc::new(adjust));
        self
    }

    /// Passes every request that axum routed to a fallback (no route matched) through
    /// untouched, with the `axum` feature, keyed or not (default off).
    ///
    /// Without it, a request to a path no route matches already answers as it would
    /// without the layer: with no key, the fallback answers it (`POST /typo` is axum's
    /// 404, not 400 for a missing key); with a key, it is protected like any other, and
    /// the fallback's 404 is released by the default status policy, never stored. This
    /// setting also leaves keyed requests to the fallback unprotected: use it only when
    /// the fallback does no work a retry could repeat.
    ///
    /// Prefer `Router::route_layer`, which wraps the routes and never the fallbacks, and
    /// so needs no guess. With `Router::layer` the layer tells a fallback by what axum
    /// leaves in the request: its router saw it (`OriginalUri`) and matched no route (no
    /// `MatchedPath`). A service under `nest_service` looks the same to it: behind
    /// `Router::layer`, such a service gets keyless requests as a fallback would (keyed
    /// ones are protected); to require keys there, wrap the nested service itself
    /// (`nest_service("/svc", layer.layer(svc))`). The layer tells only where it wraps
    /// axum's `Route` itself: under a `ServiceBuilder` with other layers beneath it,
    /// every request is treated as a route's.
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use idem_core::{Idempotency, MemoryStore};
    /// use idem_http::IdempotencyLayer;
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let scope = |parts: &http::request::Parts| Ok(format!("{} {}", parts.method, idem_http::scope::path(parts)));
    /// // The better way: the layer wraps the routes only.
    /// let app: Router = Router::new()
    ///     .route("/payments", post(|| async { "charged" }))
    ///     .route_layer(IdempotencyLayer::new(idem, scope));
    /// # let _ = app;
    /// ```
    #[must_use]
    pub fn leave_unmatched_routes(mut self, leave: bool) -> Self {
        self.config_mut().leave_unmatched = leave;
        self
    }

    /// The handlers this layer runs in tasks of their own (their client went away, or
    /// they stream): wait for them in a graceful shutdown, after the server stopped
    /// taking requests (see [`Handlers`]).
    pub fn handlers(&self) -> Handlers {
        self.config.handlers.clone()
    }

    /// Takes each request's key from the request itself instead of a header: an event
    /// id in a JSON body, say. The body is read (within
    /// [`max_request_body`](IdempotencyLayer::max_request_body)) before the function
    /// runs; `Ok(None)` means the request has no key (400 where the method requires
    /// one, passed through where it is optional); `Err` answers with your refusal.
    ///
    /// ```
    /// use idem_core::{Idempotency, MemoryStore};
    /// use idem_http::IdempotencyLayer;
    ///
    /// // A webhook whose sender puts the event id in the body: each event runs once.
    /// let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| Ok(idem_http::scope::path(parts).to_owned()))
    ///     .key_with(|_parts, body| {
    ///         let event: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    ///         Ok(event["id"].as_str().map(str::to_owned))
    ///     });
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn key_with<F>(mut self, key: F) -> Self
    where
        F: Fn(&Parts, &bytes::Bytes) -> Result<Option<String>, Refusal> + Send + Sync + 'static,
    {
        self.config_mut().key_with = Some(Arc::new(key));
        self
    }

    /// The header to read instead of `Idempotency-Key` (`webhook-id` for Standard
    /// Webhooks). Its value is the key as it is, surrounding spaces trimmed: ids of other
    /// headers are opaque strings (`=`, `@`, `,`, `;`, spaces and quotes are all part of
    /// the key), where `Idempotency-Key` is a Structured Field string or a bare token.
    #[must_use]
    pub fn header(mut self, name: HeaderName) -> Self {
        self.config_mut().header = name;
        self
    }

    /// Fields left out of the fingerprint, so that a retry whose timestamp or trace id
    /// changed is still the same request: a top-level member of a JSON body or a field of
    /// a form body by name (`"sent_at"`), or any member of a JSON body by JSON Pointer
    /// (`"/meta/trace_id"`).
    #[must_use]
    pub fn ignore_json_fields<I, T>(mut self, fields: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        let ignored: Vec<String> = fields.into_iter().map(Into::into).collect();
        self.config_mut().fingerprint = FingerprintRule::Default {
            ignored: ignored.into(),
        };
        self
    }

    /// Fingerprints requests with a function of your own (of the request head and the
    /// whole body), replacing the default.
    #[must_use]
    pub fn fingerprint_with<F>(mut self, fingerprint: F) -> Self
    where
        F: Fn(&Parts, &bytes::Bytes) -> Fingerprint + Send + Sync + 'static,
    {
        self.config_mut().fingerprint = FingerprintRule::Custom(Arc::new(fingerprint));
        self
    }

    /// The largest request body read (default 1 MiB); a larger one is answered 413 before
    /// anything is claimed.
    #[must_use]
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.config_mut().max_request_body = bytes;
        self
    }

    /// The largest response body stored for replays (default 960 KiB), lowered by itself
    /// to what the store's record has room for (the driver's `max_response_bytes`, and
    /// a store's own limit such as DynamoDB's 400 000-byte item).
    ///
    /// - The layer keeps no more than this for the record: a response streams to the
    ///   client whose request made it as the handler writes it, whole, however large.
    /// - When the body passes the limit, the key is finished at once with the status and
    ///   stored headers only: a retry gets that status, those headers, an empty body,
    ///   [`BODY_NOT_STORED_HEADER`](crate::BODY_NOT_STORED_HEADER) and
    ///   `Idempotent-Replayed: true`. The work never runs twice, and an endless stream
    ///   (server-sent events) does not hold the key while it lasts; one under the limit
    ///   whose client went away is read on for at most a lease, then its key is
    ///   finished without the body.
    ///   A gRPC answer waits for its trailers' status (see [`grpc_disposition`](crate::grpc_disposition)).
    #[must_use]
    pub fn max_response_body(mut self, bytes: usize) -> Self {
        self.config_mut().max_response_body = bytes;
        self
    }

    /// Which responses are final, by status code (default [`default_disposition`]). A
    /// handler overrides it for one response with a [`Disposition`] in the response's
    /// extensions.
    #[must_use]
    pub fn disposition<F>(mut self, policy: F) -> Self
    where
        F: Fn(StatusCode) -> Disposition + Send + Sync + 'static,
    {
        self.config_mut().disposition = Arc::new(policy);
        self
    }

    /// The response headers stored and replayed (default [`DEFAULT_STORED_HEADERS`]).
    /// Hop-by-hop headers and `Content-Length` are never stored; `Set-Cookie` only with
    /// [`store_set_cookie`](IdempotencyLayer::store_set_cookie).
    #[must_use]
    pub fn stored_headers<I: IntoIterator<Item = HeaderName>>(mut self, headers: I) -> Self {
        self.config_mut().stored_headers = headers.into_iter().collect();
        self
    }

    /// Stores and replays one more response header besides the current set (a charge id
    /// of your own, say).
    ///
    /// ```
    /// use http::HeaderName;
    /// use idem_core::{Idempotency, MemoryStore};
    /// use idem_http::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| Ok(idem_http::scope::path(parts).to_owned()))
    ///     .store_header(HeaderName::from_static("x-charge-id"))
    ///     .skip_header(http::header::CACHE_CONTROL);
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn store_header(mut self, name: HeaderName) -> Self {
        let stored = &mut self.config_mut().stored_headers;
        if !stored.contains(&name) {
            stored.push(name);
        }
        self
    }

    /// Stops storing and replaying one response header of the current set.
    ///
    /// ```
    /// use idem_core::{Idempotency, MemoryStore};
    /// use idem_http::IdempotencyLayer;
    ///
    /// // This route's cache headers belong to each answer, not to the first one.
    /// let layer = IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| Ok(idem_http::scope::path(parts).to_owned()))
    ///     .skip_header(http::header::CACHE_CONTROL)
    ///     .skip_header(http::header::EXPIRES);
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn skip_header(mut self, name: HeaderName) -> Self {
        self.config_mut()
            .stored_headers
            .retain(|stored| *stored != name);
        self
    }

    /// Stores and replays `Set-Cookie` too (default off: a replay would hand the first
    /// request's session to whoever retries).
    #[must_use]
    pub fn store_set_cookie(mut self, store: bool) -> Self {
        self.config_mut().store_set_cookie = store;
        self
    }

    /// Shadow mode, for careful rollouts: keys are claimed and responses recorded as
    /// usual, but every request reaches the handler once and the answer is always the
    /// handler's own. What the layer would have answered instead (a replay, 400, 401 from
    /// the scope, 409, 413, 422, 429, 503) is counted in `idem_http_shadow_total{would}`
    /// and traced at info level. A request the layer would have refused or replayed
    /// reaches the handler with a detached context
    /// ([`Idempotency::detached_context`]): its steps run, nothing is recorded.
    ///
    /// Switch it on per route by giving the routes under rollout a shadow layer and the
    /// others a normal one; watch the counters; then switch it off by dropping the
    /// `.shadow(true)`. The records made in shadow mode are real, so retries replay from
    /// the first request on.
    ///
    /// Shadow mode still reads a keyed request whole before it passes it on: a gRPC call
    /// that streams its request reaches the handler only once the layer took it for a
    /// stream (a second message, or 5 s without the request's end).
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use idem_core::{Idempotency, MemoryStore};
    /// use idem_http::IdempotencyLayer;
    ///
    /// let idem = Idempotency::new(MemoryStore::new()).into_dyn();
    /// let scope = |parts: &http::request::Parts| Ok(format!("{} {}", parts.method, idem_http::scope::path(parts)));
    /// let app: Router = Router::new()
    ///     // Observing: every request still reaches the handler.
    ///     .route("/refunds", post(|| async { "refunded" }).layer(IdempotencyLayer::new(idem.clone(), scope).shadow(true)))
    ///     // Protecting.
    ///     .route("/payments", post(|| async { "charged" }).layer(IdempotencyLayer::new(idem, scope)));
    /// # let _ = app;
    /// ```
    #[must_use]
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.config_mut().shadow = shadow;
        self
    }
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("idem", &self.config.idem)
            .field("methods", &self.config.methods)
            .field("header", &self.config.header)
            .field("fingerprint", &self.config.fingerprint)
            .field("max_request_body", &self.config.max_request_body)
            .field("max_response_body", &self.config.max_response_body)
            .field("stored_headers", &self.config.stored_headers)
            .field("store_set_cookie", &self.config.store_set_cookie)
            .field("shadow", &self.config.shadow)
            .field("in_flight_retry_after", &self.config.in_flight_retry_after)
            .field("held_retry_after", &self.config.held_retry_after)
            .field("route_label", &self.config.route_label.as_deref())
            .field("problem_type_base", &self.config.problem_base)
            .field("leave_unmatched_routes", &self.config.leave_unmatched)
            .finish_non_exhaustive()
    }
}

impl<S: 'static> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        let routed = is_axum_route::<S>();
        IdempotencyService::new(inner, Arc::clone(&self.config), routed)
    }
}

#[cfg(test)]
mod tests {
    use idem_core::MemoryStore;

    use super::*;

    fn layer() -> IdempotencyLayer {
        IdempotencyLayer::new(Idempotency::new(MemoryStore::new()), |parts| {
            Ok(crate::scope::path(parts).to_owned())
        })
    }

    fn requirement(layer: &IdempotencyLayer, method: Method) -> KeyRequirement {
        let (parts, ()) = http::Request::builder()
            .method(method)
            .uri("/payments")
            .body(())
            .unwrap()
            .into_parts();
        layer.config.requirement(&parts, false)
    }

    #[test]
    fn a_methods_setting_replaces_only_its_own() {
        let layer = layer()
            .method(Method::PUT, KeyRequirement::Optional)
            .method(Method::POST, KeyRequirement::Optional);
        assert_eq!(requirement(&layer, Method::POST), KeyRequirement::Optional);
        assert_eq!(requirement(&layer, Method::PUT), KeyRequirement::Optional);
        assert_eq!(requirement(&layer, Method::PATCH), KeyRequirement::Required);
        assert_eq!(requirement(&layer, Method::DELETE), KeyRequirement::Ignored);
        let layer = layer.method(Method::POST, KeyRequirement::Ignored);
        assert_eq!(requirement(&layer, Method::POST), KeyRequirement::Ignored);
        assert_eq!(requirement(&layer, Method::PUT), KeyRequirement::Optional);
    }

    #[test]
    fn stored_headers_are_added_and_skipped_alone() {
        let charge_id = HeaderName::from_static("x-charge-id");
        let layer = layer().store_header(charge_id.clone());
        assert!(layer.config.stores_header(&charge_id));
        assert!(layer.config.stores_header(&header::CONTENT_TYPE));
        let layer = layer.skip_header(header::CONTENT_TYPE);
        assert!(!layer.config.stores_header(&header::CONTENT_TYPE));
        assert!(layer.config.stores_header(&charge_id), "the others stay");
        assert!(layer.config.stores_header(&header::CONTENT_ENCODING));
    }

    #[test]
    fn the_layer_shows_its_settings() {
        let shown = format!("{:?}", layer().max_request_body(4096));
        assert!(shown.starts_with("IdempotencyLayer {"), "{shown}");
        assert!(shown.contains("max_request_body: 4096"), "{shown}");
        let shown = format!("{:?}", layer().ignore_json_fields(["/meta/trace_id"]));
        assert!(
            shown.contains("ignored_json_fields: [\"/meta/trace_id\"]"),
            "{shown}"
        );
    }

    #[test]
    fn the_default_request_limit_is_one_mebibyte() {
        assert_eq!(layer().config.max_request_body, 1 << 20);
    }
}
