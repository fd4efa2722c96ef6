//! What binding refuses before anything is served: client limits no file could set, and
//! an upstream that is the proxy itself.

use std::net::SocketAddr;
use std::time::Duration;

use super::ProxyError;
use crate::config::ClientLimits;

/// The limits a file could not have set: counts from 1 to a million, timeouts from
/// 100 ms to idem's longest duration.
pub(super) fn check_limits(limits: &ClientLimits) -> Result<(), ProxyError> {
    let count = |setting, n: usize| match (1..=1_000_000).contains(&n) {
        true => Ok(()),
        false => Err(ProxyError::Limit {
            setting,
            why: "is a number from 1 to 1000000",
        }),
    };
    count("max_connections", limits.max_connections)?;
    count("max_concurrent_requests", limits.max_concurrent_requests)?;
    for (setting, timeout) in [
        ("client_header_timeout", limits.header_timeout),
        ("client_body_timeout", limits.body_timeout),
        ("client_send_timeout", limits.send_timeout),
    ] {
        if !(Duration::from_millis(100)..=idem_core::raw::MAX_DURATION).contains(&timeout) {
            return Err(ProxyError::Limit {
                setting,
                why: "is a duration from 100 ms to 100 years",
            });
        }
    }
    Ok(())
}

/// Whether `upstream` names this machine's `listen` address: the same port, on the same
/// address, on loopback or "any address".
pub(crate) fn points_at(upstream: &http::Uri, listen: SocketAddr) -> bool {
    let Some(authority) = upstream.authority() else {
        return false;
    };
    if authority.port_u16().unwrap_or(80) != listen.port() {
        return false;
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let ip = match host {
        "localhost" => return true,
        other => other.parse::<std::net::IpAddr>(),
    };
    match ip {
        Ok(ip) => {
            ip == listen.ip()
                || ip.is_unspecified()
                || listen.ip().is_unspecified() && ip.is_loopback()
                || ip.is_loopback() && listen.ip().is_loopback()
        }
        // Another machine's name: not resolved here.
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::points_at;

    #[test]
    fn an_upstream_on_the_proxys_own_port_is_a_loop() {
        let uri = |u: &str| u.parse::<http::Uri>().unwrap();
        let at = |a: &str| a.parse::<std::net::SocketAddr>().unwrap();
        assert!(points_at(
            &uri("http://127.0.0.1:8080"),
            at("127.0.0.1:8080")
        ));
        assert!(points_at(
            &uri("http://localhost:8080"),
            at("127.0.0.1:8080")
        ));
        assert!(points_at(&uri("http://127.0.0.1:8080"), at("0.0.0.0:8080")));
        assert!(points_at(&uri("http://[::1]:8080"), at("[::1]:8080")));
        assert!(points_at(&uri("http://127.0.0.1"), at("127.0.0.1:80")));
        assert!(!points_at(
            &uri("http://127.0.0.1:8000"),
            at("127.0.0.1:8080")
        ));
        assert!(!points_at(
            &uri("http://10.0.0.7:8080"),
            at("127.0.0.1:8080")
        ));
        assert!(!points_at(
            &uri("http://payments.internal:8080"),
            at("127.0.0.1:8080")
        ));
    }
}
