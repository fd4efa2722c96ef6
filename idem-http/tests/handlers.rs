//! Handlers behind the layer, called in process with tower's `oneshot` on the memory
//! store: scopes built from the principal an authentication layer verified (and what the
//! old `"anonymous"` fallback did instead), the `Idempotent` extractor, problems as axum
//! responses, what a handler answers for a failed step, and a takeover resuming after a
//! crash mid-handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use http::{HeaderMap, Method, StatusCode};
use http_body_util::BodyExt;
use idem_core::admin::ListQuery;
use idem_core::{Admin, Idempotency, ManualClock, MemoryStore, WorkError};
use idem_http::{Disposition, IdempotencyLayer, Idempotent, KeyRequirement, Problem, scope};
use tower::ServiceExt;

/// What a test sees of a response.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    fn problem_type(&self) -> String {
        let problem: serde_json::Value = serde_json::from_str(&self.body).unwrap();
        problem["type"].as_str().unwrap().to_owned()
    }
}

async fn send(app: &Router, key: Option<&str>, headers: &[(&str, &str)], body: &str) -> Answer {
    send_to(app, Method::POST, "/payments", key, headers, body).await
}

async fn send_to(
    app: &Router,
    method: Method,
    path: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Body::from(body.to_owned())).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

fn idem() -> Idempotency {
    Idempotency::builder(MemoryStore::new())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
        .into_dyn()
}

/// The verified caller.
#[derive(Clone, Debug)]
struct User(String);

/// A test authentication: `x-user` names the caller.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let user = request
        .headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(|v| User(v.to_owned()));
    if let Some(user) = user {
        request.extensions_mut().insert(user);
    }
    next.run(request).await
}

/// Charges the caller; counts its runs.
async fn charge(State(runs): State<Arc<AtomicUsize>>, request: Request) -> String {
    runs.fetch_add(1, Ordering::SeqCst);
    let user = request
        .extensions()
        .get::<User>()
        .map_or("nobody", |u| &u.0);
    format!("charged {user}")
}

/// The scope every example used before the helpers: the principal, or a shared fallback.
fn old_fallback_scope(parts: &http::request::Parts) -> Result<String, idem_http::Refusal> {
    let user = parts
        .extensions
        .get::<User>()
        .map_or("anonymous", |u| u.0.as_str());
    Ok(format!(
        "{user}/{} {}",
        parts.method,
        idem_http::scope::path(parts)
    ))
}

type Scope = fn(&http::request::Parts) -> Result<String, idem_http::Refusal>;

fn by_user(parts: &http::request::Parts) -> Result<String, idem_http::Refusal> {
    scope::by_principal(|user: &User| user.0.clone())(parts)
}

/// The authentication layer outside the idempotency layer: the right order.
fn auth_outside(scope: Scope, runs: Arc<AtomicUsize>) -> Router {
    Router::new()
        .route("/payments", post(charge))
        .layer(IdempotencyLayer::new(idem(), scope))
        .layer(middleware::from_fn(authenticate))
        .with_state(runs)
}

/// The authentication layer inside the idempotency layer: the wrong order.
fn auth_inside(scope: Scope, runs: Arc<AtomicUsize>) -> Router {
    Router::new()
        .route("/payments", post(charge))
        .layer(middleware::from_fn(authenticate))
        .layer(IdempotencyLayer::new(idem(), scope))
        .with_state(runs)
}

