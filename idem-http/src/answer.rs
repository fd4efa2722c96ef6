//! What the client gets for each answer of the driver: the handler's response, a replay,
//! or a problem (`application/problem+json`) saying what to do.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use idem_core::driver::Unstorable;
use idem_core::record::ValuePart;
use idem_core::{Error, Outcome, key::KeyError, key::KeyPart};

use crate::Body;
use crate::key_header::KeyHeaderError;
use crate::layer::Config;
use crate::observe::Answer;
use crate::service::{BODY_NOT_STORED_HEADER, REPLAYED_HEADER};

// As names, so that inserting them copies nothing.
const REPLAYED: HeaderName = HeaderName::from_static(REPLAYED_HEADER);
const BODY_NOT_STORED: HeaderName = HeaderName::from_static(BODY_NOT_STORED_HEADER);
use crate::stored::StoredResponse;

/// The answer for what the driver said, and what it counts as.
pub(crate) fn answer(
    result: Result<Outcome<Vec<u8>, Vec<u8>>, Error>,
    first: impl Fn() -> Option<Response<Body>>,
    config: &Config,
    held_here: bool,
) -> (Answer, Response<Body>) {
    let respond = |answer, response| (answer, response);
    let internal = |answer, title: &str| {
        respond(
            answer,
            config
                .problem(StatusCode::INTERNAL_SERVER_ERROR, "internal", title)
                .into_http_response(),
        )
    };
    match result {
        Ok(Outcome::Completed {
            replayed: false,
            value,
        }) => match first() {
            Some(response) => respond(Answer::Executed, response),
            None => replay(value, false, config),
        },
        Ok(Outcome::Completed {
            replayed: true,
            value,
        }) => replay(value, true, config),
        Ok(Outcome::Retryable(_)) => match first() {
            Some(response) => respond(Answer::Released, response),
            None => internal(Answer::Error, "The handler's response was lost"),
        },
        Ok(Outcome::Unknown(_)) => match first() {
            Some(response) => respond(Answer::Held, response),
            None => internal(Answer::Error, "The handler's response was lost"),
        },
        Ok(_) => internal(
            Answer::Error,
            "This key holds a result that is not an HTTP response",
        ),
        Err(Error::InFlight { retry_after }) if held_here => respond(
            Answer::InFlight,
            config.problem(StatusCode::CONFLICT, "in-flight", "A request with this key is held until its lease ends")
                .detail("The first request with this idempotency key got a response that was not kept (an error that may have taken effect, or a response that could not be stored), so nothing runs again under this key until its lease ends. Retry after the time in Retry-After: the request then runs again, unless an operator finished the key.")
                .retry_after(whole_seconds(retry_after.min(config.held_retry_after)))
                .held()
                .into_http_response(),
        ),
        Err(Error::InFlight { retry_after }) => respond(
            Answer::InFlight,
            config.problem(StatusCode::CONFLICT, "in-flight", "A request with this key is in progress")
                .detail("The first request with this idempotency key has not finished; retry after the time in Retry-After.")
                .retry_after(whole_seconds(retry_after.min(config.in_flight_retry_after)))
                .into_http_response(),
        ),
        Err(Error::Mismatch) => respond(
            Answer::Mismatch,
            config.problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "key-reused",
                "This idempotency key was used for a different request",
            )
            .detail(format!(
                "A request with this {} had another method, path, query or body. Send a new key for a new request.",
                config.header
            ))
            .into_http_response(),
        ),
        Err(Error::KeyRefused(err)) => respond(
            Answer::KeyRefused,
            config.problem(StatusCode::BAD_REQUEST, "key-refused", "This idempotency key is not accepted")
                .detail(format!("The {} header's key was refused: {err}.", config.header))
                .into_http_response(),
        ),
        Err(Error::KeyBudgetExhausted { retry_after }) => respond(
            Answer::KeyBudgetExhausted,
            config.problem(
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-new-keys",
                "Too many new idempotency keys",
            )
            .detail("This client created more new idempotency keys than it may in a period; nothing was done. Retry after the time in Retry-After, or retry earlier requests with their own keys.")
            .retry_after(whole_seconds(retry_after))
            .into_http_response(),
        ),
        Err(Error::LeaseLost) => respond(
            Answer::LeaseLost,
            config.problem(StatusCode::CONFLICT, "taken-over", "This attempt lost its lease")
                .detail("Another attempt took this request over, or this one was cut off from the idempotency store until its lease ended; retry to get the request's response.")
                .retry_after(1)
                .into_http_response(),
        ),
        Err(Error::Unstorable { part: ValuePart::Result | ValuePart::Failure, reason: Unstorable::TooLarge { .. }, replayed: false, .. }) => match first() {
            Some(response) => respond(Answer::Executed, response),
            None => internal(Answer::Error, "The response was too large to store"),
        },
        Err(Error::Unstorable { part: ValuePart::Result | ValuePart::Failure, reason: Unstorable::TooLarge { .. }, replayed: true, .. }) => {
            // Stored by an earlier release, which kept a marker instead of the status.
            respond(
                Answer::Replayed,
                config.problem(StatusCode::INTERNAL_SERVER_ERROR, "response-not-stored", "The response was too large to keep")
                    .detail("The first request with this key was carried out and its response was sent to that request only. Nothing was done again.")
                    .into_http_response(),
            )
        }
        // The handler ran, but its response could not be stored: it still goes to this
        // client; the key stays held until its lease ends.
        Err(Error::Store(err)) => match first() {
            Some(response) => respond(Answer::Held, response),
            None => {
                tracing::warn!(error = %err, "the idempotency store is unavailable");
                respond(
                    Answer::Unavailable,
                    config.problem(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "store-unavailable",
                        "The idempotency store is unavailable",
                    )
                    .detail("Nothing was done. Retry with the same key after the time in Retry-After.")
                    .retry_after(1)
                    .into_http_response(),
                )
            }
        },
        Err(err) => {
            tracing::warn!(error = %err, "an idempotent request failed");
            internal(Answer::Error, "The idempotent request failed")
        }
    }
}

