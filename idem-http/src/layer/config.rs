//! The settings as every service of a layer shares them, and what they decide for a
//! request: whether it needs a key, which headers are stored.

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, Method, StatusCode, header};
use idem_core::Idempotency;

use super::KeyRequirement;
use crate::disposition::Disposition;
use crate::handlers::Handlers;
use crate::problem::Problem;
use crate::request_fingerprint::FingerprintRule;
use crate::{Body, Refusal};

type ScopeFn = Arc<dyn Fn(&Parts) -> Result<String, Refusal> + Send + Sync>;
type DispositionFn = Arc<dyn Fn(StatusCode) -> Disposition + Send + Sync>;
type RequirementFn = Arc<dyn Fn(&Parts) -> Option<KeyRequirement> + Send + Sync>;
type ReplayFn = Arc<dyn Fn(&mut http::Response<Body>) + Send + Sync>;
type KeyFn = Arc<dyn Fn(&Parts, &bytes::Bytes) -> Result<Option<String>, Refusal> + Send + Sync>;

/// Everything a service needs, shared by every clone.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) idem: Idempotency,
    pub(crate) handlers: Handlers,
    pub(crate) scope: ScopeFn,
    pub(crate) requirement: Option<RequirementFn>,
    pub(crate) key_with: Option<KeyFn>,
    pub(crate) in_flight_retry_after: Duration,
    pub(crate) held_retry_after: Duration,
    pub(crate) held: Arc<crate::held::HeldKeys>,
    pub(crate) route_label: Option<metrics::SharedString>,
    pub(crate) problem_base: Arc<str>,
    pub(crate) on_replay: Option<ReplayFn>,
    pub(crate) leave_unmatched: bool,
    pub(crate) methods: Vec<(Method, KeyRequirement)>,
    pub(crate) header: HeaderName,
    pub(crate) fingerprint: FingerprintRule,
    pub(crate) max_request_body: usize,
    pub(crate) max_response_body: usize,
    pub(crate) disposition: DispositionFn,
    pub(crate) stored_headers: Vec<HeaderName>,
    pub(crate) store_set_cookie: bool,
    pub(crate) shadow: bool,
}

impl Config {
    /// Whether this request needs the header: the per-request function first, then
    /// axum's fallback (when asked to leave those alone, and `routed`: the layer wraps
    /// one of axum's routes), then the method's setting.
    pub(crate) fn requirement(&self, parts: &Parts, routed: bool) -> KeyRequirement {
        if let Some(requirement) = self.requirement.as_ref().and_then(|f| f(parts)) {
            return requirement;
        }
        let unmatched = routed && unmatched_route(parts);
        if self.leave_unmatched && unmatched {
            return KeyRequirement::Ignored;
        }
        let by_method = self
            .methods
            .iter()
            .find(|(m, _)| *m == parts.method)
            .map_or(KeyRequirement::Ignored, |(_, requirement)| *requirement);
        // A request no route matched goes to the router's fallback as it would without
        // the layer (`POST /typo` is axum's 404, not 400 for a missing key); with a key,
        // it is still protected, and a 404 is released, never stored.
        match (by_method, unmatched) {
            (KeyRequirement::Required, true) => KeyRequirement::Optional,
            (requirement, _) => requirement,
        }
    }

    /// A problem of the layer's own, its type under the configured base.
    pub(crate) fn problem(&self, status: StatusCode, slug: &str, title: &str) -> Problem {
        Problem::typed(&self.problem_base, status, slug, title)
    }

    /// Whether a response header is stored for replays: allowlisted, never hop-by-hop,
    /// `Set-Cookie` only when enabled.
    pub(crate) fn stores_header(&self, name: &HeaderName) -> bool {
        if is_hop_by_hop(name) || name == header::CONTENT_LENGTH {
            return false;
        }
        if name == header::SET_COOKIE {
            return self.store_set_cookie;
        }
        self.stored_headers.contains(name)
    }
}

/// Headers that describe one connection, never stored.
pub(crate) fn is_hop_by_hop(name: &HeaderName) -> bool {
    const HOP_BY_HOP: [&str; 8] = [
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ];
    HOP_BY_HOP.contains(&name.as_str())
}

/// Whether axum routed this request to a fallback: its router saw it (`OriginalUri`)
/// and matched no route (`MatchedPath`). Only a router sets both, so a layer outside any
/// router never takes a request for a fallback. A service under `nest_service` looks the
/// same (axum marks it with a private extension, and strips its prefix only inside the
/// route the layer wraps).
#[cfg(feature = "axum")]
fn unmatched_route(parts: &Parts) -> bool {
    parts
        .extensions
        .get::<axum::extract::OriginalUri>()
        .is_some()
        && parts
            .extensions
            .get::<axum::extract::MatchedPath>()
            .is_none()
}

#[cfg(not(feature = "axum"))]
fn unmatched_route(_parts: &Parts) -> bool {
    false
}

/// Whether the layer wraps one of axum's own routes (`Router::layer` wraps each route and
/// each fallback as a `Route`), rather than a service a user wrapped by hand.
#[cfg(feature = "axum")]
pub(crate) fn is_axum_route<S: 'static>() -> bool {
    std::any::TypeId::of::<S>() == std::any::TypeId::of::<axum::routing::Route>()
}

// Without axum no service is one of its routes; the parameter keeps the call sites alike.
#[cfg(not(feature = "axum"))]
#[allow(clippy::extra_unused_type_parameters)]
pub(crate) fn is_axum_route<S: 'static>() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An allowlist names what a replay carries, never what belongs to one connection,
    /// nor `Content-Length` (the replay's own body sets it).
    #[test]
    fn hop_by_hop_headers_and_the_length_are_never_stored() {
        let layer = crate::IdempotencyLayer::new(
            idem_core::Idempotency::new(idem_core::MemoryStore::new()),
            |parts| Ok(crate::scope::path(parts).to_owned()),
        );
        let never = [
            "connection",
            "keep-alive",
            "proxy-authenticate",
            "proxy-authorization",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "content-length",
        ];
        let layer = never.iter().fold(layer, |layer, name| {
            layer.store_header(HeaderName::from_static(name))
        });
        let charge_id = HeaderName::from_static("x-charge-id");
        let layer = layer.store_header(charge_id.clone());
        let config = &layer.config;
        for name in never {
            assert!(
                !config.stores_header(&HeaderName::from_static(name)),
                "{name}"
            );
        }
        assert!(config.stores_header(&charge_id));
        assert!(!config.stores_header(&header::SET_COOKIE));
        assert!(
            layer
                .store_set_cookie(true)
                .config
                .stores_header(&header::SET_COOKIE)
        );
    }

    /// A matched route (axum's `MatchedPath` beside `OriginalUri`) is the routers tests'
    /// to show: axum gives no way to make a `MatchedPath` outside a router.
    #[test]
    fn only_a_router_marks_a_request_unmatched() {
        let (parts, ()) = http::Request::post("/payments")
            .body(())
            .unwrap()
            .into_parts();
        assert!(!unmatched_route(&parts), "no router saw it");
        #[cfg(feature = "axum")]
        {
            let mut parts = parts;
            parts
                .extensions
                .insert(axum::extract::OriginalUri(parts.uri.clone()));
            assert!(
                unmatched_route(&parts),
                "a router saw it and matched nothing"
            );
        }
    }
}
