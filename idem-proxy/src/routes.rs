//! Which route a request takes, and the protection each route puts around the upstream.
//!
//! Patterns are matched by `matchit` (axum's router) against the request's path made
//! plain ([`normalize`]: no doubled slashes, no dot segments, unreserved characters
//! unescaped), which is also the path forwarded, so that `//payments` or `/pay%6Dents`
//! cannot slip past the route of `/payments`; a pattern also matches with a trailing
//! slash, unless another route claims that spelling, and is then the same operation (the
//! scope and fingerprint drop that slash; the upstream still gets it). Case, `;` parameters and `%2F` are
//! left as they are: an upstream that routes `/Payments` or `/payments;x` to the same
//! handler needs `unmatched = "reject"` and a route for each path it serves. A route that names the request's method wins over one that names no methods;
//! among routes of the same methods the most specific pattern wins (`/orders/export`
//! before `/orders/{id}`). Two routes with the same pattern and a method in common are
//! refused when the file is read.

use std::collections::HashMap;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use idem_core::{Idempotency, Store};
use idem_http::{
    Body, Disposition, Handlers, IdempotencyLayer, IdempotencyService, KeyRequirement,
};
use tower::{Layer, ServiceExt};

use crate::config::{Config, ConfigError, KeyRule, Route};
use crate::jwks::Jwks;
use crate::overrides;
use crate::scope::{Scope, ScopeError};
use crate::upstream::Upstream;

/// One route, ready to serve.
enum Protection {
    /// Behind idem-http's layer.
    Protected(IdempotencyService<Upstream>),
    /// Straight to the upstream (`key = "exempt"`), within the route's timeout.
    Exempt(Upstream),
}

struct Compiled {
    name: String,
    protection: Protection,
    /// Whether the route's own pattern ends with `/` (or catches all): one that does not
    /// is also matched with a trailing `/`, which is then the same operation.
    slashed: bool,
    /// The route's `max_request_body`: a form body is read up to it for overrides.
    max_request_body: usize,
    /// The route's key header: only a keyed request's form is read for overrides.
    key_header: http::HeaderName,
}

/// Every route, and the matchers that pick one.
pub(crate) struct Routes {
    by_method: HashMap<Method, matchit::Router<usize>>,
    any_method: matchit::Router<usize>,
    routes: Vec<Compiled>,
    /// The handlers that outlived their requests, per protected route: a shutdown waits
    /// for them.
    pub(crate) handlers: Vec<Handlers>,
    /// The JWKS of the routes that read one, by route name: fetched before serving.
    pub(crate) jwks: Vec<(String, Jwks)>,
    /// Whether override headers reach the upstream (`trust_forwarded_headers`); else the
    /// proxy removes them and they need no refusal.
    overrides_reach_upstream: bool,
}

/// Why a route could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// Two routes cannot both be matched, or a pattern is refused by the matcher.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The driver refused a route's settings.
    #[error("route `{route}`: {source}")]
    Settings {
        /// The route's name.
        route: String,
        /// What the driver said.
        #[source]
        source: idem_core::ConfigError,
    },
    /// A protected route names no scope (the file's check refuses that; a configuration
    /// changed in code may not).
    #[error("route `{0}` is protected but has no scope: say whose key it is")]
    NoScope(String),
    /// A route's verification key could not be read.
    #[error("route `{route}`: the token verification key: {source}")]
    JwtKey {
        /// The route's name.
        route: String,
        /// Why.
        #[source]
        source: jsonwebtoken::errors::Error,
    },
    /// A route's JWKS could not be fetched before serving.
    #[error("route `{route}`: {source}")]
    Jwks {
        /// The route's name.
        route: String,
        /// Why.
        #[source]
        source: Box<crate::JwksError>,
    },
}