#[tokio::test]
async fn with_the_auth_layer_outside_two_users_with_one_key_never_meet() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = auth_outside(by_user, runs.clone());
    let alice = send(&app, Some("k-1"), &[("x-user", "alice")], "{}").await;
    let bob = send(&app, Some("k-1"), &[("x-user", "bob")], "{}").await;
    assert_eq!((alice.status, bob.status), (StatusCode::OK, StatusCode::OK));
    assert_eq!(alice.body, "charged alice");
    assert_eq!(bob.body, "charged bob");
    assert!(!bob.replayed());
    // Each user's retry replays that user's own response.
    let alice_again = send(&app, Some("k-1"), &[("x-user", "alice")], "{}").await;
    assert!(alice_again.replayed());
    assert_eq!(alice_again.body, "charged alice");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // Without a user: 401, and the handler does not run.
    let nobody = send(&app, Some("k-1"), &[], "{}").await;
    assert_eq!(nobody.status, StatusCode::UNAUTHORIZED);
    assert_eq!(nobody.problem_type(), "tag:idem-http,2026:unauthenticated");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn with_the_auth_layer_inside_the_helper_refuses_and_the_handler_never_runs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = auth_inside(by_user, runs.clone());
    for user in ["alice", "bob"] {
        let answer = send(&app, Some("k-1"), &[("x-user", user)], "{}").await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{}", answer.body);
        assert_eq!(answer.headers["content-type"], "application/problem+json");
        assert_eq!(answer.problem_type(), "tag:idem-http,2026:unauthenticated");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// The contrast: the same wrong order with the old fallback puts every caller in the
/// `anonymous` scope, and Bob is answered Alice's payment.
#[tokio::test]
async fn with_the_auth_layer_inside_the_old_fallback_replays_one_users_payment_to_another() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = auth_inside(old_fallback_scope, runs.clone());
    let alice = send(&app, Some("k-1"), &[("x-user", "alice")], "{}").await;
    let bob = send(&app, Some("k-1"), &[("x-user", "bob")], "{}").await;
    assert_eq!(alice.body, "charged alice");
    assert_eq!(bob.body, "charged alice", "Bob gets Alice's response");
    assert!(bob.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1, "Bob's payment never ran");
}

/// An API key sent on every request.
#[derive(Clone, Debug)]
struct ApiKey(String);

async fn authenticate_api_key(mut request: Request, next: Next) -> Response {
    let key = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|v| ApiKey(v.to_owned()));
    if let Some(key) = key {
        request.extensions_mut().insert(key);
    }
    next.run(request).await
}

