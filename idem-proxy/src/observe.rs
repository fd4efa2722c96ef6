//! Metrics, through the `metrics` facade, served at `/metrics` with the layer's
//! (`idem_http_requests_total`, labelled with the `route`'s name) and the driver's (`idem_claims_total` and the rest). No
//! label carries a key, a scope, a path or a body: routes are named by the configuration.
//!
//! | name | kind | labels | moves when |
//! |---|---|---|---|
//! | `idem_proxy_requests_total` | counter | `route`, `status` | the proxy answered a request (`route` is the route's name, or `unmatched`) |
//! | `idem_proxy_upstream_errors_total` | counter | `kind` | the upstream did not answer: `connect` (never reached; the key is released), `refused` (an HTTP/2 stream refused unprocessed; released), `timeout` or `broken` (before its head: the key is held; after it: its head decides) |
//! | `idem_proxy_upstream_seconds` | histogram | | the upstream's time to a response head |
//! | `idem_proxy_client_connections` | gauge | | client connections open |
//! | `idem_proxy_client_limits_total` | counter | `limit` | a client met a limit: `connections` (`max_connections` reached: no more are accepted until one closes), `requests` (`max_concurrent_requests` reached: 503), `body_timeout` (a request body stalled: 408), `send_timeout` (a client stopped reading its answer: cut) |
//! | `idem_proxy_reloads_total` | counter | `result` | a reload of the configuration (SIGHUP to `idem proxy`) was applied (`ok`) or refused, the running one kept (`failed`) |
//! | `idem_proxy_unprotected_keys_total` | counter | | a request carried an idempotency key on no route: it went to the upstream unprotected (`unmatched = "pass"`) |

use std::time::Duration;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};

/// A Prometheus recorder's builder with idem's histograms (the proxy's, the driver's:
/// every metric named `idem_...`) exported as Prometheus histograms, with
/// [`SECONDS_BUCKETS`](idem_core::driver::observe::SECONDS_BUCKETS): buckets add up
/// across replicas (`histogram_quantile(0.99, sum by (le) (rate(..._bucket[5m])))`),
/// where the exporter's default, a summary per replica, cannot be aggregated.
///
/// ```
/// let handle = idem_proxy::observe::prometheus_builder()
///     .expect("the buckets are valid")
///     .build_recorder()
///     .handle();
/// # let _ = handle;
/// ```
///
/// # Errors
///
/// None with idem's buckets; the type is the exporter's.
pub fn prometheus_builder() -> Result<PrometheusBuilder, BuildError> {
    // idem's histograms only: another library's in the same process keeps its own kind.
    PrometheusBuilder::new().set_buckets_for_metric(
        Matcher::Prefix("idem_".to_owned()),
        idem_core::driver::observe::SECONDS_BUCKETS,
    )
}

/// `idem_proxy_requests_total`
pub const REQUESTS: &str = "idem_proxy_requests_total";
/// `idem_proxy_upstream_errors_total`
pub const UPSTREAM_ERRORS: &str = "idem_proxy_upstream_errors_total";
/// `idem_proxy_upstream_seconds`
pub const UPSTREAM_SECONDS: &str = "idem_proxy_upstream_seconds";
/// `idem_proxy_client_connections`
pub const CLIENT_CONNECTIONS: &str = "idem_proxy_client_connections";
/// `idem_proxy_client_limits_total`
pub const CLIENT_LIMITS: &str = "idem_proxy_client_limits_total";
/// `idem_proxy_reloads_total`
pub const RELOADS: &str = "idem_proxy_reloads_total";
/// `idem_proxy_unprotected_keys_total`
pub const UNPROTECTED_KEYS: &str = "idem_proxy_unprotected_keys_total";

pub(crate) fn request(route: &str, status: http::StatusCode) {
    metrics::counter!(REQUESTS, "route" => route.to_owned(), "status" => status.as_str().to_owned())
        .increment(1);
}

pub(crate) fn upstream_error(kind: &'static str) {
    metrics::counter!(UPSTREAM_ERRORS, "kind" => kind).increment(1);
}

pub(crate) fn upstream_latency(elapsed: Duration) {
    metrics::histogram!(UPSTREAM_SECONDS).record(elapsed.as_secs_f64());
}

pub(crate) fn client_connections(change: f64) {
    metrics::gauge!(CLIENT_CONNECTIONS).increment(change);
}

pub(crate) fn client_limit(limit: &'static str) {
    metrics::counter!(CLIENT_LIMITS, "limit" => limit).increment(1);
}

pub(crate) fn unprotected_key() {
    metrics::counter!(UNPROTECTED_KEYS).increment(1);
}

pub(crate) fn reload(ok: bool) {
    let result = if ok { "ok" } else { "failed" };
    metrics::counter!(RELOADS, "result" => result).increment(1);
}