impl Routes {
    pub(crate) fn new(
        config: &Config,
        config_path: &std::path::Path,
        store: &Arc<dyn Store>,
        upstream: &Upstream,
    ) -> Result<Self, RouteError> {
        let mut routes = Self {
            by_method: HashMap::new(),
            any_method: matchit::Router::new(),
            routes: Vec::with_capacity(config.routes.len()),
            handlers: Vec::new(),
            jwks: Vec::new(),
            overrides_reach_upstream: config.trust_forwarded_headers,
        };
        let mut sets = HashMap::new();
        for (index, route) in config.routes.iter().enumerate() {
            let conflict = |err: matchit::InsertError| ConfigError::Invalid {
                path: config_path.to_owned(),
                line: route.line,
                column: 1,
                message: format!(
                    "route `{}` cannot be told apart from an earlier one: {err}; give them different patterns or methods",
                    route.name
                ),
            };
            if route.methods.is_empty() {
                routes
                    .any_method
                    .insert(route.path.as_str(), index)
                    .map_err(conflict)?;
            }
            for method in &route.methods {
                routes
                    .by_method
                    .entry(method.clone())
                    .or_default()
                    .insert(route.path.as_str(), index)
                    .map_err(conflict)?;
            }
            let protection = match route.key {
                KeyRule::Exempt => {
                    Protection::Exempt(upstream.for_route(None, route.upstream_timeout))
                }
                KeyRule::Required | KeyRule::Optional => {
                    let known = sets.len();
                    let layer = layer(route, store, config.preserve_host, &mut sets)?;
                    // A set this route is the first to name: fetched before serving.
                    if sets.len() > known
                        && let Some(jwks) = layer.1
                    {
                        routes.jwks.push((route.name.clone(), jwks));
                    }
                    let layer = layer.0;
                    routes.handlers.push(layer.handlers());
                    Protection::Protected(layer.layer(
                        upstream.for_route(Some(route.header.clone()), route.upstream_timeout),
                    ))
                }
            };
            routes.routes.push(Compiled {
                name: route.name.clone(),
                protection,
                // A catch-all's paths are its own: a trailing `/` there may mean something.
                slashed: route.path.ends_with('/') || route.path.contains("{*"),
                max_request_body: route.max_request_body,
                key_header: route.header.clone(),
            });
        }
        // Then each pattern with a trailing slash, where no route claimed that itself.
        for (index, route) in config.routes.iter().enumerate() {
            if route.path.ends_with('/') || route.path.contains("{*") {
                continue;
            }
            let slashed = format!("{}/", route.path);
            if route.methods.is_empty() {
                let _ = routes.any_method.insert(slashed.as_str(), index);
            }
            for method in &route.methods {
                if let Some(router) = routes.by_method.get_mut(method) {
                    let _ = router.insert(slashed.as_str(), index);
                }
            }
        }
        Ok(routes)
    }

    /// The route a request takes, if any: its index.
    pub(crate) fn find(&self, method: &Method, path: &str) -> Option<usize> {
        self.by_method
            .get(method)
            .and_then(|router| router.at(path).ok())
            .or_else(|| self.any_method.at(path).ok())
            .map(|found| *found.value)
    }

    /// The path a request to route `index` is one operation by: `path` without the
    /// trailing `/` that the route's pattern does not have (`/payments/` is `/payments`).
    pub(crate) fn operation_path<'a>(&self, index: usize, path: &'a str) -> &'a str {
        match self.routes[index].slashed {
            false if path.len() > 1 => path.strip_suffix('/').unwrap_or(path),
            _ => path,
        }
    }

    /// Whether route `index` is behind the layer.
    pub(crate) fn is_protected(&self, index: usize) -> bool {
        matches!(self.routes[index].protection, Protection::Protected(_))
    }

    pub(crate) fn name(&self, index: usize) -> &str {
        &self.routes[index].name
    }

    /// Serves a request on route `index`.
    pub(crate) async fn serve(&self, index: usize, request: Request<Body>) -> Response<Body> {
        match &self.routes[index].protection {
            Protection::Exempt(upstream) => upstream.forward(request).await,
            Protection::Protected(service) => {
                let route = &self.routes[index];
                let (reach, header) = (self.overrides_reach_upstream, &route.key_header);
                let limit = route.max_request_body;
                let request = match overrides::check(request, reach, header, limit).await {
                    Ok(request) => request,
                    Err(refusal) => return refusal,
                };
                match service.clone().oneshot(request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                }
            }
        }
    }
}

/// The host a request names (its `Host`, or its URI's authority under HTTP/2),
/// lowercased; `-` when it names none.
fn host_of(parts: &http::request::Parts) -> String {
    parts
        .headers
        .get(http::header::HOST)
        .and_then(|value| value.to_str().ok())
        .or_else(|| parts.uri.authority().map(http::uri::Authority::as_str))
        .map_or_else(|| "-".to_owned(), str::to_ascii_lowercase)
}

/// Room in a record for a stored response's status and headers, beside its body.
const RESPONSE_HEAD_ROOM: usize = 64 * 1024;

