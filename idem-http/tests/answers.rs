//! Every row of the answer table and every "must survive" item, against a real server on
//! 127.0.0.1 with a real HTTP client, on the memory store, SQLite, PostgreSQL and Redis.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Effects, Factory, Server, app, client, layer, post, post_with};
use idem_core::Idempotency;
use idem_testkit::Namespace;

/// A server with the test app over a store from `factory`, with `lease`.
async fn server(factory: &Factory, namespace: &Namespace, lease: Duration) -> (Server, Effects) {
    let store = factory(namespace.clone()).await;
    let idem = Idempotency::builder(store)
        .lease(lease)
        .build()
        .expect("valid settings")
        .into_dyn();
    let effects = Effects::default();
    (
        Server::start(app(layer(idem), effects.clone())).await,
        effects,
    )
}

async fn fresh(factory: &Factory) -> (Server, Effects) {
    server(factory, &Namespace::fresh(), Duration::from_secs(30)).await
}

async fn a_missing_key_is_400(factory: Factory) {
    let (server, effects) = fresh(&factory).await;
    let answer = post(&client(), &server.url("/payments"), None, "{}", &[]).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.problem(), "missing-key");
    assert!(
        answer.json()["detail"]
            .as_str()
            .unwrap()
            .contains("idempotency-key"),
        "{answer:?}"
    );
    assert_eq!(effects.runs(), 0);
    // Other methods pass through untouched.
    let health = client().get(server.url("/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
}

async fn a_malformed_key_is_400_naming_the_rule(factory: Factory) {
    let (server, effects) = fresh(&factory).await;
    let url = server.url("/payments");
    let long = "k".repeat(256);
    for (value, rule) in [
        ("\"unterminated", "Structured Field string"),
        ("two words", "unquoted value"),
        (long.as_str(), "over the limit of 255 bytes"),
        ("\"\"", "empty"),
    ] {
        let answer = post(&client(), &url, Some(value), "{}", &[]).await;
        assert_eq!(answer.status, 400, "{value}");
        assert_eq!(answer.problem(), "malformed-key");
        let detail = answer.json()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains(rule), "{value}: {detail}");
    }
    assert_eq!(effects.runs(), 0);
}

async fn the_first_request_runs_once_and_every_retry_replays_it(factory: Factory) {
    let (server, effects) = fresh(&factory).await;
    let url = server.url("/payments");
    let key = "\"8e03978e-40d5-43e8-bc93-6894a57f9324\"";
    let body = r#"{"amount": 500, "currency": "EUR"}"#;
    let first = post(&client(), &url, Some(key), body, &[]).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    assert_eq!(first.header("set-cookie"), Some("session=secret; HttpOnly"));
    for _ in 0..3 {
        // The same request, its JSON reordered: the same request.
        let again = post(
            &client(),
            &url,
            Some(key),
            r#"{"currency":"EUR","amount":500}"#,
            &[],
        )
        .await;
        assert_eq!(again.status, 201);
        assert_eq!(again.body, first.body, "byte for byte");
        assert!(again.replayed());
        assert_eq!(again.header("location"), first.header("location"));
        assert_eq!(again.header("content-type"), Some("application/json"));
        assert_eq!(
            again.header("set-cookie"),
            None,
            "Set-Cookie is not replayed by default"
        );
        assert_eq!(
            again.header("x-internal"),
            None,
            "only allowlisted headers are replayed"
        );
    }
    assert_eq!(effects.runs(), 1);
}

