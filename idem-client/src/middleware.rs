//! The middleware: one key per logical operation, the same on every try, and retries
//! only where the key (or the method) makes them safe.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use http::{Extensions, HeaderValue, Method, StatusCode, header};
use reqwest::{Request, Response, ResponseBuilderExt};
use reqwest_middleware::{Middleware, Next};
use tokio::time::Instant;
use tracing::Instrument;

use crate::answer::Attempts;
use crate::error::ClientError;
use crate::key::{IDEMPOTENCY_KEY, IdempotencyKey, short_hash};
use crate::policy::{RetryPolicy, retry_after};

/// The most bytes of a 409's problem document read to learn its type.
const MAX_PROBLEM_BYTES: usize = 64 * 1024;

/// Sends each logical operation with one `Idempotency-Key` and retries it safely.
///
/// - **The key.** A request's [`IdempotencyKey`] extension, or the `Idempotency-Key`
///   header the caller set; otherwise, for `POST` and `PATCH`, a fresh UUIDv4 per call of
///   `send` (unless [`IdempotencyMiddleware::without_automatic_keys`]). The same key goes
///   on every try of that call, including the tries of a retry middleware placed around
///   this one: the key is kept in the `send`'s extensions.
/// - **What is retried.** A connection error or timeout (the request may have reached the
///   server: that is what the key is for), a 409 whose problem type says the first try is
///   still running, 429 and 503 (not served), and 408, 502 and 504 (a gateway or the
///   server saying the request may have reached it and its answer did not come back).
///   Never a 400, a 422 (the key was used for another request: a bug to surface, with
///   the server's problem) or any other answer. Not 500 either: the server ran the
///   request and answered that it failed; idem-http holds such a key for a lease (the
///   effect may have happened), so a retry would only poll, then run a failed handler
///   again. Retry a 500 yourself, later, with the same key, when you know the handler.
/// - **Only when safe.** A request with a key, or with an idempotent method (`GET`,
///   `HEAD`, `PUT`, `DELETE`, `OPTIONS`, `TRACE`). Any other is sent once.
/// - **When.** See [`RetryPolicy`]: `Retry-After` when the server sent one, else
///   exponential backoff with jitter, all within a total deadline. For a request still in
///   flight the server's `Retry-After` is when its lease ends; the first try's answer may
///   come sooner, so the backoff polls for it, never later than that.
/// - **The answer** carries [`Attempts`] in its extensions: how many tries it took and
///   whether it was a replay (`Idempotent-Replayed: true`).
/// - A body that cannot be sent twice (a stream) is refused before anything is sent,
///   with [`ClientError::BodyNotReplayable`], when the request could be retried.
/// - Each try is a `tracing` span `idem.client.attempt` with a short hash of the key,
///   never the key.
///
/// Use it for servers that honour `Idempotency-Key` (idem-http, Stripe-style APIs): a
/// server that ignores the header runs a retried `POST` twice, so keep a plain client for
/// those.
///
/// **With a retry middleware** (reqwest-retry's `RetryTransientMiddleware`): either order
/// keeps one key per `send`. Inside this one (added after it) is the order to prefer: its
/// tries then go through this middleware's rules. Outside it, it also retries what this
/// middleware deliberately answers, a 500 above all: idem-http holds a key whose handler
/// answered 500 for a lease, so those tries poll it, and once the lease ends the handler
/// runs again. One `http::Extensions` is one operation: passing the same one to
/// `execute_with_extensions` for two requests sends both under one key.
///
/// An automatic key lives for one `send`: retries of your own around `send` (an
/// application's retry, a timeout around the call) need an [`IdempotencyKey`] of your own,
/// kept with the operation. A key given as an extension wins over an `Idempotency-Key`
/// header set as well.
///
/// ```no_run
/// use idem_client::{Attempts, IdempotencyKey, IdempotencyMiddleware};
///
/// # async fn pay() -> Result<(), Box<dyn std::error::Error>> {
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(IdempotencyMiddleware::new())
///     .build();
/// // One key per logical operation, made when the user acts, kept with the order.
/// let key = IdempotencyKey::new("order-1187")?;
/// let response = client
///     .post("http://127.0.0.1:3000/payments")
///     .with_extension(key)
///     .body(r#"{"amount":500}"#)
///     .send()
///     .await?;
/// let attempts = response.extensions().get::<Attempts>().copied();
/// println!("{} after {attempts:?}", response.status());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct IdempotencyMiddleware {
    policy: RetryPolicy,
    automatic_keys: bool,
}

impl Default for IdempotencyMiddleware {
    fn default() -> Self {
        Self::new()
    }
}

