//! The middleware: one key per logical operation, the same on every try, and retries
//! only where the key (or the method) makes them safe.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use http::{Extensions, HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use reqwest::{Request, Response, ResponseBuilderExt};
use reqwest_middleware::{Middleware, Next};
use tokio::time::Instant;
use tower::retry::budget::{Budget, TpsBudget};
use tracing::Instrument;

use crate::answer::Attempts;
use crate::body;
use crate::error::ClientError;
use crate::key::{HeaderForm, IDEMPOTENCY_KEY, IdempotencyKey, short_hash};
use crate::policy::{RetryPolicy, retry_after};

/// The most bytes of a 409's body read to learn whether the first try still runs.
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
/// - **The answer** carries [`Attempts`] in its extensions: how many tries it took,
///   whether it was a replay (`Idempotent-Replayed: true`), and the key.
/// - **A stream body** (a `multipart::Form`, `Body::wrap_stream`) of a request that could
///   be retried is read into memory first, up to
///   [`IdempotencyMiddleware::buffer_streams`] (1 MiB unless told), so that every try
///   sends the same bytes under one key; a longer one is refused before anything is sent.
/// - **A retry budget** shared by the middleware's clones bounds the retries across
///   operations ([`IdempotencyMiddleware::retry_budget`]): in an outage the tries do not
///   multiply the load.
/// - **Errors keep the key.** A keyed operation that ends without an answer comes back as
///   [`ClientError::Unanswered`] (or [`ClientError::DeadlineExceeded`]) with its key, the
///   last try's error as the source (`last`: a connection error is there, not in
///   `reqwest_middleware::Error::is_connect`); [`key_of`](crate::key_of) finds it. The
///   answer's [`Attempts`] holds it too: keep it before reading the body, whose cut
///   mid-way only a retry with that key can mend. Retry with the same [`HeaderForm`] the
///   key first went in: a server that keeps the quotes sees `"k"` and `k` as two keys.
/// - Each try is a `tracing` span `idem.client.attempt` with a short hash of the key (the
///   one the key's `Debug` shows), never the key.
///
/// Use it for servers that honour `Idempotency-Key` (idem-http, Stripe-style APIs): a
/// server that ignores the header runs a retried `POST` twice, so keep a plain client for
/// those.
///
/// # Composing with other middlewares
///
/// reqwest-middleware runs middlewares in the order they are added, the first outermost.
///
/// - **A retry middleware** (reqwest-retry's `RetryTransientMiddleware`): drop it, this
///   middleware does its job. If you keep it, either order keeps one key per `send`, but
///   neither order makes its retries follow this middleware's rules: added after this one
///   (inside), its retries go straight to the network; added before (outside), it calls
///   this middleware again for each of its retries. Its default strategy retries a 500,
///   which idem-http holds for a lease (the effect may have happened): those retries get
///   409 in flight, this middleware polls them, and once the lease ends a retry takes the
///   key over and the handler runs again. Give it a strategy that never retries a 5xx, or
///   drop it. Outside, it also sees this middleware's errors as
///   `reqwest_middleware::Error::Middleware` (below), which it does not retry. One
///   `http::Extensions` is one operation: passing the same one to
///   `execute_with_extensions` for two requests sends both under one key.
/// - **Auth, signing and tracing** middlewares that set headers: inside this one, so each
///   try is signed afresh (a timestamped signature) and traced as its own request; the
///   key header is set before they run and they see it.
/// - **A timeout of your own around `send`**, or an application's retry around it: an
///   automatic key lives for one `send`, so such retries need an [`IdempotencyKey`] of
///   your own, kept with the operation. reqwest's own `timeout` bounds each try; the
///   policy's deadline and per-try timeout bound the whole.
/// - A key given as an extension wins over an `Idempotency-Key` header set as well; a
///   header set by hand is sent as it is.
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
/// let attempts = response.extensions().get::<Attempts>().cloned();
/// println!("{} after {attempts:?}", response.status());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct IdempotencyMiddleware {
    policy: RetryPolicy,
    automatic_keys: bool,
    form: HeaderForm,
    buffer_limit: usize,
    budget: Option<Arc<dyn Budget + Send + Sync>>,
}

