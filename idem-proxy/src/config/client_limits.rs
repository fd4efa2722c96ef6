//! The limits every client is held to, with their defaults.

use std::time::Duration;

/// The limits every client is held to, so that slow, idle or too many clients cannot hold
/// the proxy's connections and memory: what nginx's `client_header_timeout`,
/// `client_body_timeout` and `worker_connections` bound.
///
/// At most `max_concurrent_requests` requests are served at once (protected ones until
/// the server took their answer's last part, others until their answer's head is ready;
/// handlers whose clients went away count until they end), each holding at most its route's
/// `max_request_body` and a stored answer (`max_response_body`, plus 64 KiB of headers)
/// in memory: that product bounds the bodies of protected requests a replica holds.
///
/// ```
/// let config = idem_proxy::Config::parse(
///     "idem.toml",
///     r#"
///     upstream = "http://127.0.0.1:8000"
///     client_header_timeout = "10s"
///     max_connections = 2048
///     "#,
/// )?;
/// assert_eq!(config.clients.header_timeout, std::time::Duration::from_secs(10));
/// assert_eq!(config.clients.max_concurrent_requests, 1024);
/// # Ok::<(), idem_proxy::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientLimits {
    /// How long a client has to send its first bytes, and then each HTTP/1 request's
    /// whole head, counted from the moment its connection opened (so a first head may
    /// take twice it) or its previous answer ended (default 75 s): a silent connection, a slow head (slowloris) and an idle HTTP/1
    /// keep-alive connection are closed alike. HTTP/2 clients are pinged every 30 s and
    /// closed when a ping goes 20 s unanswered. Keep it above the
    /// idle timeout of the load balancer in front (AWS's is 60 s), or the balancer may
    /// send a request on a connection the proxy is closing.
    pub header_timeout: Duration,
    /// How long the proxy waits for the next part of a request body it is reading
    /// (default 60 s; gRPC streams excepted). On a protected route the body is read whole
    /// before anything is claimed: one that stalls is answered 408 and nothing happens.
    /// Elsewhere the body streams to the upstream, which has its start; the stalled
    /// request is cut and answered 408.
    pub body_timeout: Duration,
    /// How long a write to a client may wait (default 60 s): a client that stops reading
    /// its answer is cut, as with nginx's `send_timeout`.
    pub send_timeout: Duration,
    /// How many client connections are open at most (default 4096); past it the proxy
    /// accepts no more until one closes, and new ones wait in the system's backlog.
    pub max_connections: usize,
    /// How many requests are served at once at most (default 1024); past it a request is
    /// answered 503 with `Retry-After`, before any key is claimed.
    pub max_concurrent_requests: usize,
}

impl Default for ClientLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(75),
            body_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(60),
            max_connections: 4096,
            max_concurrent_requests: 1024,
        }
    }
}
