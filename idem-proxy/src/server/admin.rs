//! The admin listener's routes: `/readyz` and `/metrics` (`/healthz` needs no handler).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::State;
use http::{Response, StatusCode};
use idem_core::Key;
use metrics_exporter_prometheus::PrometheusHandle;

use super::Shared;

#[derive(Clone)]
pub(super) struct AdminState {
    pub(super) shared: Arc<Shared>,
    pub(super) metrics: Option<PrometheusHandle>,
}

/// 200 while serving; 503 once a shutdown began. With `ready_checks_store`, also 503
/// while the store fails a read or takes longer than 800 ms (below kubelet's default 1 s
/// probe timeout, so the probe gets an answer, not a timeout).
pub(super) async fn readyz(State(state): State<AdminState>) -> (StatusCode, &'static str) {
    if !state.shared.ready.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
    }
    if !state.shared.ready_checks_store {
        return (StatusCode::OK, "ready\n");
    }
    let Ok(probe) = Key::new("idem-proxy", "readiness") else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no probe key\n");
    };
    match tokio::time::timeout(Duration::from_millis(800), state.shared.store.get(&probe)).await {
        Ok(Ok(_)) => (StatusCode::OK, "ready\n"),
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "readiness: the store failed a read");
            (StatusCode::SERVICE_UNAVAILABLE, "the store failed a read\n")
        }
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the store did not answer in 800 ms\n",
        ),
    }
}

pub(super) async fn metrics(State(state): State<AdminState>) -> Response<axum::body::Body> {
    match state.metrics {
        Some(handle) => Response::builder()
            .header(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")
            .body(axum::body::Body::from(handle.render()))
            .unwrap_or_default(),
        None => Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(axum::body::Body::from(
                "no metrics recorder in this process\n",
            ))
            .unwrap_or_default(),
    }
}