impl fmt::Debug for IdempotencyMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyMiddleware")
            .field("policy", &self.policy)
            .field("automatic_keys", &self.automatic_keys)
            .field("form", &self.form)
            .field("buffer_limit", &self.buffer_limit)
            .field("budget", &self.budget.is_some())
            .finish()
    }
}

impl Default for IdempotencyMiddleware {
    fn default() -> Self {
        Self::new()
    }
}

/// How many bytes of a stream body are buffered by default to send it again: 1 MiB.
pub const DEFAULT_BUFFER_LIMIT: usize = 1024 * 1024;

impl IdempotencyMiddleware {
    /// The middleware with [`RetryPolicy::default`], automatic keys for `POST` and
    /// `PATCH`, quoted keys, stream bodies buffered up to [`DEFAULT_BUFFER_LIMIT`], and a
    /// retry budget of its own (tower's default [`TpsBudget`]: retries beyond 10 a second
    /// are allowed only up to a fifth of the operations sent in the last 10 s), shared by
    /// its clones.
    pub fn new() -> Self {
        Self {
            policy: RetryPolicy::default(),
            automatic_keys: true,
            form: HeaderForm::Quoted,
            buffer_limit: DEFAULT_BUFFER_LIMIT,
            budget: Some(Arc::new(TpsBudget::default())),
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

    /// How keys are written in the header ([`HeaderForm::Quoted`] unless told). A header
    /// the caller set by hand is sent as it is.
    ///
    /// ```
    /// use idem_client::{HeaderForm, IdempotencyMiddleware};
    ///
    /// // A Stripe-style API that takes the header's bytes as the key.
    /// let middleware = IdempotencyMiddleware::new().header_form(HeaderForm::Bare);
    /// # let _ = middleware;
    /// ```
    #[must_use]
    pub fn header_form(mut self, form: HeaderForm) -> Self {
        self.form = form;
        self
    }

    /// The most bytes of a stream body (a `multipart::Form`, `Body::wrap_stream`) read
    /// into memory before the first try, so that every try sends the same bytes (one
    /// multipart boundary) under one key. A longer body is refused with
    /// [`ClientError::BodyTooLarge`] before anything is sent; 0 refuses every stream
    /// body of a request that could be retried ([`ClientError::BodyNotReplayable`]).
    ///
    /// ```
    /// use idem_client::IdempotencyMiddleware;
    ///
    /// // Uploads of up to 16 MiB, sent again whole on a retry.
    /// let middleware = IdempotencyMiddleware::new().buffer_streams(16 * 1024 * 1024);
    /// # let _ = middleware;
    /// ```
    #[must_use]
    pub fn buffer_streams(mut self, limit: usize) -> Self {
        self.buffer_limit = limit;
        self
    }

    /// The budget retries draw from, shared by every operation this middleware (and its
    /// clones) sends: each operation deposits, each retry withdraws, and a retry the
    /// budget refuses is not made (the last answer or error is returned). An outage then
    /// adds a bounded share of load instead of multiplying it by the tries. Polls of a
    /// request in flight draw nothing. Share one budget across clients with an `Arc`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_client::IdempotencyMiddleware;
    /// use tower::retry::budget::TpsBudget;
    ///
    /// // Over 10 s: 2 retries a second, plus one retry per ten operations.
    /// let budget = TpsBudget::new(Duration::from_secs(10), 2, 0.1);
    /// let middleware = IdempotencyMiddleware::new().retry_budget(budget);
    /// # let _ = middleware;
    /// ```
    #[must_use]
    pub fn retry_budget(mut self, budget: impl Budget + Send + Sync + 'static) -> Self {
        self.budget = Some(Arc::new(budget));
        self
    }

    /// No budget: every operation may use all of its policy's tries.
    ///
    /// ```
    /// use idem_client::IdempotencyMiddleware;
    ///
    /// // A batch job whose few operations must each get all their tries.
    /// let middleware = IdempotencyMiddleware::new().without_retry_budget();
    /// # let _ = middleware;
    /// ```
    #[must_use]
    pub fn without_retry_budget(mut self) -> Self {
        self.budget = None;
        self
    }

    /// The key `request` goes with, and whether the middleware writes it in the header
    /// (`false` for a header the caller set, sent as it is).
    ///
    /// A new key is kept in the `send`'s extensions, which every middleware of the stack
    /// shares for the whole `send`: a retry middleware outside this one (reqwest-retry's,
    /// the natural order when adding idem-client to a stack) that calls it again gets the
    /// same key, not a new operation.
    fn key_of(
        &self,
        request: &Request,
        extensions: &mut Extensions,
    ) -> (Option<IdempotencyKey>, bool) {
        if let Some(key) = extensions.get::<IdempotencyKey>() {
            return (Some(key.clone()), true);
        }
        if let Some(value) = request.headers().get(IDEMPOTENCY_KEY) {
            return (IdempotencyKey::from_header(value.as_bytes()), false);
        }
        let needs_one = *request.method() == Method::POST || *request.method() == Method::PATCH;
        if !(self.automatic_keys && needs_one) {
            return (None, false);
        }
        let key = IdempotencyKey::random();
        extensions.insert(key.clone());
        (Some(key), true)
    }

    fn header_value(&self, key: &IdempotencyKey) -> Result<HeaderValue, ClientError> {
        let value = match self.form {
            HeaderForm::Bare => key
                .bare_header_value()
                .ok_or(ClientError::KeyNotAToken)?
                .to_owned(),
            _ => key.header_value(),
        };
        HeaderValue::from_str(&value).map_err(|_| ClientError::BadHeader)
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
        let (key, write_header) = self.key_of(&request, extensions);
        if let (Some(key), true) = (&key, write_header) {
            let value = self
                .header_value(key)
                .map_err(reqwest_middleware::Error::middleware)?;
            request.headers_mut().insert(IDEMPOTENCY_KEY, value);
        }
        let keyed = key.is_some() || request.headers().contains_key(IDEMPOTENCY_KEY);
        let retryable = keyed || is_idempotent(request.method());
        if retryable {
            body::make_replayable(&mut request, self.buffer_limit)
                .await
                .map_err(reqwest_middleware::Error::middleware)?;
        }
        let ended = Ended {
            key: key.clone(),
            retryable,
        };
        let short = short_of(key.as_ref(), &request);
        if let Some(budget) = &self.budget {
            budget.deposit();
        }
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
            // Each try ends by its own timeout and by the deadline: a server that accepts
            // and never answers (or stalls a 409's body) does not hold the caller longer
            // than the policy says.
            let left = deadline.saturating_duration_since(Instant::now());
            // A try no retry can follow (a request sent once, the policy's last try) is
            // bounded by the deadline alone: cutting it sooner would leave no answer.
            let per_try = match retryable && counted + 1 < self.policy.attempts() {
                true => self.policy.per_try().min(left),
                false => left,
            };
            let backoff = self.policy.backoff_after(attempt);
            let one_try = async {
                let result = next.clone().run(this_try, extensions).await;
                classify(result, &self.policy, backoff, keyed).await
            }
            .instrument(span);
            let tried = match tokio::time::timeout(per_try, one_try).await {
                Ok(tried) => tried,
                Err(_) if Instant::now() >= deadline => {
                    return Err(reqwest_middleware::Error::middleware(
                        ClientError::DeadlineExceeded {
                            attempts: attempt,
                            key,
                        },
                    ));
                }
                // The request may have reached the server, as after a timeout of the
                // connection's own.
                Err(_) => Tried::Again {
                    last: Err(reqwest_middleware::Error::middleware(
                        ClientError::AttemptTimedOut {
                            after: self.policy.per_try(),
                        },
                    )),
                    wait: None,
                },
            };
            let (last, wait, in_flight) = match tried {
                Tried::Answer(response) => return Ok(ended.answer(response, attempt)),
                Tried::Final(err) => return Err(ended.error(err, attempt)),
                Tried::Again { last, wait } => (last, wait, false),
                Tried::InFlight { last, wait } => (last, Some(wait), true),
            };
            if !in_flight {
                counted += 1;
            }
            if !retryable || counted >= self.policy.attempts() {
                return ended.last(last, attempt);
            }
            // Never back to back: a zero `Retry-After`, a date already past or a zero
            // backoff still leave a moment between tries.
            let pause = wait
                .unwrap_or_else(|| self.policy.backoff_after(attempt))
                .max(MIN_PAUSE);
            let left = deadline.saturating_duration_since(Instant::now());
            if pause >= left {
                tracing::debug!(attempt, key = %short, "the deadline leaves no time for another try");
                return ended.last(last, attempt);
            }
            if !in_flight
                && self
                    .budget
                    .as_ref()
                    .is_some_and(|budget| !budget.withdraw())
            {
                tracing::debug!(attempt, key = %short, "the retry budget is spent: no retry");
                return ended.last(last, attempt);
            }
            tracing::debug!(attempt, key = %short, pause_ms = pause.as_millis() as u64, "trying again");
            drop(last);
            tokio::time::sleep(pause).await;
        }
    }
}

/// How an operation's answer or error is handed back: with its key.
struct Ended {
    key: Option<IdempotencyKey>,
    retryable: bool,
}

impl Ended {
    fn answer(&self, mut response: Response, attempts: u32) -> Response {
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true"));
        response.extensions_mut().insert(Attempts {
            attempts,
            replayed,
            key: self.key.clone(),
        });
        response
    }

