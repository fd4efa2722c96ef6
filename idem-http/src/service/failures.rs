//! What a client gets when the handler failed (an error, a panic) or was shed before
//! it ran.

use http::{Response, StatusCode};
use idem_core::{BoxError, WorkError};

use super::protected::{Captured, lock};
use crate::Body;
use crate::layer::Config;

pub(super) fn handler_failed(config: &Config) -> Response<Body> {
    handler_failed_problem(config).into_http_response()
}

fn handler_failed_problem(config: &Config) -> crate::Problem {
    config.problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "handler-failed",
        "The handler failed",
    )
}

/// Whether an inner service's error says the request never reached the handler: tower's
/// `LoadShed` refused it (its inner service was not ready), so nothing ran.
pub(super) fn not_run(err: &BoxError) -> bool {
    err.is::<tower::load_shed::error::Overloaded>()
}

/// A request shed before the handler ran: the key is released at once, and the client
/// gets 503 with `Retry-After`, to retry with the same key.
pub(super) fn shed(config: &Config, captured: &Captured) -> Result<Vec<u8>, WorkError<Vec<u8>>> {
    tracing::debug!("the inner service shed the request; its key is released");
    *lock(captured) = Some(overloaded(config, true));
    Err(WorkError::Retryable(Vec::new()))
}

/// 503 for a request shed before it ran; `keyed` when it had a key to retry with.
pub(super) fn overloaded(config: &Config, keyed: bool) -> Response<Body> {
    let detail = match keyed {
        true => {
            "The request was shed before it ran; nothing was done. Retry with the same key after the time in Retry-After."
        }
        false => {
            "The request was shed before it ran; nothing was done. Retry after the time in Retry-After."
        }
    };
    config
        .problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "The service is overloaded",
        )
        .detail(detail)
        .retry_after(1)
        .into_http_response()
}

/// The handler failed (an error from the inner service, a panic, or a body that broke
/// off before anything was sent): its effect may have happened, so the key is held, and
/// the client gets 500.
pub(super) fn failed(
    err: &BoxError,
    config: &Config,
    captured: &Captured,
) -> Result<Vec<u8>, WorkError<Vec<u8>>> {
    tracing::warn!(error = %err, "the inner service failed");
    *lock(captured) = Some(handler_failed(config));
    Err(WorkError::Unknown(Vec::new()))
}