impl IdempotencyMiddleware {
    /// The middleware with [`RetryPolicy::default`] and automatic keys for `POST` and
    /// `PATCH`.
    pub fn new() -> Self {
        Self {
            policy: RetryPolicy::default(),
            automatic_keys: true,
        }
    }

    /// The same middleware with `policy`.
    #[must_use]
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// No key unless the caller gives one: a `POST` or `PATCH` without a key is then sent
    /// once and never retried.
    #[must_use]
    pub fn without_automatic_keys(mut self) -> Self {
        self.automatic_keys = false;
        self
    }

    /// The key `request` goes with: the caller's, or a new one where the method needs it.
    ///
    /// A new key is kept in the `send`'s extensions, which every middleware of the stack
    /// shares for the whole `send`: a retry middleware outside this one (reqwest-retry's,
    /// the natural order when adding idem-client to a stack) that calls it again gets the
    /// same key, not a new operation.
    fn key_of(&self, request: &Request, extensions: &mut Extensions) -> Option<IdempotencyKey> {
        if let Some(key) = extensions.get::<IdempotencyKey>() {
            return Some(key.clone());
        }
        if request.headers().contains_key(IDEMPOTENCY_KEY) {
            return None;
        }
        let needs_one = *request.method() == Method::POST || *request.method() == Method::PATCH;
        let key = (self.automatic_keys && needs_one).then(IdempotencyKey::random)?;
        extensions.insert(key.clone());
        Some(key)
    }
}

/// What one try came to.
enum Tried {
    /// An answer to hand back as it is.
    Answer(Response),
    /// An error no other try would mend.
    Final(reqwest_middleware::Error),
    /// The first try of this key still runs on the server: poll again after `wait`.
    InFlight {
        last: reqwest_middleware::Result<Response>,
        wait: Duration,
    },
    /// Worth another try, after the server's `Retry-After` if it sent one.
    Again {
        /// The answer to hand back if no try is left.
        last: reqwest_middleware::Result<Response>,
        wait: Option<Duration>,
    },
}

#[async_trait]
impl Middleware for IdempotencyMiddleware {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let key = self.key_of(&request, extensions);
        if let Some(key) = &key {
            let value = HeaderValue::from_str(&key.header_value())
                .map_err(|_| reqwest_middleware::Error::middleware(ClientError::BadHeader))?;
            request.headers_mut().insert(IDEMPOTENCY_KEY, value);
        }
        let keyed = key.is_some() || request.headers().contains_key(IDEMPOTENCY_KEY);
        let retryable = keyed || is_idempotent(request.method());
        if retryable && request.try_clone().is_none() {
            return Err(reqwest_middleware::Error::middleware(
                ClientError::BodyNotReplayable,
            ));
        }
        let short = short_of(&request);
        let started = Instant::now();
        let deadline = started + self.policy.total();
        let mut request = Some(request);
        let mut attempt = 0u32;
        // Tries that count toward the policy's most: polls of a request in flight do not.
        let mut counted = 0u32;
        loop {
            attempt += 1;
            // A request that may be retried goes as a copy, so that another try can follow.
            let this_try = if retryable {
                request.as_ref().and_then(Request::try_clone)
            } else {
                request.take()
            }
            .ok_or_else(|| reqwest_middleware::Error::middleware(ClientError::BodyNotReplayable))?;
            let span = tracing::debug_span!("idem.client.attempt", attempt, key = %short);
            // Each try ends by the deadline: a server that accepts and never answers does
            // not hold the caller longer than the policy says.
            let left = deadline.saturating_duration_since(Instant::now());
            let sent = next.clone().run(this_try, extensions).instrument(span);
            let result = match tokio::time::timeout(left, sent).await {
                Ok(result) => result,
                Err(_) => Err(reqwest_middleware::Error::middleware(
                    ClientError::DeadlineExceeded { attempts: attempt },
                )),
            };
            let tried = classify(result, &self.policy, self.policy.backoff_after(attempt)).await;
            let (last, wait, in_flight) = match tried {
                Tried::Answer(response) => return Ok(with_attempts(response, attempt)),
                Tried::Final(err) => return Err(err),
                Tried::Again { last, wait } => (last, wait, false),
                Tried::InFlight { last, wait } => (last, Some(wait), true),
            };
            if !in_flight {
                counted += 1;
            }
            if !retryable || counted >= self.policy.attempts() {
                return last.map(|response| with_attempts(response, attempt));
            }
            // Never back to back: a zero `Retry-After`, a date already past or a zero
            // backoff still leave a moment between tries.
            let pause = wait
                .unwrap_or_else(|| self.policy.backoff_after(attempt))
                .max(MIN_PAUSE);
            let left = deadline.saturating_duration_since(Instant::now());
            if pause >= left {
                tracing::debug!(attempt, key = %short, "the deadline leaves no time for another try");
                return last.map(|response| with_attempts(response, attempt));
            }
            tracing::debug!(attempt, key = %short, pause_ms = pause.as_millis() as u64, "trying again");
            drop(last);
            tokio::time::sleep(pause).await;
        }
    }
}