#[tokio::test]
async fn a_1kb_bearer_token_through_hashed_works_and_is_not_stored() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/payments", post(charge))
        .layer(IdempotencyLayer::new(
            Idempotency::new(store.clone()),
            scope::by_principal(|key: &ApiKey| scope::hashed(&key.0)),
        ))
        .layer(middleware::from_fn(authenticate_api_key))
        .with_state(runs.clone());
    let token = format!("sk_live_{}", "x".repeat(1024));
    let authorization = format!("Bearer {token}");
    let first = send(
        &app,
        Some("k-1"),
        &[("authorization", &authorization)],
        "{}",
    )
    .await;
    let retry = send(
        &app,
        Some("k-1"),
        &[("authorization", &authorization)],
        "{}",
    )
    .await;
    assert_eq!(
        (first.status, retry.status),
        (StatusCode::OK, StatusCode::OK)
    );
    assert!(retry.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Another key holder with the same idempotency key is another scope.
    let other = send(
        &app,
        Some("k-1"),
        &[("authorization", "Bearer sk_live_other")],
        "{}",
    )
    .await;
    assert!(!other.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let page = store.list(&ListQuery::default()).await.unwrap();
    let scopes: Vec<&str> = page.records.iter().map(|l| l.record.key.scope()).collect();
    assert_eq!(scopes.len(), 2);
    for scope in scopes {
        assert!(
            !scope.contains("sk_live"),
            "the store holds the secret: {scope}"
        );
        assert!(scope.ends_with("/POST /payments"), "{scope}");
    }
}

/// The contrast: the raw `Authorization` header as the scope makes every request with a
/// long token a 500 (the scope is over a key part's 255 bytes).
#[tokio::test]
async fn a_1kb_bearer_token_as_the_raw_scope_fails_every_request() {
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/payments", post(charge))
        .layer(IdempotencyLayer::new(idem(), |parts| {
            let token = parts
                .headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-");
            Ok(format!(
                "{token}/{} {}",
                parts.method,
                idem_http::scope::path(parts)
            ))
        }))
        .with_state(runs.clone());
    let authorization = format!("Bearer sk_live_{}", "x".repeat(1024));
    let answer = send(
        &app,
        Some("k-1"),
        &[("authorization", &authorization)],
        "{}",
    )
    .await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// What the handlers below did: runs of the handler, of its first step, of its second.
#[derive(Clone, Default)]
struct Ledger {
    handler_runs: Arc<AtomicUsize>,
    first_step_runs: Arc<AtomicUsize>,
    second_step_runs: Arc<AtomicUsize>,
    crash_after_first_step: Arc<AtomicBool>,
    derived: Arc<std::sync::Mutex<Vec<String>>>,
    resumed: Arc<std::sync::Mutex<Vec<bool>>>,
}

/// Two steps; crashes (panics) between them when told to; the second step fails as the
/// request's `x-fail` header says.
async fn two_steps(
    State(ledger): State<Ledger>,
    Idempotent(ctx): Idempotent,
    headers: HeaderMap,
) -> Response {
    ledger.handler_runs.fetch_add(1, Ordering::SeqCst);
    ledger.resumed.lock().unwrap().push(ctx.resumed());
    let provider_key = ctx.derive("provider");
    ledger.derived.lock().unwrap().push(provider_key.clone());
    let first = ctx
        .step("reserve", || async {
            let n = ledger.first_step_runs.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<_, WorkError<String>>(format!("reservation-{n}"))
        })
        .await;
    let Ok(reservation) = first else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    if ledger.crash_after_first_step.swap(false, Ordering::SeqCst) {
        panic!("the process dies after the first step");
    }
    let fail = headers
        .get("x-fail")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let second = ctx
        .step("charge", || async {
            ledger.second_step_runs.fetch_add(1, Ordering::SeqCst);
            match fail.as_str() {
                "retryable" => Err(WorkError::Retryable("the provider refused".to_owned())),
                "unknown" => Err(WorkError::Unknown("the provider timed out".to_owned())),
                "permanent" => Err(WorkError::Permanent("declined".to_owned())),
                _ => Ok(format!("charged with {provider_key}")),
            }
        })
        .await;
    match second {
        Ok(charge) => (StatusCode::CREATED, Json((reservation, charge))).into_response(),
        // Inherent `Problem::into_response` answers the layer's own body type: name
        // the trait for axum's `Response`.
        Err(WorkError::Permanent(err)) => IntoResponse::into_response(
            Problem::new(StatusCode::PAYMENT_REQUIRED, "declined", "Declined").detail(err),
        ),
        Err(WorkError::Retryable(_)) => (
            Disposition::Release,
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "provider-unavailable",
                "Unavailable",
            )
            .retry_after(1),
        )
            .into_response(),
        Err(_) => (
            Disposition::Hold,
            Problem::new(StatusCode::GATEWAY_TIMEOUT, "provider-timeout", "Timed out"),
        )
            .into_response(),
    }
}

fn two_steps_app(idem: Idempotency, ledger: Ledger) -> Router {
    Router::new()
        .route("/payments", post(two_steps))
        .layer(IdempotencyLayer::new(idem, |parts| {
            scope::operation("acct_42", parts)
        }))
        .with_state(ledger)
}

#[tokio::test]
async fn a_retry_after_a_crash_takes_over_and_resumes_after_the_completed_step() {
    let clock = ManualClock::new();
    let idem = Idempotency::builder(MemoryStore::with_clock(clock.clone()))
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let ledger = Ledger::default();
    ledger.crash_after_first_step.store(true, Ordering::SeqCst);
    let app = two_steps_app(idem.into_dyn(), ledger.clone());

    let crashed = send(&app, Some("order-1187"), &[], "{}").await;
    assert_eq!(crashed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(crashed.problem_type(), "tag:idem-http,2026:handler-failed");
    // Within the lease, the key is held: nobody runs the handler.
    let early = send(&app, Some("order-1187"), &[], "{}").await;
    assert_eq!(early.status, StatusCode::CONFLICT);
    assert_eq!(ledger.handler_runs.load(Ordering::SeqCst), 1);

    clock.advance(Duration::from_secs(31));
    let taken_over = send(&app, Some("order-1187"), &[], "{}").await;
    assert_eq!(
        taken_over.status,
        StatusCode::CREATED,
        "{}",
        taken_over.body
    );
    assert!(!taken_over.replayed());
    // The first step's checkpoint answered the takeover: it ran once.
    assert_eq!(ledger.first_step_runs.load(Ordering::SeqCst), 1);
    assert_eq!(ledger.second_step_runs.load(Ordering::SeqCst), 1);
    assert!(
        taken_over.body.contains("reservation-1"),
        "{}",
        taken_over.body
    );
    assert_eq!(*ledger.resumed.lock().unwrap(), [false, true]);
    // The provider's key is the same for both runs: it deduplicates a repeated call.
    let derived = ledger.derived.lock().unwrap().clone();
    assert_eq!(derived.len(), 2);
    assert_eq!(derived[0], derived[1]);

    let replay = send(&app, Some("order-1187"), &[], "{}").await;
    assert!(replay.replayed());
    assert_eq!(replay.body, taken_over.body);
    assert_eq!(ledger.handler_runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_retryable_step_released_runs_again_at_once_without_its_completed_step() {
    let ledger = Ledger::default();
    let app = two_steps_app(idem(), ledger.clone());
    let refused = send(&app, Some("k-r"), &[("x-fail", "retryable")], "{}").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    // Released: the retry runs now, not after the lease; the first step is not run again.
    let retry = send(&app, Some("k-r"), &[], "{}").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.body);
    assert_eq!(ledger.handler_runs.load(Ordering::SeqCst), 2);
    assert_eq!(ledger.first_step_runs.load(Ordering::SeqCst), 1);
    assert_eq!(ledger.second_step_runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_unknown_step_held_keeps_the_key_and_a_permanent_one_is_replayed() {
    let ledger = Ledger::default();
    let app = two_steps_app(idem(), ledger.clone());
    let unknown = send(&app, Some("k-u"), &[("x-fail", "unknown")], "{}").await;
    assert_eq!(unknown.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        send(&app, Some("k-u"), &[], "{}").await.status,
        StatusCode::CONFLICT
    );

    let declined = send(&app, Some("k-p"), &[("x-fail", "permanent")], "{}").await;
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(declined.headers["content-type"], "application/problem+json");
    let again = send(&app, Some("k-p"), &[("x-fail", "permanent")], "{}").await;
    assert!(again.replayed());
    assert_eq!(again.body, declined.body);
    assert_eq!(ledger.handler_runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn idempotent_on_a_route_outside_the_layer_is_a_500_problem_and_nothing_runs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = |State(runs): State<Arc<AtomicUsize>>, Idempotent(_ctx): Idempotent| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        "ran"
    };
    let app = Router::new()
        .route("/payments", post(handler))
        .with_state(runs.clone());
    let answer = send(&app, Some("k-1"), &[], "{}").await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.headers["content-type"], "application/problem+json");
    assert_eq!(answer.problem_type(), "tag:idem-http,2026:not-protected");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn option_idempotent_is_none_without_a_key_and_some_with_one() {
    let handler = |idem: Option<Idempotent>| async move {
        match idem {
            Some(ctx) => format!("protected, token {}", ctx.token()),
            None => "unprotected".to_owned(),
        }
    };
    let app = Router::new()
        .route("/profile", axum::routing::put(handler))
        .layer(
            IdempotencyLayer::new(idem(), |parts| scope::operation("acct_42", parts))
                .method(Method::PUT, KeyRequirement::Optional),
        );
    let without = send_to(&app, Method::PUT, "/profile", None, &[], "").await;
    let with = send_to(&app, Method::PUT, "/profile", Some("k-1"), &[], "").await;
    assert_eq!(without.body, "unprotected");
    assert!(with.body.starts_with("protected, token "), "{}", with.body);
}

#[tokio::test]
async fn a_handler_returning_result_problem_answers_problem_json_with_question_mark() {
    fn check(amount: u64) -> Result<u64, Problem> {
        if amount == 0 {
            return Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "zero-amount",
                "Nothing to pay",
            )
            .retry_after(3));
        }
        Ok(amount)
    }
    async fn pay(Json(amount): Json<u64>) -> Result<(StatusCode, String), Problem> {
        let amount = check(amount)?;
        Ok((StatusCode::CREATED, amount.to_string()))
    }
    let app = Router::new()
        .route("/payments", post(pay))
        .layer(IdempotencyLayer::new(idem(), |parts| {
            scope::operation("acct_42", parts)
        }));
    let json = [("content-type", "application/json")];
    let refused = send(&app, Some("k-0"), &json, "0").await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(refused.headers["content-type"], "application/problem+json");
    assert_eq!(refused.headers["retry-after"], "3");
    assert_eq!(refused.problem_type(), "tag:idem-http,2026:zero-amount");
    let paid = send(&app, Some("k-5"), &json, "5").await;
    assert_eq!(
        (paid.status, paid.body.as_str()),
        (StatusCode::CREATED, "5")
    );
}

#[tokio::test]
async fn an_invalid_scope_is_the_servers_fault_and_nothing_runs() {
    // Each way a scope breaks the key's rules: empty, over 255 bytes, a control character.
    for scope in [String::new(), "s".repeat(256), "acct\u{1}".to_owned()] {
        let runs = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route("/payments", post(charge))
            .layer(IdempotencyLayer::new(idem(), move |_parts| {
                Ok(scope.clone())
            }))
            .with_state(runs.clone());
        let answer = send(&app, Some("k-1"), &[], "{}").await;
        assert_eq!(
            answer.status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{}",
            answer.body
        );
        assert_eq!(answer.problem_type(), "tag:idem-http,2026:internal");
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }
}

/// A whole body is stored while the record has room for it with its head: the layer's
/// own reckoning of the head costs it less than 47 bytes of a small store's room.
#[tokio::test]
async fn a_body_that_fits_a_small_records_room_is_stored_whole() {
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(Duration::from_secs(30))
        .max_response_bytes(4096)
        .build()
        .unwrap()
        .into_dyn();
    // `spare`, asked in the request's body: the bytes the body leaves of the room once its
    // one header is counted. The record also takes 17 fixed bytes, so 64 leaves 47 unused
    // and 0 is 17 over the room.
    let handler = |idem: Idempotent, body: String| async move {
        let spare: usize = body.trim().parse().unwrap();
        // The one stored header's share of the record: its name, its value, 6 bytes.
        let header = 6 + "content-type".len() + "text/plain".len();
        let size = idem.room_for_plain_response() - header - spare;
        ([("content-type", "text/plain")], "a".repeat(size))
    };
    let app = Router::new()
        .route("/reports", post(handler))
        .layer(IdempotencyLayer::new(idem, |parts| {
            scope::operation("acct_42", parts)
        }));
    for (spare, whole) in [(64, true), (0, false)] {
        let (key, body) = (format!("k-{spare}"), spare.to_string());
        let send = || send_to(&app, Method::POST, "/reports", Some(&key), &[], &body);
        let first = send().await;
        let again = send().await;
        assert!(again.replayed(), "{spare}");
        assert_eq!(
            again.headers.get("idempotent-body-not-stored").is_none(),
            whole,
            "{spare} bytes to spare"
        );
        if whole {
            assert_eq!(again.body, first.body);
        }
    }
}
