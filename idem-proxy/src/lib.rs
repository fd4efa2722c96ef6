//! # idem-proxy
//!
//! A reverse proxy that puts the `Idempotency-Key` header in front of any HTTP service,
//! whatever its language, without a line of its code: each logical request reaches the
//! service once, and every retry gets the first response back. It is
//! [idem-http](idem_http)'s layer around a forwarding client, configured by a file, on
//! any idem store; the `idem` command runs it (`idem proxy --config idem.toml`).
//!
//! ```toml
//! upstream = "http://127.0.0.1:8000"        # the service behind the proxy
//! store = "sqlite:///var/lib/idem/proxy.db" # or --store / IDEM_STORE; shared by replicas
//! listen = "127.0.0.1:8080"                 # where clients connect
//!
//! [defaults]
//! scope = { header = "x-account-id" }       # whose key it is (set by your gateway)
//!
//! [[routes]]
//! methods = ["POST"]
//! path = "/payments"
//! ignore_fields = ["sent_at"]               # not part of "the same request"
//!
//! [[routes]]
//! methods = ["POST"]
//! path = "/orders/{id}/refund"
//! lease = "2m"                              # a slow upstream call
//! status = { release = [409] }              # the upstream's 409 means "nothing done"
//! ```
//!
//! ## What it answers
//!
//! As idem-http's layer does (its crate docs have the whole table): the first request
//! with a key reaches the upstream and its response is stored; a retry gets it back with
//! `Idempotent-Replayed: true`; the same key with another body is 422; a retry while the
//! first is in flight is 409 with `Retry-After`. And for the upstream:
//!
//! - **It could not be reached**: 502, and the key is released (nothing was sent).
//! - **It did not answer in `upstream_timeout`, or broke the connection**: 504 or 502,
//!   and the key is held until its lease ends, when a retry takes over and the upstream
//!   is asked again under the same key. The effect may have happened: a lease at least
//!   `upstream_timeout` (the file refuses less) and longer than the upstream's slowest
//!   answer keeps a retry from running it while the first may still be running; an
//!   upstream that dedupes by the `Idempotency-Scoped-Key` it is sent (below) is safe
//!   either way.
//! - **It sent its head, then broke off its body** (or, on a protected route, let it
//!   stall for `upstream_timeout`): the head decides the key. A stored status finishes
//!   it without the body, and a retry gets that status with
//!   `idempotent-body-not-stored: true`: the upstream is never asked again.
//! - **The client went away**: the upstream's answer is still read and stored, and the
//!   retry replays it.
//!
//! A protected request reaches the upstream with `Idempotency-Scoped-Key: idem-<hex>`
//! beside the key the client sent: a hash of the key with its scope, the same for every
//! retry and takeover of one operation, and never the same for two callers. Clients choose
//! their keys and two callers' `order-1` collide: an upstream dedupes by the scoped key.
//!
//! Requests are streamed both ways; a protected request's body is read whole to
//! fingerprint it (within `max_request_body`), and an answer of at most 1 MiB (by its
//! `Content-Length`) is read whole before it is passed on, so that it is stored before
//! the client sees it. Requests that match no route pass through
//! unprotected (or get 404 with `unmatched = "reject"`).
//!
//! ## Scopes
//!
//! Every protected route says whose key it is, and the caller's name is hashed before it
//! reaches the store:
//!
//! - `scope = { header = "x-account-id" }`: a header set by an authenticating gateway in
//!   front of the proxy, or an API key.
//! - `scope = { jwt_claim = "sub", secret_env = "JWT_SECRET" }` (HS256), or
//!   `{ jwt_claim = "sub", algorithm = "RS256", public_key_pem = "/etc/idem/jwt.pem" }`:
//!   the claim of a bearer token the proxy verified (signature, algorithm, `exp` and
//!   `nbf` with 60 s of leeway, `aud` and `iss` where the file names them), or
//!   `{ jwt_claim = "sub", jwks_url = "https://id.example/.well-known/jwks.json", issuer = "https://id.example/" }`: the
//!   provider's keys by `kid`, refreshed in the background. The raw
//!   token never scopes a key: a refreshed token would put a retry in a new scope.
//!
//! A request without one is refused with 401 before anything is claimed.
//!
//! ## Operating it
//!
//! - `admin_listen` (default `127.0.0.1:9464`) serves `/metrics` (Prometheus text: the
//!   proxy's, the layer's and the driver's metrics, see [`observe`]), `/healthz` (the
//!   process is up) and `/readyz` (serving; with `ready_checks_store`, the store answers
//!   a read within 800 ms too).
//! - Clients are held to [`ClientLimits`]: a head within `client_header_timeout` (idle
//!   keep-alive connections too), no pause in a body over `client_body_timeout` (408),
//!   at most `max_connections` connections and `max_concurrent_requests` requests (503
//!   with `Retry-After`, before any key is claimed).
//! - An access log line per request (`info`, target `idem_proxy::access`), with no key,
//!   header, token, query or body. A route's `key_budget` bounds the new keys one caller
//!   creates there.
//! - SIGTERM or Ctrl-C (a second one stops at once): `/readyz` turns 503, in-flight requests run to their end and store
//!   their answers, within `shutdown_grace`. SIGHUP reloads the routes and the upstream
//!   without dropping a connection ([`Reloader`]).
//! - Several replicas share one store (PostgreSQL, Redis, DynamoDB): a retry that lands
//!   on another replica is answered the same.
//! - A mistake in the file is reported with its line and what to write instead, before
//!   anything listens.
//!
//! ## Where things live
//!
//! `config/`: the file (`mod.rs`: [`Config`] and its errors; `client_limits.rs`,
//! `route.rs`: the checked settings' types; `file.rs`: the file as written; `values.rs`:
//! single values; `check.rs`, `check_route.rs`, `check_scope.rs`: the file, a route, a
//! scope checked); `clients.rs`: accepting clients within their limits;
//! `routes.rs`: matching and each route's layer; `scope.rs`: scopes; `jwks.rs`: a
//! provider's token keys; `budget.rs`: new keys per caller; `upstream.rs`: forwarding;
//! `idle.rs`: bodies that may not stall; `overrides.rs`: method and path overrides;
//! `reload.rs`: a new configuration while serving; `server/`: the server (`mod.rs`:
//! binding, listeners and shutdown; `requests.rs`: each proxied request; `access_log.rs`;
//! `admin.rs`: `/readyz` and `/metrics`; `purge.rs`: the purge loop; `bind_checks.rs`:
//! what binding refuses); [`observe`]: the metrics.

#![warn(missing_docs)]

mod budget;
mod clients;
mod config;
mod idle;
mod jwks;
pub mod observe;
mod overrides;
mod reload;
mod routes;
mod scope;
mod server;
mod upstream;

pub use config::{
    ClientLimits, Config, ConfigError, DEFAULT_SHUTDOWN_DELAY_ON_KUBERNETES,
    DEFAULT_SHUTDOWN_GRACE, JwtKey, KeyRule, Route, ScopeSource, StatusPolicy, Unmatched,
};
pub use jwks::JwksError;
pub use reload::{Reloaded, Reloader};
pub use routes::RouteError;
pub use server::{Proxy, ProxyError};
pub use upstream::BadUpstream;