/// The shortest wait between two tries.
const MIN_PAUSE: Duration = Duration::from_millis(10);

/// What logs show of the request's key: a keyed short hash, or `-` without a key.
fn short_of(request: &Request) -> String {
    request.headers().get(IDEMPOTENCY_KEY).map_or_else(
        || "-".to_owned(),
        |value| short_hash(value.as_bytes()).to_string(),
    )
}

/// Whether `method` is idempotent by its definition (RFC 9110 §9.2.2).
fn is_idempotent(method: &Method) -> bool {
    [
        Method::GET,
        Method::HEAD,
        Method::PUT,
        Method::DELETE,
        Method::OPTIONS,
        Method::TRACE,
    ]
    .contains(method)
}

/// Whether one try's result is an answer or worth another try.
async fn classify(
    result: reqwest_middleware::Result<Response>,
    policy: &RetryPolicy,
    backoff: Duration,
) -> Tried {
    let response = match result {
        Ok(response) => response,
        Err(reqwest_middleware::Error::Reqwest(err))
            if err.is_timeout() || err.is_connect() || err.is_request() =>
        {
            // The request may have reached the server; its key makes sending it again safe.
            return Tried::Again {
                last: Err(err.into()),
                wait: None,
            };
        }
        // A builder, redirect or decode error, or an inner middleware's: trying again
        // would not help.
        Err(err) => return Tried::Final(err),
    };
    let wait = retry_after(response.headers(), SystemTime::now());
    match response.status() {
        // Not served (429, 503), or a gateway's or the server's own word that the request
        // may have reached the server and its answer did not come back (408, 502, 504):
        // the key makes sending it again safe.
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::REQUEST_TIMEOUT
        | StatusCode::BAD_GATEWAY
        | StatusCode::GATEWAY_TIMEOUT => Tried::Again {
            last: Ok(response),
            wait,
        },
        StatusCode::CONFLICT if is_problem(&response) => match problem_type(response).await {
            // The server's `Retry-After` here is when the first try's lease ends, and its
            // answer may come any moment before: poll with backoff, never later.
            Ok((response, Some(kind))) if policy.is_in_flight_type(&kind) => Tried::InFlight {
                last: Ok(response),
                wait: wait.map_or(backoff, |wait| wait.min(backoff)),
            },
            Ok((response, _)) => Tried::Answer(response),
            // The answer broke off while its problem was read: as a cut connection.
            Err(err) => Tried::Again {
                last: Err(err),
                wait: None,
            },
        },
        _ => Tried::Answer(response),
    }
}

fn is_problem(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.contains("problem+json"))
}

/// The problem document's `type`, and the response rebuilt around the bytes read (at
/// most [`MAX_PROBLEM_BYTES`]; a larger 409 is no problem document of a server's).
async fn problem_type(
    mut response: Response,
) -> reqwest_middleware::Result<(Response, Option<String>)> {
    let status = response.status();
    let version = response.version();
    let headers = response.headers().clone();
    let extensions = response.extensions().clone();
    let url = response.url().clone();
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        bytes.extend_from_slice(&chunk);
        if bytes.len() > MAX_PROBLEM_BYTES {
            return Err(reqwest_middleware::Error::middleware(
                ClientError::ConflictTooLarge,
            ));
        }
    }
    let problem_type = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|problem| problem.get("type")?.as_str().map(str::to_owned));
    let mut rebuilt = http::Response::new(bytes);
    *rebuilt.status_mut() = status;
    *rebuilt.version_mut() = version;
    *rebuilt.headers_mut() = headers;
    *rebuilt.extensions_mut() = extensions;
    // The URL travels as reqwest's own extension, set through its builder.
    let with_url = http::Response::builder()
        .url(url)
        .body(())
        .map(|r| r.into_parts().0);
    if let Ok(parts) = with_url {
        rebuilt.extensions_mut().extend(parts.extensions);
    }
    Ok((Response::from(rebuilt), problem_type))
}

fn with_attempts(mut response: Response, attempts: u32) -> Response {
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true"));
    response
        .extensions_mut()
        .insert(Attempts { attempts, replayed });
    response
}
