//! A key held after its first request was answered (a 5xx): nothing runs under it until
//! its lease ends, and a retry is told so, where a key whose work still runs is polled
//! again within a second.

mod common;

use std::time::Duration;

use common::{Effects, Server, app, client, layer, post};
use idem_core::{Heartbeat, Idempotency, MemoryStore};

fn idem(store: &MemoryStore, lease: Duration) -> Idempotency {
    Idempotency::builder(store.clone())
        .lease(lease)
        .build()
        .expect("valid settings")
        .into_dyn()
}

fn retry_after(answer: &common::Answer) -> u64 {
    answer
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("a Retry-After in seconds: {answer:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_a_held_key_is_told_when_its_lease_ends() {
    let store = MemoryStore::new();
    let effects = Effects::default();
    let layer = layer(idem(&store, Duration::from_secs(20)));
    let server = Server::start(app(layer, effects.clone())).await;
    let url = server.url("/payments");
    let http = client();

    let failed = post(&http, &url, Some("k1"), "{}", &[("x-status", "500")]).await;
    assert_eq!(failed.status, 500);
    let retried = post(&http, &url, Some("k1"), "{}", &[]).await;
    assert_eq!(retried.status, 409, "{retried:?}");
    let wait = retry_after(&retried);
    assert!(
        (15..=20).contains(&wait),
        "the held lease's end (20 s lease), not a second: {wait}"
    );
    let problem = retried.json();
    assert!(
        problem["type"].as_str().unwrap().ends_with("in-flight"),
        "still the in-flight type, which clients poll on: {problem}"
    );
    assert!(
        problem["title"].as_str().unwrap().contains("held"),
        "{problem}"
    );
    assert_eq!(
        problem["held"], true,
        "an extension member clients read: {problem}"
    );
    assert_eq!(effects.runs(), 1, "nothing ran again");

    // A key whose first request still runs is polled again within a second.
    let running = tokio::spawn({
        let (http, url) = (http.clone(), url.clone());
        async move { post(&http, &url, Some("k2"), "{}", &[("x-sleep-ms", "1500")]).await }
    });
    effects.wait_for_runs(2).await;
    let duplicate = post(&http, &url, Some("k2"), "{}", &[]).await;
    assert_eq!(duplicate.status, 409, "{duplicate:?}");
    assert_eq!(retry_after(&duplicate), 1);
    assert_eq!(running.await.unwrap().status, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_held_answer_is_capped_and_only_its_replica_knows() {
    let store = MemoryStore::new();
    let effects = Effects::default();
    let capped =
        layer(idem(&store, Duration::from_secs(120))).held_retry_after(Duration::from_secs(5));
    let server = Server::start(app(capped, effects.clone())).await;
    let other = Server::start(app(
        layer(idem(&store, Duration::from_secs(120))),
        effects.clone(),
    ))
    .await;
    let http = client();

    let failed = post(
        &http,
        &server.url("/payments"),
        Some("k"),
        "{}",
        &[("x-status", "503")],
    )
    .await;
    assert_eq!(failed.status, 503);
    let here = post(&http, &server.url("/payments"), Some("k"), "{}", &[]).await;
    assert_eq!((here.status, retry_after(&here)), (409, 5), "{here:?}");
    // The store cannot tell a held key from one in flight: another replica polls.
    let there = post(&http, &other.url("/payments"), Some("k"), "{}", &[]).await;
    assert_eq!((there.status, retry_after(&there)), (409, 1), "{there:?}");
    assert_eq!(effects.runs(), 1);
}

/// The layer remembers a held key for at most a lease from its answer, which may outlast
/// the store's lease (renewed last before the answer). A retry that took the key over in
/// between, on another replica, runs the request: a duplicate here is told to poll, not
/// that the key is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_taken_over_elsewhere_is_no_longer_held_here() {
    let store = MemoryStore::new();
    let effects = Effects::default();
    // Without heartbeats the lease ends a lease after the claim, and the held answer
    // comes 2 s into it: this layer remembers the key until 3 s after that answer.
    let unrenewed = || {
        Idempotency::builder(store.clone())
            .lease(Duration::from_secs(3))
            .heartbeat(Heartbeat::Off)
            .build()
            .expect("valid settings")
            .into_dyn()
    };
    let here = Server::start(app(layer(unrenewed()), effects.clone())).await;
    let there = Server::start(app(layer(unrenewed()), effects.clone())).await;
    let http = client();

    let failed = post(
        &http,
        &here.url("/payments"),
        Some("k"),
        "{}",
        &[("x-status", "500"), ("x-sleep-ms", "2000")],
    )
    .await;
    assert_eq!(failed.status, 500);
    // Past the store's lease, not past what this layer remembers.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let takeover = tokio::spawn({
        let (http, url) = (http.clone(), there.url("/payments"));
        async move { post(&http, &url, Some("k"), "{}", &[("x-sleep-ms", "1500")]).await }
    });
    effects.wait_for_runs(2).await;
    let duplicate = post(&http, &here.url("/payments"), Some("k"), "{}", &[]).await;
    assert_eq!(
        (duplicate.status, retry_after(&duplicate)),
        (409, 1),
        "{duplicate:?}"
    );
    assert!(
        !duplicate.json()["title"].as_str().unwrap().contains("held"),
        "{duplicate:?}"
    );
    assert_eq!(takeover.await.unwrap().status, 201);
}

