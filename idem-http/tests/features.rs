//! The layer's settings, on the memory store against a real server on 127.0.0.1: the
//! status policy and its per-response override, the header allowlist, body limits, scope
//! isolation, ignored JSON fields and methods.

mod common;

use std::time::Duration;

use common::{Effects, Server, app, client, layer, post};
use http::{HeaderName, Method};
use idem_core::{Idempotency, MemoryStore};
use idem_http::{IdempotencyLayer, KeyRequirement};

fn idem() -> Idempotency {
    Idempotency::builder(MemoryStore::new())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
        .into_dyn()
}

async fn start(configure: impl FnOnce(IdempotencyLayer) -> IdempotencyLayer) -> (Server, Effects) {
    let effects = Effects::default();
    let server = Server::start(app(configure(layer(idem())), effects.clone())).await;
    (server, effects)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_policy_stores_releases_or_holds() {
    let (server, effects) = start(|l| l).await;
    let url = server.url("/payments");
    // 402: a final answer, replayed.
    let declined = post(&client(), &url, Some("k-402"), "{}", &[("x-status", "402")]).await;
    let again = post(&client(), &url, Some("k-402"), "{}", &[]).await;
    assert_eq!((declined.status, again.status), (402, 402));
    assert!(again.replayed());
    // 429: nothing happened, released: the retry runs the handler again.
    let busy = post(&client(), &url, Some("k-429"), "{}", &[("x-status", "429")]).await;
    assert_eq!(busy.status, 429);
    let retry = post(&client(), &url, Some("k-429"), "{}", &[]).await;
    assert_eq!(retry.status, 201);
    assert!(!retry.replayed());
    // 500: the effect may have happened, held: a retry within the lease is in flight.
    let failed = post(&client(), &url, Some("k-500"), "{}", &[("x-status", "500")]).await;
    assert_eq!(failed.status, 500);
    let held = post(&client(), &url, Some("k-500"), "{}", &[]).await;
    assert_eq!(held.status, 409);
    assert_eq!(effects.runs(), 4);
    // A client error says nothing was done: released, so a corrected retry runs (a
    // transient 409 from an optimistic lock, a 422 from a body the handler refused).
    for status in ["400", "401", "404", "409", "422"] {
        let key = format!("k-{status}");
        let refused = post(&client(), &url, Some(&key), "{}", &[("x-status", status)]).await;
        assert_eq!(refused.status.to_string(), status);
        let corrected = post(&client(), &url, Some(&key), "{}", &[]).await;
        assert_eq!(
            corrected.status, 201,
            "{status} was not kept: {corrected:?}"
        );
        assert!(!corrected.replayed());
    }
    assert_eq!(effects.runs(), 14);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_overrides_the_policy_for_one_response() {
    let (server, effects) = start(|l| l).await;
    let url = server.url("/payments");
    // A 201 that says "nothing happened, release the key".
    let released = post(
        &client(),
        &url,
        Some("k-r"),
        "{}",
        &[("x-disposition", "release")],
    )
    .await;
    assert_eq!(released.status, 201);
    let retry = post(&client(), &url, Some("k-r"), "{}", &[]).await;
    assert!(!retry.replayed(), "released: the handler ran again");
    // A 502 that says "this is final": stored and replayed.
    let stored = post(
        &client(),
        &url,
        Some("k-s"),
        "{}",
        &[("x-status", "502"), ("x-disposition", "store")],
    )
    .await;
    let replay = post(&client(), &url, Some("k-s"), "{}", &[]).await;
    assert_eq!((stored.status, replay.status), (502, 502));
    assert!(replay.replayed());
    // A 201 that says "the outcome is unknown, hold it".
    let held = post(
        &client(),
        &url,
        Some("k-h"),
        "{}",
        &[("x-disposition", "hold")],
    )
    .await;
    assert_eq!(held.status, 201);
    assert_eq!(
        post(&client(), &url, Some("k-h"), "{}", &[]).await.status,
        409
    );
    assert_eq!(effects.runs(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowlisted_headers_are_replayed() {
    let (server, _) = start(|l| {
        l.stored_headers([
            HeaderName::from_static("x-internal"),
            HeaderName::from_static("transfer-encoding"),
        ])
        .store_set_cookie(true)
    })
    .await;
    let url = server.url("/payments");
    let _ = post(&client(), &url, Some("k"), "{}", &[]).await;
    let replay = post(&client(), &url, Some("k"), "{}", &[]).await;
    assert!(replay.replayed());
    assert_eq!(replay.header("x-internal"), Some("not-for-replay"));
    assert_eq!(
        replay.header("set-cookie"),
        Some("session=secret; HttpOnly")
    );
    assert_eq!(replay.header("location"), None, "not in this allowlist");
    assert_eq!(
        replay.header("transfer-encoding"),
        None,
        "hop-by-hop, never stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_over_the_limit_is_413_and_claims_nothing() {
    let (server, effects) = start(|l| l.max_request_body(64)).await;
    let url = server.url("/payments");
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(100));
    let answer = post(&client(), &url, Some("k-big"), &big, &[]).await;
    assert_eq!(answer.status, 413);
    assert_eq!(answer.problem(), "request-too-large");
    assert_eq!(effects.runs(), 0);
    // Nothing was claimed: the key is free for a request that fits.
    let fits = post(&client(), &url, Some("k-big"), "{}", &[]).await;
    assert_eq!(fits.status, 201);
    assert!(!fits.replayed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_replay_limit_is_sent_once_and_never_run_again() {
    let (server, effects) = start(|l| l.max_response_body(1000)).await;
    let url = server.url("/payments");
    let first = post(
        &client(),
        &url,
        Some("k-huge"),
        "{}",
        &[("x-response-bytes", "5000")],
    )
    .await;
    assert_eq!(
        (first.status, first.body.len()),
        (201, 5000),
        "the first client gets it whole"
    );
    let retry = post(&client(), &url, Some("k-huge"), "{}", &[]).await;
    assert_eq!(
        retry.status, 201,
        "the original status: what succeeded looks succeeded"
    );
    assert!(retry.replayed());
    assert_eq!(
        retry.header(idem_http::BODY_NOT_STORED_HEADER),
        Some("true")
    );
    assert!(
        retry.body.is_empty(),
        "no problem body under a 2xx: {retry:?}"
    );
    assert_eq!(retry.header("content-type"), None);
    assert_eq!(retry.header("location"), first.header("location"));
    assert_eq!(effects.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_principals_with_one_key_never_meet() {
    let (server, effects) = start(|l| l).await;
    let url = server.url("/payments");
    let alice = post(
        &client(),
        &url,
        Some("same-key"),
        "{}",
        &[("x-account", "alice")],
    )
    .await;
    let bob = post(
        &client(),
        &url,
        Some("same-key"),
        "{}",
        &[("x-account", "bob")],
    )
    .await;
    assert!(!alice.replayed() && !bob.replayed(), "each ran");
    assert_ne!(alice.body, bob.body);
    let alice_again = post(
        &client(),
        &url,
        Some("same-key"),
        "{}",
        &[("x-account", "alice")],
    )
    .await;
    assert_eq!(alice_again.body, alice.body);
    assert!(alice_again.replayed());
    assert_eq!(effects.runs(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignored_json_fields_do_not_make_another_request() {
    let (server, effects) = start(|l| l.ignore_json_fields(["sent_at", "/meta/trace_id"])).await;
    let url = server.url("/payments");
    let first = post(
        &client(),
        &url,
        Some("k"),
        r#"{"amount":5,"sent_at":"10:00","meta":{"trace_id":"a"}}"#,
        &[],
    )
    .await;
    let retry = post(
        &client(),
        &url,
        Some("k"),
        r#"{"amount":5,"sent_at":"10:01","meta":{"trace_id":"b"}}"#,
        &[],
    )
    .await;
    assert_eq!(first.status, 201);
    assert!(retry.replayed());
    let changed = post(
        &client(),
        &url,
        Some("k"),
        r#"{"amount":6,"sent_at":"10:01"}"#,
        &[],
    )
    .await;
    assert_eq!(changed.status, 422);
    assert_eq!(effects.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_require_allow_or_ignore_the_header() {
    let (server, effects) = start(|l| l.method(Method::PUT, KeyRequirement::Optional)).await;
    let url = server.url("/payments");
    let put = |key: Option<&'static str>| {
        let url = url.clone();
        async move {
            let mut request = client().put(&url).body("{}");
            if let Some(key) = key {
                request = request.header("idempotency-key", key);
            }
            request.send().await.unwrap()
        }
    };
    // Optional: without the header it passes; with it, it is protected.
    assert_eq!(put(None).await.status(), 201);
    assert_eq!(put(Some("k-put")).await.status(), 201);
    let replay = put(Some("k-put")).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    // DELETE is not protected by default, header or not.
    for _ in 0..2 {
        let delete = client()
            .delete(&url)
            .header("idempotency-key", "k-del")
            .send()
            .await
            .unwrap();
        assert_eq!(delete.status(), 201);
        assert!(delete.headers().get("idempotent-replayed").is_none());
    }
    assert_eq!(effects.runs(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_policies_answer_400_and_key_floods_429_with_retry_after() {
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(Duration::from_secs(30))
        .key_policy(idem_core::KeyPolicy::min_length(8))
        .key_budget(idem_core::driver::TokenBucket::new(
            1,
            Duration::from_secs(3600),
        ))
        .build()
        .unwrap()
        .into_dyn();
    let effects = Effects::default();
    let server = Server::start(app(layer(idem), effects.clone())).await;
    let url = server.url("/payments");
    let short = post(&client(), &url, Some("k-1"), "{}", &[]).await;
    assert_eq!(short.status, 400);
    assert_eq!(short.problem(), "key-refused");
    let first = post(&client(), &url, Some("key-long-1"), "{}", &[]).await;
    assert_eq!(first.status, 201);
    let flood = post(&client(), &url, Some("key-long-2"), "{}", &[]).await;
    assert_eq!(flood.status, 429);
    assert_eq!(flood.problem(), "too-many-new-keys");
    let seconds: u64 = flood
        .header("retry-after")
        .expect("Retry-After on a 429")
        .parse()
        .expect("whole seconds");
    assert!((1..=3600).contains(&seconds), "{seconds}");
    let replay = post(&client(), &url, Some("key-long-1"), "{}", &[]).await;
    assert!(replay.replayed(), "an existing key still replays");
    assert_eq!(effects.runs(), 1, "neither refusal ran the handler");
}
