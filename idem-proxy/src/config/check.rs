//! The whole file checked into a [`Config`]: the upstream, the listeners, the client
//! limits, the store, and each route.

use std::time::Duration;

use toml::Spanned;

use super::check_route::route_of;
use super::file::{File, Locator};
use super::values::{address, count, duration};
use super::{
    ClientLimits, Config, ConfigError, DEFAULT_SHUTDOWN_GRACE, Unmatched, default_shutdown_delay,
};

impl File {
    fn client_limits(&self, at: &Locator<'_>) -> Result<ClientLimits, ConfigError> {
        let defaults = ClientLimits::default();
        // A timer shorter than a round trip on a loaded machine would close every
        // connection before its head arrived.
        let least = Duration::from_millis(100);
        Ok(ClientLimits {
            header_timeout: duration(
                at,
                "client_header_timeout",
                self.client_header_timeout.as_ref(),
                defaults.header_timeout,
                least,
            )?,
            body_timeout: duration(
                at,
                "client_body_timeout",
                self.client_body_timeout.as_ref(),
                defaults.body_timeout,
                least,
            )?,
            send_timeout: duration(
                at,
                "client_send_timeout",
                self.client_send_timeout.as_ref(),
                defaults.send_timeout,
                least,
            )?,
            max_connections: count(
                at,
                "max_connections",
                self.max_connections.as_ref(),
                defaults.max_connections,
                1_000_000,
            )?,
            max_concurrent_requests: count(
                at,
                "max_concurrent_requests",
                self.max_concurrent_requests.as_ref(),
                defaults.max_concurrent_requests,
                1_000_000,
            )?,
        })
    }

    pub(super) fn check(self, at: &Locator<'_>) -> Result<Config, ConfigError> {
        let upstream = self
            .upstream
            .as_ref()
            .ok_or_else(|| at.error(0..0, "`upstream` is missing: write upstream = \"http://127.0.0.1:8000\", the service behind the proxy"))?;
        let uri: http::Uri = upstream.get_ref().parse().map_err(|err| {
            at.error(
                upstream.span(),
                format!("`upstream`: {err}; write \"http://host:port\""),
            )
        })?;
        if uri.scheme_str() != Some("http")
            || uri.authority().is_none_or(|a| a.as_str().contains('@'))
            || uri.query().is_some()
        {
            return Err(at.error(
                upstream.span(),
                "`upstream` must be http://host:port (optionally with a path prefix; no query, no user name): the proxy speaks plain HTTP/1.1 or h2c to the service behind it; put TLS in front of the proxy",
            ));
        }
        let unmatched = match self.unmatched.as_ref().map(|u| (u.get_ref().as_str(), u)) {
            None | Some(("pass", _)) => Unmatched::Pass,
            Some(("reject", _)) => Unmatched::Reject,
            Some((other, spanned)) => {
                return Err(at.error(
                    spanned.span(),
                    format!("`unmatched` = {other:?}: write \"pass\" (to the upstream, unprotected) or \"reject\" (404)"),
                ));
            }
        };
        let listen = address(at, "listen", self.listen.as_ref(), "127.0.0.1:8080")?;
        if uri
            .authority()
            .is_some_and(|a| a.as_str() == listen.to_string())
        {
            return Err(at.error(
                upstream.span(),
                "`upstream` is the proxy's own `listen` address: every request would come back to the proxy",
            ));
        }
        let connect_timeout = duration(
            at,
            "connect_timeout",
            self.connect_timeout.as_ref(),
            Duration::from_secs(2),
            Duration::from_millis(1),
        )?;
        let upstream_timeout = duration(
            at,
            "upstream_timeout",
            self.upstream_timeout.as_ref(),
            Duration::from_secs(60),
            Duration::from_millis(1),
        )?;
        if upstream_timeout <= connect_timeout {
            return Err(at.error(
                self.upstream_timeout.as_ref().map_or(0..0, Spanned::span),
                format!(
                    "`upstream_timeout` ({}) must be longer than `connect_timeout` ({}): it counts from the request's start, connection included",
                    humantime::format_duration(upstream_timeout),
                    humantime::format_duration(connect_timeout)
                ),
            ));
        }
        let mut routes = Vec::with_capacity(self.routes.len());
        for route in &self.routes {
            routes.push(route_of(
                at,
                route,
                &self.defaults,
                (connect_timeout, upstream_timeout),
            )?);
        }
        Ok(Config {
            listen,
            admin_listen: address(
                at,
                "admin_listen",
                self.admin_listen.as_ref(),
                "127.0.0.1:9464",
            )?,
            upstream: uri,
            upstream_http2: self.upstream_http2,
            connect_timeout,
            upstream_timeout,
            preserve_host: self.preserve_host,
            upstream_idle_timeout: duration(
                at,
                "upstream_idle_timeout",
                self.upstream_idle_timeout.as_ref(),
                Duration::from_millis(1500),
                Duration::from_millis(1),
            )?,
            trust_forwarded_headers: self.trust_forwarded_headers,
            shutdown_grace: duration(
                at,
                "shutdown_grace",
                self.shutdown_grace.as_ref(),
                DEFAULT_SHUTDOWN_GRACE,
                Duration::ZERO,
            )?,
            shutdown_delay: duration(
                at,
                "shutdown_delay",
                self.shutdown_delay.as_ref(),
                default_shutdown_delay(std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()),
                Duration::ZERO,
            )?,
            clients: self.client_limits(at)?,
            ready_checks_store: self.ready_checks_store,
            store: self.store.filter(|s| !s.trim().is_empty()),
            migrate: self.migrate,
            store_connections: match &self.store_connections {
                None => 16,
                Some(value) => u32::try_from(*value.get_ref())
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| {
                        at.error(
                            value.span(),
                            "`store_connections` is a number from 1 to 1000",
                        )
                    })?,
            },
            purge_interval: match &self.purge_interval {
                None => None,
                Some(value) => Some(duration(
                    at,
                    "purge_interval",
                    Some(value),
                    Duration::ZERO,
                    Duration::from_secs(1),
                )?),
            },
            unmatched,
            routes,
        })
    }
}