/// A 500 known from its head is held from the moment its head goes out, not only once its
/// body has ended: a retry sent while the body still streams is told to wait for the
/// lease's end. A 200 still streaming is work in flight: polled again within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_while_a_held_answer_streams_is_told_it_is_held() {
    use axum::routing::post as route_post;
    let store = MemoryStore::new();
    // The body's second part waits for the test's retry to be answered: the retry comes
    // while the body streams, however slow the machine.
    let go_on = std::sync::Arc::new(tokio::sync::Notify::new());
    let released = std::sync::Arc::clone(&go_on);
    let app = axum::Router::new()
        .route(
            "/reports",
            route_post(move |headers: http::HeaderMap| async move {
                let status = headers
                    .get("x-status")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(200);
                let frames = futures_util::stream::unfold(0, move |step| {
                    let released = std::sync::Arc::clone(&released);
                    async move {
                        match step {
                            0 => Some((
                                Ok::<_, std::convert::Infallible>(bytes::Bytes::from_static(
                                    b"part 1\n",
                                )),
                                1,
                            )),
                            1 => {
                                released.notified().await;
                                Some((Ok(bytes::Bytes::from_static(b"part 2\n")), 2))
                            }
                            _ => None,
                        }
                    }
                });
                (
                    http::StatusCode::from_u16(status).unwrap(),
                    axum::body::Body::from_stream(frames),
                )
            }),
        )
        .layer(layer(idem(&store, Duration::from_secs(20))));
    let server = Server::start(app).await;
    let url = server.url("/reports");
    let http = client();
    for (status, held) in [("500", true), ("200", false)] {
        let key = format!("k-{status}");
        let first = http
            .post(&url)
            .header("idempotency-key", &key)
            .header("content-type", "application/json")
            .header("x-status", status)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(first.status().as_str(), status);
        // The head is here; the body's second part waits for this retry.
        let retried = post(&http, &url, Some(&key), "{}", &[("x-status", status)]).await;
        assert_eq!(retried.status, 409, "{retried:?}");
        assert_eq!(
            retried.json()["held"] == true,
            held,
            "{status}: {retried:?}"
        );
        match held {
            true => assert!(retry_after(&retried) > 1, "{retried:?}"),
            false => assert_eq!(retry_after(&retried), 1, "{retried:?}"),
        }
        go_on.notify_one();
        assert_eq!(first.text().await.unwrap(), "part 1\npart 2\n");
    }
}