/// A stored response, sent again.
pub(crate) fn replay(bytes: Vec<u8>, replayed: bool, config: &Config) -> (Answer, Response<Body>) {
    let stored = match StoredResponse::decode_shared(bytes) {
        Ok(stored) => stored,
        Err(err) => {
            tracing::warn!(error = %err, "a stored response does not decode");
            return (
                Answer::Error,
                config
                    .problem(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        "The stored response is unreadable",
                    )
                    .into_http_response(),
            );
        }
    };
    let mut response = if stored.body_too_large {
        not_stored(stored.status, stored.headers, stored.trailers)
    } else {
        let mut response = Response::new(Body::replayed(stored.body, stored.trailers));
        *response.status_mut() = stored.status;
        *response.headers_mut() = stored.headers;
        response
    };
    if !replayed {
        return (Answer::Executed, response);
    }
    response
        .headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    if let Some(adjust) = &config.on_replay {
        adjust(&mut response);
    }
    (Answer::Replayed, response)
}

/// A replay of a response whose body was not stored: its status and headers, an empty
/// body, and a header saying so. The status stays: a payment that succeeded must not look
/// failed to the client that retries it.
pub(crate) fn not_stored(
    status: StatusCode,
    mut headers: HeaderMap,
    trailers: HeaderMap,
) -> Response<Body> {
    if crate::grpc::is_grpc(&headers) {
        return crate::grpc::not_stored(headers, &trailers);
    }
    for name in [
        header::CONTENT_TYPE,
        header::CONTENT_ENCODING,
        header::CONTENT_LANGUAGE,
    ] {
        headers.remove(&name);
    }
    headers.insert(BODY_NOT_STORED, HeaderValue::from_static("true"));
    // Records written before trailers went with the body may still hold some.
    let mut response = Response::new(Body::replayed(bytes::Bytes::new(), trailers));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

pub(crate) fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs_f64().ceil().max(1.0) as u64
}

pub(crate) fn missing_key(config: &Config) -> (Answer, Response<Body>) {
    (
        Answer::MissingKey,
        config.problem(StatusCode::BAD_REQUEST, "missing-key", "Idempotency key required")
            .detail(format!(
                "This request must carry the {} header: a unique value per operation, such as a UUID, sent again unchanged on every retry.",
                config.header
            ))
            .into_http_response(),
    )
}

pub(crate) fn malformed_key(config: &Config, err: &KeyHeaderError) -> (Answer, Response<Body>) {
    (
        Answer::MalformedKey,
        config
            .problem(
                StatusCode::BAD_REQUEST,
                "malformed-key",
                "Malformed idempotency key",
            )
            .detail(format!("The {} header is malformed: {err}.", config.header))
            .into_http_response(),
    )
}

pub(crate) fn invalid_key(config: &Config, err: &KeyError) -> (Answer, Response<Body>) {
    let part = match err {
        KeyError::Empty { part }
        | KeyError::TooLong { part, .. }
        | KeyError::ControlCharacter { part, .. } => *part,
        _ => KeyPart::Key,
    };
    if part == KeyPart::Scope {
        // The application's scope function broke the rules, not the client.
        tracing::warn!(error = %err, "the scope function returned an invalid scope");
        return (
            Answer::Error,
            config
                .problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "The request's scope is invalid",
                )
                .into_http_response(),
        );
    }
    malformed_key(config, &KeyHeaderError::Key(err.clone()))
}