    fn last(
        &self,
        last: reqwest_middleware::Result<Response>,
        attempts: u32,
    ) -> reqwest_middleware::Result<Response> {
        match last {
            Ok(response) => Ok(self.answer(response, attempts)),
            Err(err) => Err(self.error(err, attempts)),
        }
    }

    /// A keyed operation's error carries its key ([`ClientError::Unanswered`]), unless the
    /// request was never sent (a builder error) or the error is one of ours already.
    fn error(&self, err: reqwest_middleware::Error, attempts: u32) -> reqwest_middleware::Error {
        let Some(key) = self.key.clone().filter(|_| self.retryable) else {
            return err;
        };
        let ours = match &err {
            reqwest_middleware::Error::Reqwest(err) => err.is_builder(),
            reqwest_middleware::Error::Middleware(err) => err
                .downcast_ref::<ClientError>()
                .is_some_and(|err| err.key().is_some()),
        };
        if ours {
            return err;
        }
        reqwest_middleware::Error::middleware(ClientError::Unanswered {
            attempts,
            key,
            last: Box::new(err),
        })
    }
}

/// The shortest wait between two tries.
const MIN_PAUSE: Duration = Duration::from_millis(10);

/// What logs show of the request's key: its keyed short hash (the one
/// [`IdempotencyKey`]'s `Debug` shows), or `-` without a key.
fn short_of(key: Option<&IdempotencyKey>, request: &Request) -> String {
    match (key, request.headers().get(IDEMPOTENCY_KEY)) {
        (Some(key), _) => key.short_hash().to_string(),
        (None, Some(value)) => short_hash(value.as_bytes()).to_string(),
        (None, None) => "-".to_owned(),
    }
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
    keyed: bool,
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
    let asked = retry_after(response.headers(), SystemTime::now());
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
            wait: asked.map(|asked| policy.jittered(asked)),
        },
        StatusCode::CONFLICT => {
            // The server's `Retry-After` here is when the first try's lease ends, and its
            // answer may come any moment before: poll with backoff, never later.
            let poll = asked.map_or(backoff, |asked| asked.min(backoff));
            if keyed && policy.every_conflict() {
                return Tried::InFlight {
                    last: Ok(response),
                    wait: poll,
                };
            }
            if !is_json(&response) {
                return Tried::Answer(response);
            }
            match read_conflict(response).await {
                // idem-http's word that the key is held until its lease ends, after an
                // answer that was not kept: nothing changes before `Retry-After`.
                Ok((response, Some(body)))
                    if policy.says_in_flight(&body)
                        && body.get("held") == Some(&serde_json::Value::Bool(true))
                        && asked.is_some() =>
                {
                    Tried::InFlight {
                        last: Ok(response),
                        wait: asked.map_or(poll, |asked| policy.jittered(asked)),
                    }
                }
                Ok((response, Some(body))) if policy.says_in_flight(&body) => Tried::InFlight {
                    last: Ok(response),
                    wait: poll,
                },
                Ok((response, _)) => Tried::Answer(response),
                // The answer broke off while its body was read: as a cut connection.
                Err(err) => Tried::Again {
                    last: Err(err.into()),
                    wait: None,
                },
            }
        }
        _ => Tried::Answer(response),
    }
}

