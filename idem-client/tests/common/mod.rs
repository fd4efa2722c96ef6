//! What the client's test files share: a server on 127.0.0.1 and a look at the error a
//! `send` ended with.

#![allow(dead_code)] // each test binary uses what it needs

use std::net::SocketAddr;

use std::time::Duration;

use idem_client::{ClientError, IdempotencyMiddleware, RetryPolicy};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use tokio::net::TcpListener;

/// A client through `middleware`: no proxy from the environment, each request bounded
/// (10 s) so that a broken middleware fails the test instead of hanging it.
pub(crate) fn client(middleware: IdempotencyMiddleware) -> ClientWithMiddleware {
    let inner = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client");
    ClientBuilder::new(inner).with(middleware).build()
}

/// A policy with short backoffs, for tests.
pub(crate) fn quick() -> RetryPolicy {
    RetryPolicy::default()
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .deadline(Duration::from_secs(15))
}

/// Serves `app` on a port of its own on 127.0.0.1, until the test ends.
pub(crate) async fn serve(app: axum::Router) -> SocketAddr {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("bind on loopback");
    let addr = listener.local_addr().expect("a bound address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// The middleware's own error a `send` ended with; panics on any other.
pub(crate) fn client_error(err: &reqwest_middleware::Error) -> &ClientError {
    let reqwest_middleware::Error::Middleware(inner) = err else {
        panic!("not the middleware's error: {err:?}")
    };
    inner
        .downcast_ref::<ClientError>()
        .unwrap_or_else(|| panic!("not a ClientError: {err:?}"))
}