/// idem-http's layer with a route's settings.
///
/// `by_host`: the client's `Host` reaches the upstream (`preserve_host`), which may serve
/// several tenants by it, so it is part of the scope: one host's key never meets
/// another's.
fn layer(
    route: &Route,
    store: &Arc<dyn Store>,
    by_host: bool,
    sets: &mut HashMap<String, Jwks>,
) -> Result<(IdempotencyLayer, Option<Jwks>), RouteError> {
    let mut idem = Idempotency::builder(Arc::clone(store))
        .lease(route.lease)
        .retention(route.retention)
        // The record holds the body the route stores and the head beside it: the
        // driver's own cap (1 MiB) would otherwise keep a larger body from every replay.
        .max_response_bytes(route.max_response_body.saturating_add(RESPONSE_HEAD_ROOM));
    if let Some(budget) = route.key_budget {
        idem = idem.key_budget(crate::budget::PerCaller::new(
            &route.name,
            budget.keys,
            budget.per,
        ));
    }
    let idem = idem.build().map_err(|source| RouteError::Settings {
        route: route.name.clone(),
        source,
    })?;
    let scope = match &route.scope {
        Some(source) => Scope::new(source, sets).map_err(|err| match err {
            ScopeError::Key(source) => RouteError::JwtKey {
                route: route.name.clone(),
                source,
            },
            ScopeError::Jwks(source) => RouteError::Jwks {
                route: route.name.clone(),
                source: Box::new(source),
            },
        })?,
        None => return Err(RouteError::NoScope(route.name.clone())),
    };
    let jwks = scope.jwks().cloned();
    let requirement = match route.key {
        KeyRule::Optional => KeyRequirement::Optional,
        _ => KeyRequirement::Required,
    };
    // A route that names no methods protects the ones that change things: reads and
    // preflights pass, as a route naming them would have them protected.
    let every_method = route.methods.is_empty();
    let status = route.status.clone();
    let mut stored_headers = idem_http::DEFAULT_STORED_HEADERS.to_vec();
    stored_headers.extend(route.store_headers.iter().cloned());
    let mut layer = IdempotencyLayer::new(idem, move |parts| {
        let host = by_host.then(|| host_of(parts));
        scope.of(parts, host.as_deref())
    })
    .header(route.header.clone())
    .route_label(route.name.clone())
    .stored_headers(stored_headers)
    .requirement_with(move |parts| {
        let safe = matches!(
            parts.method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
        );
        Some(if every_method && safe {
            KeyRequirement::Ignored
        } else {
            requirement
        })
    })
    .max_request_body(route.max_request_body)
    .max_response_body(route.max_response_body)
    .disposition(move |code: StatusCode| {
        if status.store.contains(&code) {
            Disposition::Store
        } else if status.release.contains(&code) {
            Disposition::Release
        } else if status.hold.contains(&code) {
            Disposition::Hold
        } else {
            idem_http::default_disposition(code)
        }
    });
    if !route.ignore_fields.is_empty() {
        layer = layer.ignore_json_fields(route.ignore_fields.iter().cloned());
    }
    Ok((layer, jwks))
}

/// The request path as routes see it and the upstream gets it: percent-escapes of
/// unreserved characters decoded (RFC 3986, section 6.2.2.2), runs of `/` made one, and
/// `.` and `..` segments resolved; a trailing slash is kept. `None` when it is already so.
pub(crate) fn normalize(path: &str) -> Option<String> {
    let plain = !path.contains("//")
        && !path.contains("/./")
        && !path.contains("/../")
        && !path.ends_with("/.")
        && !path.ends_with("/..")
        && !path.contains('%');
    if plain {
        return None;
    }
    let bytes = path.as_bytes();
    let mut decoded = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = path.get(i + 1..i + 3)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
            && (byte.is_ascii_alphanumeric() || b"-._~".contains(&byte))
        {
            decoded.push(char::from(byte));
            i += 3;
            continue;
        }
        // Other escapes stay as they are: `%2F` is not a separator.
        let ch = path[i..].chars().next().unwrap_or('/');
        decoded.push(ch);
        i += ch.len_utf8();
    }
    let trailing = decoded.ends_with('/') || decoded.ends_with("/.") || decoded.ends_with("/..");
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            other => segments.push(other),
        }
    }
    let mut normal = String::with_capacity(decoded.len());
    for segment in &segments {
        normal.push('/');
        normal.push_str(segment);
    }
    if trailing || normal.is_empty() {
        normal.push('/');
    }
    (normal != path).then_some(normal)
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn paths_are_made_plain_for_routes_and_the_upstream() {
        assert_eq!(normalize("/payments"), None);
        assert_eq!(normalize("/payments/"), None);
        assert_eq!(normalize("//payments").as_deref(), Some("/payments"));
        assert_eq!(normalize("/pay%6Dents").as_deref(), Some("/payments"));
        assert_eq!(normalize("/pay%6dents").as_deref(), Some("/payments"));
        assert_eq!(
            normalize("/a/./b/../payments").as_deref(),
            Some("/a/payments")
        );
        assert_eq!(normalize("/../payments").as_deref(), Some("/payments"));
        assert_eq!(
            normalize("/files/a%2Fb"),
            None,
            "an escaped slash is not a separator"
        );
        assert_eq!(
            normalize("/x%zz").as_deref(),
            None,
            "a broken escape is left alone"
        );
        assert_eq!(normalize("/payments/.").as_deref(), Some("/payments/"));
        assert_eq!(
            normalize("/caf%C3%A9"),
            None,
            "only unreserved characters are decoded"
        );
        assert_eq!(normalize("/é//x").as_deref(), Some("/é/x"));
    }
}
