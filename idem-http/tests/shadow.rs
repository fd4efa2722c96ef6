//! Shadow mode: keys are claimed and responses recorded as usual, every request reaches
//! the handler, and what the layer would have answered is counted. Alone in its binary:
//! it installs the process-wide metrics recorder it reads.

mod common;

use std::time::Duration;

use common::{Effects, Server, app, client, layer, post};
use idem_core::{Idempotency, MemoryStore};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_answers_as_the_handler_and_counts_what_it_would_have_done() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");

    let idem = Idempotency::builder(MemoryStore::new())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
        .into_dyn();
    let effects = Effects::default();
    let server = Server::start(app(layer(idem.clone()).shadow(true), effects.clone())).await;
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

    let snapshot = snapshotter.snapshot().into_vec();
    let would = |what: &str| {
        snapshot
            .iter()
            .filter(|(key, _, _, _)| {
                key.key().name() == idem_http::observe::SHADOW
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == "would" && l.value() == what)
            })
            .map(|(_, _, _, value)| match value {
                DebugValue::Counter(n) => *n,
                _ => 0,
            })
            .sum::<u64>()
    };
    assert_eq!(would("replayed"), 1);
    assert_eq!(would("mismatch"), 1);
    assert_eq!(would("missing_key"), 1);

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