async fn a_different_request_under_the_key_is_422(factory: Factory) {
    let (server, effects) = fresh(&factory).await;
    let url = server.url("/payments");
    let first = post(&client(), &url, Some("k-422"), r#"{"amount":500}"#, &[]).await;
    assert_eq!(first.status, 201);
    let changed = post(&client(), &url, Some("k-422"), r#"{"amount":900}"#, &[]).await;
    assert_eq!(changed.status, 422);
    assert_eq!(changed.problem(), "key-reused");
    let text = String::from_utf8_lossy(&changed.body).to_string();
    assert!(
        !text.contains("payment") && !text.contains("500"),
        "never the original request or response: {text}"
    );
    assert_eq!(effects.runs(), 1);
}

async fn a_corrected_request_after_a_refusal_runs(factory: Factory) {
    let (server, effects) = fresh(&factory).await;
    let url = server.url("/payments");
    // The handler refused the body (as axum's `Json` does with 422): nothing happened, so
    // the corrected body under the same key runs, and is then replayed.
    let refused = post(
        &client(),
        &url,
        Some("k-fix"),
        r#"{"amount":"five"}"#,
        &[("x-status", "422")],
    )
    .await;
    assert_eq!(refused.status, 422);
    let corrected = post(&client(), &url, Some("k-fix"), r#"{"amount":500}"#, &[]).await;
    assert_eq!(corrected.status, 201, "{corrected:?}");
    assert!(!corrected.replayed());
    let again = post(&client(), &url, Some("k-fix"), r#"{"amount":500}"#, &[]).await;
    assert!(again.replayed());
    assert_eq!(again.body, corrected.body);
    assert_eq!(effects.runs(), 2);

    // A refusal after a checkpointed step keeps the key for that request: the step was
    // done for it. Another body is a mismatch; the same one resumes past the step.
    let refused = post(
        &client(),
        &url,
        Some("k-step"),
        r#"{"amount":1}"#,
        &[("x-step", "1"), ("x-status", "409")],
    )
    .await;
    assert_eq!(refused.status, 409);
    let other = post(&client(), &url, Some("k-step"), r#"{"amount":2}"#, &[]).await;
    assert_eq!(other.status, 422);
    assert_eq!(other.problem(), "key-reused");
    let same = post(
        &client(),
        &url,
        Some("k-step"),
        r#"{"amount":1}"#,
        &[("x-step", "1")],
    )
    .await;
    assert_eq!(same.status, 201, "{same:?}");
    assert_eq!(effects.charges(), 1, "the step ran once");
    assert_eq!(effects.runs(), 4);
}

async fn a_duplicate_while_the_first_runs_is_409_with_retry_after(factory: Factory) {
    let (server, effects) = fresh(&factory).await;
    let url = server.url("/payments");
    let first = {
        let url = url.clone();
        tokio::spawn(async move {
            post(
                &client(),
                &url,
                Some("k-409"),
                "{}",
                &[("x-sleep-ms", "1500")],
            )
            .await
        })
    };
    effects.wait_for_runs(1).await;
    let duplicate = post(&client(), &url, Some("k-409"), "{}", &[]).await;
    assert_eq!(duplicate.status, 409);
    assert_eq!(duplicate.problem(), "in-flight");
    let retry_after: u64 = duplicate
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("whole seconds");
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    assert_eq!(first.await.unwrap().status, 201);
    let later = post(&client(), &url, Some("k-409"), "{}", &[]).await;
    assert!(later.replayed());
    assert_eq!(effects.runs(), 1);
}

async fn a_client_that_goes_away_gets_the_result_on_its_retry(factory: Factory) {
    let (server, effects) = fresh(&factory).await;
    let url = server.url("/payments");
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let gone = post_with(
        &impatient,
        &url,
        Some("k-gone"),
        "{}",
        &[("x-sleep-ms", "400")],
    )
    .await;
    assert!(
        gone.is_err(),
        "the client timed out and disconnected: {gone:?}"
    );
    // The handler goes on without the client. Retry until it has finished (bounded).
    let mut answer = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let retry = post(&client(), &url, Some("k-gone"), "{}", &[]).await;
        if retry.status != 409 {
            answer = Some(retry);
            break;
        }
    }
    let answer = answer.expect("the first request finished");
    assert_eq!(answer.status, 201);
    assert!(answer.replayed(), "the retry got the stored response");
    assert_eq!(answer.json()["payment"], 1);
    assert_eq!(
        effects.runs(),
        1,
        "the work was not cancelled and did not run twice"
    );
}

async fn sixteen_concurrent_duplicates_run_the_handler_once(factory: Factory) {
    let (server, effects) = fresh(&factory).await;
    let url = server.url("/payments");
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let (url, barrier) = (url.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                post(
                    &client(),
                    &url,
                    Some("k-herd"),
                    "{}",
                    &[("x-sleep-ms", "200")],
                )
                .await
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in clients {
        let answer = task.await.unwrap();
        if answer.status == 201 {
            assert_eq!(answer.json()["payment"], 1);
        }
        statuses.push(answer.status);
    }
    assert_eq!(effects.runs(), 1, "{statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 201 || *s == 409),
        "every client gets the response or a 409: {statuses:?}"
    );
    assert!(statuses.contains(&201));
}

async fn a_crashed_handler_is_taken_over_after_its_lease(factory: Factory) {
    let namespace = Namespace::fresh();
    let lease = Duration::from_secs(1);
    // Process A: its own runtime, killed mid-handler (after the "charge" step).
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (crash_tx, crash_rx) = std::sync::mpsc::channel::<()>();
    let process_a = {
        let (factory, namespace) = (factory.clone(), namespace.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let (server, effects) = runtime.block_on(server(&factory, &namespace, lease));
            addr_tx.send((server.url("/payments"), effects)).unwrap();
            let _ = crash_rx.recv();
            // Every task of process A stops here: its handler, and its heartbeat.
            runtime.shutdown_background();
        })
    };
    let (url_a, effects_a) = addr_rx.recv().unwrap();
    let hanging = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let cut = post_with(
        &hanging,
        &url_a,
        Some("k-crash"),
        "{}",
        &[("x-step", "1"), ("x-hang", "1")],
    )
    .await;
    assert!(cut.is_err(), "process A never answers");
    assert_eq!(effects_a.charges(), 1, "A charged, then died");
    crash_tx.send(()).unwrap();
    process_a.join().unwrap();

    // Process B, on the same store: the key is held until A's lease ends, then taken over.
    let (server_b, effects_b) = server(&factory, &namespace, lease).await;
    let url_b = server_b.url("/payments");
    let held = post(&client(), &url_b, Some("k-crash"), "{}", &[("x-step", "1")]).await;
    assert_eq!(held.status, 409, "A's lease still holds the key: {held:?}");
    let mut answer = None;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let retry = post(&client(), &url_b, Some("k-crash"), "{}", &[("x-step", "1")]).await;
        if retry.status != 409 {
            answer = Some(retry);
            break;
        }
    }
    let answer = answer.expect("B took over once A's lease ended");
    assert_eq!(answer.status, 201);
    assert_eq!(effects_b.runs(), 1, "B ran the handler");
    assert_eq!(
        effects_a.charges() + effects_b.charges(),
        1,
        "the charge step ran once across the crash"
    );
    let again = post(&client(), &url_b, Some("k-crash"), "{}", &[]).await;
    assert!(again.replayed());
    assert_eq!(again.body, answer.body);
}

macro_rules! suite {
    ($backend:ident, $factory:expr) => {
        mod $backend {
            use super::*;

            fn factory() -> Option<Factory> {
                $factory
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_missing_key_is_400() {
                if let Some(f) = factory() {
                    super::a_missing_key_is_400(f).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_malformed_key_is_400_naming_the_rule() {
                if let Some(f) = factory() {
                    super::a_malformed_key_is_400_naming_the_rule(f).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_first_request_runs_once_and_every_retry_replays_it() {
                if let Some(f) = factory() {
                    super::the_first_request_runs_once_and_every_retry_replays_it(f).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_different_request_under_the_key_is_422() {
                if let Some(f) = factory() {
                    super::a_different_request_under_the_key_is_422(f).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_corrected_request_after_a_refusal_runs() {
                if let Some(f) = factory() {
                    super::a_corrected_request_after_a_refusal_runs(f).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_duplicate_while_the_first_runs_is_409_with_retry_after() {
                if let Some(f) = factory() {
                    super::a_duplicate_while_the_first_runs_is_409_with_retry_after(f).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_client_that_goes_away_gets_the_result_on_its_retry() {
                if let Some(f) = factory() {
                    super::a_client_that_goes_away_gets_the_result_on_its_retry(f).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sixteen_concurrent_duplicates_run_the_handler_once() {
                if let Some(f) = factory() {
                    super::sixteen_concurrent_duplicates_run_the_handler_once(f).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_crashed_handler_is_taken_over_after_its_lease() {
                if let Some(f) = factory() {
                    super::a_crashed_handler_is_taken_over_after_its_lease(f).await;
                }
            }
        }
    };
}

suite!(memory, Some(common::memory_factory()));
suite!(sqlite, Some(common::sqlite_factory()));
suite!(
    postgres,
    idem_testkit::service_url("IDEM_TEST_POSTGRES_URL").map(common::postgres_factory)
);
suite!(
    redis,
    idem_testkit::service_url("IDEM_TEST_REDIS_URL").map(common::redis_factory)
);