/// Whether the answer is JSON (`application/json`, `application/problem+json`, any
/// `+json`).
fn is_json(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(|essence| essence.trim().to_ascii_lowercase())
        .is_some_and(|essence| essence == "application/json" || essence.ends_with("+json"))
}

/// A 409's JSON body, and the response rebuilt around it. A body over
/// [`MAX_PROBLEM_BYTES`] is no in-flight answer of a server's: it is handed back whole,
/// the bytes read first, then the rest as it comes.
async fn read_conflict(
    response: Response,
) -> Result<(Response, Option<serde_json::Value>), reqwest::Error> {
    let url = response.url().clone();
    let (parts, mut body) = http::Response::<reqwest::Body>::from(response).into_parts();
    let mut read = Vec::new();
    let mut ended = false;
    while read.len() <= MAX_PROBLEM_BYTES {
        match body.frame().await {
            None => {
                ended = true;
                break;
            }
            Some(frame) => {
                if let Ok(data) = frame?.into_data() {
                    read.extend_from_slice(&data);
                }
            }
        }
    }
    let read = Bytes::from(read);
    let (parsed, rebuilt) = if ended {
        let parsed = serde_json::from_slice::<serde_json::Value>(&read).ok();
        (parsed, reqwest::Body::from(read))
    } else {
        (None, reqwest::Body::wrap(body::Prefixed::new(read, body)))
    };
    let mut rebuilt = http::Response::from_parts(parts, rebuilt);
    // The URL travels as reqwest's own extension, set through its builder.
    let with_url = http::Response::builder()
        .url(url)
        .body(())
        .map(|r| r.into_parts().0);
    if let Ok(with_url) = with_url {
        rebuilt.extensions_mut().extend(with_url.extensions);
    }
    Ok((Response::from(rebuilt), parsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_hash_the_key_as_its_debug_does_whatever_form_it_came_in() {
        let key = IdempotencyKey::new("order-1187").unwrap();
        let middleware = IdempotencyMiddleware::new();
        for header in ["\"order-1187\"", "order-1187"] {
            let mut request = Request::new(Method::POST, "http://127.0.0.1/pay".parse().unwrap());
            request
                .headers_mut()
                .insert(IDEMPOTENCY_KEY, HeaderValue::from_static(header));
            let (found, write) = middleware.key_of(&request, &mut Extensions::new());
            assert_eq!(found.as_ref(), Some(&key), "{header}");
            assert!(!write, "a header set by hand is sent as it is");
            let short = short_of(found.as_ref(), &request);
            assert_eq!(short, key.short_hash().to_string(), "{header}");
            assert!(format!("{key:?}").contains(&short));
        }
    }
}
