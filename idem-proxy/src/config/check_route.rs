//! One route checked: its methods and path, key, header, stored headers, status policy,
//! timeouts, lease, retention, sizes and key budget, over the file's defaults.

use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use toml::Spanned;

use super::check_scope::scope_of;
use super::file::{Defaults, KeyBudgetFile, Locator, RouteFile};
use super::route::KeyBudget;
use super::values::{bytes, duration};
use super::{ConfigError, KeyRule, Route, StatusPolicy};

pub(super) fn route_of(
    at: &Locator<'_>,
    spanned: &Spanned<RouteFile>,
    defaults: &Defaults,
    (connect_timeout, upstream_timeout): (Duration, Duration),
) -> Result<Route, ConfigError> {
    let route = spanned.get_ref();
    let line = at.line(spanned.span().start);
    let own = &route.settings();
    let pick = |a: &Option<Spanned<String>>, b: &Option<Spanned<String>>| a.clone().or(b.clone());

    let mut methods = Vec::new();
    for method in &route.methods {
        let parsed = Method::from_bytes(method.get_ref().to_ascii_uppercase().as_bytes())
            .map_err(|_| at.error(method.span(), format!("{:?} is not an HTTP method: write \"POST\", \"PUT\", \"PATCH\" or \"DELETE\"", method.get_ref())))?;
        methods.push(parsed);
    }
    let path = route.path.get_ref();
    if !path.starts_with('/') {
        return Err(at.error(
            route.path.span(),
            format!("`path` = {path:?} must start with `/`: write \"/payments\", \"/orders/{{id}}/refund\" or \"/files/{{*rest}}\""),
        ));
    }
    // The pattern's syntax is checked by the matcher, here with the route's own line.
    matchit::Router::<()>::new()
        .insert(path.as_str(), ())
        .map_err(|err| at.error(route.path.span(), format!("`path` = {path:?}: {err}; parameters are written {{name}}, a rest of path {{*name}}")))?;

    let key = match pick(&own.key, &defaults.key) {
        None => KeyRule::Required,
        Some(value) => match value.get_ref().as_str() {
            "required" => KeyRule::Required,
            "optional" => KeyRule::Optional,
            "exempt" => KeyRule::Exempt,
            other => {
                return Err(at.error(
                    value.span(),
                    format!("`key` = {other:?}: write \"required\", \"optional\" or \"exempt\""),
                ));
            }
        },
    };
    let header = match pick(&own.header, &defaults.header) {
        None => idem_http::DEFAULT_HEADER,
        Some(value) => {
            let name = HeaderName::from_bytes(value.get_ref().as_bytes()).map_err(|_| {
                at.error(
                    value.span(),
                    format!("`header` = {:?} is not a header name", value.get_ref()),
                )
            })?;
            // A credential as the key would put it in the store and in every replay.
            if [
                http::header::AUTHORIZATION,
                http::header::COOKIE,
                http::header::PROXY_AUTHORIZATION,
            ]
            .contains(&name)
            {
                return Err(at.error(
                    value.span(),
                    format!(
                        "`header` = {:?} carries credentials, not an idempotency key: use \"Idempotency-Key\"",
                        value.get_ref()
                    ),
                ));
            }
            name
        }
    };
    let mut store_headers = Vec::new();
    for name in own
        .store_headers
        .as_ref()
        .or(defaults.store_headers.as_ref())
        .into_iter()
        .flatten()
    {
        let parsed = HeaderName::from_bytes(name.get_ref().as_bytes()).map_err(|_| {
            at.error(
                name.span(),
                format!(
                    "{:?} in `store_headers` is not a header name",
                    name.get_ref()
                ),
            )
        })?;
        if parsed == http::header::SET_COOKIE {
            return Err(at.error(
                name.span(),
                "`set-cookie` is never stored: a replay would hand the first caller's session to whoever retries",
            ));
        }
        store_headers.push(parsed);
    }
    let scope = match own.scope.clone().or(defaults.scope.clone()) {
        None if key == KeyRule::Exempt => None,
        None => {
            return Err(at.error(
                spanned.span(),
                format!("route `{path}` has no `scope`: say whose key it is, with scope = {{ header = \"x-account-id\" }} (a header your gateway sets after authenticating) or scope = {{ jwt_claim = \"sub\", secret_env = \"JWT_SECRET\" }}; without one, one caller's retry could replay another's response"),
            ));
        }
        Some(scope) => Some(scope_of(at, &scope)?),
    };
    let status = own
        .status
        .clone()
        .or(defaults.status.clone())
        .unwrap_or_default();
    let mut policy = StatusPolicy::default();
    for (list, into) in [
        (&status.store, &mut policy.store),
        (&status.release, &mut policy.release),
        (&status.hold, &mut policy.hold),
    ] {
        for code in list {
            let parsed = StatusCode::from_u16(*code.get_ref())
                .ok()
                .filter(|s| (100..600).contains(&s.as_u16()))
                .ok_or_else(|| {
                    at.error(
                        code.span(),
                        format!("{} is not an HTTP status", code.get_ref()),
                    )
                })?;
            into.push(parsed);
        }
    }
    for code in &policy.store {
        if policy.release.contains(code) || policy.hold.contains(code) {
            return Err(at.error(
                spanned.span(),
                format!("status {code} is in more than one of `status.store`, `status.release` and `status.hold`: keep it in one"),
            ));
        }
    }
    if let Some(code) = policy.release.iter().find(|c| policy.hold.contains(c)) {
        return Err(at.error(
            spanned.span(),
            format!("status {code} is in both `status.release` and `status.hold`: keep it in one"),
        ));
    }
    let own_timeout = pick(&own.upstream_timeout, &defaults.upstream_timeout);
    let upstream_timeout = duration(
        at,
        "upstream_timeout",
        own_timeout.as_ref(),
        upstream_timeout,
        connect_timeout.saturating_add(Duration::from_millis(1)),
    )?;
    let lease = duration(
        at,
        "lease",
        pick(&own.lease, &defaults.lease).as_ref(),
        Duration::from_secs(60).max(upstream_timeout),
        Duration::from_millis(100),
    )?;
    // An exempt route claims nothing: its lease and retention are never used.
    let exempt = key == KeyRule::Exempt;
    if lease < upstream_timeout && !exempt {
        let value = pick(&own.lease, &defaults.lease);
        return Err(at.error(
            value.map_or(spanned.span(), |v| v.span()),
            format!(
                "route `{path}`: `lease` ({}) is shorter than `upstream_timeout` ({}): after the proxy gives up on a request the upstream may still run it, and a retry could run it again once the lease ends; make the lease at least `upstream_timeout`, and longer than the upstream's slowest answer",
                humantime::format_duration(lease),
                humantime::format_duration(upstream_timeout)
            ),
        ));
    }
    let retention_value = pick(&own.retention, &defaults.retention);
    let retention = duration(
        at,
        "retention",
        retention_value.as_ref(),
        Duration::from_secs(24 * 3600),
        Duration::from_secs(1),
    )?;
    if retention <= lease && !exempt {
        return Err(at.error(
            retention_value.map_or(spanned.span(), |v| v.span()),
            format!(
                "route `{path}`: `retention` ({}) must be longer than `lease` ({}): an answer must outlive the lease that produced it",
                humantime::format_duration(retention),
                humantime::format_duration(lease)
            ),
        ));
    }
    let name = route.name.clone().unwrap_or_else(|| {
        let methods: Vec<&str> = methods.iter().map(Method::as_str).collect();
        if methods.is_empty() {
            path.clone()
        } else {
            format!("{} {path}", methods.join(","))
        }
    });
    Ok(Route {
        name,
        methods,
        path: path.clone(),
        key,
        header,
        scope,
        ignore_fields: own
            .ignore_fields
            .clone()
            .or(defaults.ignore_fields.clone())
            .unwrap_or_default(),
        status: policy,
        store_headers,
        upstream_timeout,
        lease,
        retention,
        max_request_body: bytes(
            at,
            "max_request_body",
            own.max_request_body
                .as_ref()
                .or(defaults.max_request_body.as_ref()),
            idem_http::DEFAULT_MAX_REQUEST_BODY,
        )?,
        max_response_body: bytes(
            at,
            "max_response_body",
            own.max_response_body
                .as_ref()
                .or(defaults.max_response_body.as_ref()),
            idem_http::DEFAULT_MAX_RESPONSE_BODY,
        )?,
        key_budget: match own.key_budget.as_ref().or(defaults.key_budget.as_ref()) {
            None => None,
            Some(budget) => Some(key_budget(at, budget)?),
        },
        line,
    })
}

fn key_budget(
    at: &Locator<'_>,
    spanned: &Spanned<KeyBudgetFile>,
) -> Result<KeyBudget, ConfigError> {
    let budget = spanned.get_ref();
    let keys = u32::try_from(budget.keys)
        .ok()
        .filter(|keys| *keys >= 1)
        .ok_or_else(|| {
            at.error(
                spanned.span(),
                "`key_budget.keys` is a number of new keys from 1 to 4294967295, such as 100",
            )
        })?;
    let per = humantime::parse_duration(&budget.per)
        .ok()
        .filter(|per| (Duration::from_secs(1)..=idem_core::raw::MAX_DURATION).contains(per))
        .ok_or_else(|| {
            at.error(
                spanned.span(),
                format!(
                    "`key_budget.per` = {:?}: write a period from 1 s, such as \"1m\" or \"1h\"",
                    budget.per
                ),
            )
        })?;
    Ok(KeyBudget { keys, per })
}
