//! Shadow mode: keys are claimed and responses recorded as usual, every request reaches
//! the handler, and what the layer would have answered is counted; and the layer's
//! metrics with a route label. Alone in their binary: they install the process-wide
//! metrics recorder they read.

mod common;

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::{Effects, Server, app, client, layer, post};
use idem_core::{Idempotency, MemoryStore};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// This binary's recorder, installed once whichever test comes first.
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        snapshotter
    })
}

/// The count of `name` with every label in `labels`, and no `route` label unless asked,
/// since the binary began: a snapshot takes the counts since the last one, so they are
/// added up here.
fn counted(name: &str, labels: &[(&str, &str)]) -> u64 {
    static TALLY: Mutex<Vec<(metrics::Key, u64)>> = Mutex::new(Vec::new());
    let mut tally = TALLY.lock().unwrap();
    for (key, _, _, value) in snapshotter().snapshot().into_vec() {
        if let DebugValue::Counter(n) = value {
            match tally.iter_mut().find(|(k, _)| k == key.key()) {
                Some((_, total)) => *total += n,
                None => tally.push((key.key().clone(), n)),
            }
        }
    }
    tally
        .iter()
        .filter(|(key, _)| {
            let has = |k: &str, v: &str| key.labels().any(|l| l.key() == k && l.value() == v);
            key.name() == name
                && labels.iter().all(|(k, v)| has(k, v))
                && (labels.iter().any(|(k, _)| *k == "route")
                    || !key.labels().any(|l| l.key() == "route"))
        })
        .map(|(_, n)| n)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_answers_as_the_handler_and_counts_what_it_would_have_done() {
    // A label of this test's own: the binary's other tests count beside it.
    let before = |what| {
        counted(
            idem_http::observe::SHADOW,
            &[("would", what), ("route", "shadow-counts")],
        )
    };
    let (replayed, mismatch, missing_key) = (
        before("replayed"),
        before("mismatch"),
        before("missing_key"),
    );

    let idem = Idempotency::builder(MemoryStore::new())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
        .into_dyn();
    let effects = Effects::default();
    let shadowed = layer(idem.clone())
        .shadow(true)
        .route_label("shadow-counts");
    let server = Server::start(app(shadowed, effects.clone())).await;
    let url = server.url("/payments");

    let first = post(&client(), &url, Some("k"), r#"{"amount":5}"#, &[]).await;
    let again = post(&client(), &url, Some("k"), r#"{"amount":5}"#, &[]).await;
    let changed = post(&client(), &url, Some("k"), r#"{"amount":6}"#, &[]).await;
    let missing = post(&client(), &url, None, r#"{"amount":5}"#, &[]).await;
    for answer in [&first, &again, &changed, &missing] {
        assert_eq!(
            answer.status, 201,
            "the handler's answer, always: {answer:?}"
        );
        assert!(!answer.replayed());
    }
    assert_eq!(effects.runs(), 4, "every request reached the handler");

    let would = |what| {
        counted(
            idem_http::observe::SHADOW,
            &[("would", what), ("route", "shadow-counts")],
        )
    };
    assert_eq!(would("replayed"), replayed + 1);
    assert_eq!(would("mismatch"), mismatch + 1);
    assert_eq!(would("missing_key"), missing_key + 1);

    // Switched off, the record made in shadow mode is real: the retry replays.
    let live = Server::start(app(layer(idem), effects.clone())).await;
    let replay = post(
        &client(),
        &live.url("/payments"),
        Some("k"),
        r#"{"amount":5}"#,
        &[],
    )
    .await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_never_answers_for_the_handler_and_hands_it_a_context() {
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(Duration::from_secs(30))
        .key_policy(idem_core::KeyPolicy::min_length(4))
        .build()
        .unwrap()
        .into_dyn();
    let effects = Effects::default();
    let strict = idem_http::IdempotencyLayer::new(idem, |parts| {
        let account = parts.headers.get("x-account").ok_or_else(|| {
            idem_http::Problem::new(
                http::StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "Sign in first",
            )
        })?;
        Ok(format!(
            "{}/{}",
            account.to_str().unwrap_or("?"),
            parts.uri.path()
        ))
    })
    .max_request_body(64)
    .shadow(true);
    let server = Server::start(app(strict, effects.clone())).await;
    let url = server.url("/payments");
    let signed = [("x-account", "a"), ("x-step", "1")];
    let large = "x".repeat(1000);
    let answers = [
        // Over the body limit: 413 when live.
        post(&client(), &url, Some("key-1"), &large, &signed).await,
        // The scope function refuses: 401 when live.
        post(&client(), &url, Some("key-2"), "{}", &[("x-step", "1")]).await,
        // Malformed and refused keys: 400 when live.
        post(&client(), &url, Some("two words"), "{}", &signed).await,
        post(&client(), &url, Some("k"), "{}", &signed).await,
        // A duplicate and a reuse, whose handler reads the context for its step.
        post(&client(), &url, Some("key-3"), "{}", &signed).await,
        post(&client(), &url, Some("key-3"), "{}", &signed).await,
        post(&client(), &url, Some("key-3"), "{\"other\":1}", &signed).await,
    ];
    for answer in &answers {
        assert_eq!(answer.status, 201, "the handler's own answer: {answer:?}");
        assert!(!answer.replayed());
    }
    assert_eq!(effects.runs(), answers.len());
    assert_eq!(
        effects.charges(),
        answers.len(),
        "every step ran: nothing is replayed in shadow mode"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_never_gives_two_requests_one_downstream_key() {
    use axum::{Extension, Router, routing::post as route_post};
    let idem = Idempotency::new(MemoryStore::new()).into_dyn();
    let app = Router::new()
        .route(
            "/payments",
            route_post(|Extension(ctx): Extension<idem_core::Context>| async move {
                ctx.derive("charge")
            }),
        )
        .layer(common::layer(idem).shadow(true));
    let server = Server::start(app).await;
    let url = server.url("/payments");
    let mut keys = std::collections::HashSet::new();
    for i in 0..40 {
        // Keyless (the clients do not send keys yet) and with different bodies.
        let answer = post(&client(), &url, None, &format!("{{\"amount\":{i}}}"), &[]).await;
        assert_eq!(answer.status, 200);
        keys.insert(answer.body.clone());
    }
    assert_eq!(
        keys.len(),
        40,
        "every payment has a downstream key of its own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_label_names_the_route_of_each_answer() {
    let requests = idem_http::observe::REQUESTS;
    let labelled = |answer| counted(requests, &[("answer", answer), ("route", "payments")]);
    let (executed, replayed) = (labelled("executed"), labelled("replayed"));
    let idem = Idempotency::new(MemoryStore::new()).into_dyn();
    let effects = Effects::default();
    let server = Server::start(app(layer(idem).route_label("payments"), effects.clone())).await;
    let url = server.url("/payments");
    post(&client(), &url, Some("route-k"), "{}", &[]).await;
    post(&client(), &url, Some("route-k"), "{}", &[]).await;
    assert_eq!(labelled("executed"), executed + 1);
    assert_eq!(labelled("replayed"), replayed + 1);
    assert_eq!(effects.runs(), 1);
}
