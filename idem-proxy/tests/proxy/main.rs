//! The proxy in front of a real HTTP upstream on 127.0.0.1, in process: what clients get
//! and how many times the upstream ran.
//!
//! - `../common`: the counting upstream, the proxy in process, the clients.
//! - `retries.rs`: what a retry gets; refusals, status policies, scoped keys, key budgets.
//! - `upstream.rs`: an upstream unreachable, slow, on HTTP/2, behind a path prefix, with
//!   big, doubly framed or broken answers.
//! - `routing.rs`: unmatched requests and the spellings of a route's path.
//! - `scopes.rs`: whose key it is: token claims, scope headers, hosts.
//! - `forwarding.rs`: the headers replayed and forwarded; method and path overrides.
//! - `lifecycle.rs`: shutdown, health and readiness.

#[path = "../common/mod.rs"]
mod common;
mod forwarding;
mod lifecycle;
mod retries;
mod routing;
mod scopes;
mod upstream;
