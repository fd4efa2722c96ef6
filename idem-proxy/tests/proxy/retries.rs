//! What a retry gets: the first response, refusals that run nothing, status policies,
//! a client that went away, the scoped key the upstream is sent, key budgets.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use idem_core::MemoryStore;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_answered_with_the_first_response_and_the_upstream_runs_once() {
    let up = Upstream::default();
    let addr = upstream(up.clone()).await;
    let proxy = proxy(&config(addr, ""), Arc::new(MemoryStore::new())).await;
    let url = proxy.url("/payments");

    let first = pay_once(&url, "acct_1", Some("k1"), r#"{"amount":5,"sent_at":1}"#).await;
    assert_eq!(first.0, StatusCode::CREATED, "{first:?}");
    // The same request again, its timestamp changed (ignored), its members reordered.
    let retry = pay_once(&url, "acct_1", Some("k1"), r#"{"sent_at":2, "amount":5}"#).await;
    assert_eq!(retry.0, StatusCode::CREATED);
    assert_eq!(retry.2, first.2, "the first response, byte for byte");
    assert_eq!(retry.1["idempotent-replayed"], "true");
    assert_eq!(up.runs("k1"), 1);

    // Another body under the key: 422, nothing runs.
    let changed = pay_once(&url, "acct_1", Some("k1"), r#"{"amount":6}"#).await;
    assert_eq!(changed.0, StatusCode::UNPROCESSABLE_ENTITY, "{changed:?}");
    // Another account's same key is its own operation.
    let other = pay_once(&url, "acct_2", Some("k1"), r#"{"amount":5}"#).await;
    assert_eq!(other.0, StatusCode::CREATED);
    assert_ne!(other.2, first.2);
    assert_eq!(up.runs("k1"), 2);

    // The upstream saw the key, and where the request came from; no hop-by-hop header.
    let seen = up.seen.lock().unwrap().clone().unwrap();
    assert_eq!(seen["idempotency-key"], "k1");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert_eq!(
        seen["host"],
        addr.to_string().as_str(),
        "the upstream's own authority"
    );
    assert_eq!(seen["x-forwarded-host"], proxy.addr.to_string().as_str());
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_required_scopes_too_and_refusals_run_nothing() {
    let (up, proxy) = started("").await;
    let url = proxy.url("/payments");

    let no_key = pay_once(&url, "acct_1", None, "{}").await;
    assert_eq!(no_key.0, StatusCode::BAD_REQUEST, "{no_key:?}");
    assert!(no_key.2.contains("missing-key"), "{no_key:?}");

    let response = client()
        .post(&url)
        .header("idempotency-key", "k2")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401, "no account, no scope");
    assert_eq!(up.total(), 0);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_policy_releases_what_the_upstream_says_did_nothing() {
    let (up, proxy) = started("status = { release = [409] }").await;
    let url = proxy.url("/payments");
    *up.status.lock().unwrap() = Some(StatusCode::CONFLICT);
    let first = pay_once(&url, "acct_1", Some("k5"), "{}").await;
    assert_eq!(first.0, StatusCode::CONFLICT);
    // Released: the retry reaches the upstream again.
    *up.status.lock().unwrap() = None;
    let retry = pay_once(&url, "acct_1", Some("k5"), "{}").await;
    assert_eq!(retry.0, StatusCode::CREATED, "{retry:?}");
    assert_eq!(up.runs("k5"), 2);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstreams_408_is_held_unless_the_route_releases_it() {
    // By default a 408 is held: after the proxy sent the whole request, it is a timeout
    // that may have cut the upstream off after its effect.
    let (up, proxy) = started("").await;
    let url = proxy.url("/payments");
    *up.status.lock().unwrap() = Some(StatusCode::REQUEST_TIMEOUT);
    assert_eq!(
        pay_once(&url, "acct_1", Some("k408"), "{}").await.0,
        StatusCode::REQUEST_TIMEOUT
    );
    *up.status.lock().unwrap() = None;
    let held = pay_once(&url, "acct_1", Some("k408"), "{}").await;
    assert_eq!(held.0, StatusCode::CONFLICT, "{held:?}");
    assert_eq!(up.runs("k408"), 1);
    proxy.shutdown().await;
    // An upstream whose 408 means "your body came too slowly, nothing ran" says so.
    let (up, proxy) = started("status = { release = [408] }").await;
    let url = proxy.url("/payments");
    *up.status.lock().unwrap() = Some(StatusCode::REQUEST_TIMEOUT);
    pay_once(&url, "acct_1", Some("k408"), "{}").await;
    *up.status.lock().unwrap() = None;
    let again = pay_once(&url, "acct_1", Some("k408"), "{}").await;
    assert_eq!(again.0, StatusCode::CREATED, "{again:?}");
    assert_eq!(up.runs("k408"), 2);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_still_gets_the_answer_on_its_retry() {
    let (up, proxy) = started("").await;
    let url = proxy.url("/payments");
    *up.delay.lock().unwrap() = Duration::from_millis(500);
    // The client gives up after 100 ms, while the upstream works.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let gone = impatient
        .post(&url)
        .header("x-account-id", "acct_1")
        .header("content-type", "application/json")
        .header("idempotency-key", "k9")
        .body("{}")
        .send()
        .await;
    assert!(gone.is_err(), "the client timed out");
    *up.delay.lock().unwrap() = Duration::ZERO;
    // Its retry, once the upstream finished, replays the answer.
    let mut answer = None;
    for _ in 0..50 {
        let retry = pay_once(&url, "acct_1", Some("k9"), "{}").await;
        if retry.0 == StatusCode::CREATED {
            answer = Some(retry);
            break;
        }
        assert_eq!(retry.0, StatusCode::CONFLICT, "{retry:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = answer.expect("the answer was stored");
    assert_eq!(answer.1["idempotent-replayed"], "true");
    assert_eq!(up.runs("k9"), 1);
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_gets_a_scoped_key_that_two_callers_never_share() {
    let (up, proxy) = started("").await;
    let url = proxy.url("/payments");
    let scoped = |up: &Upstream| {
        let seen = up.seen.lock().unwrap().clone().expect("a request arrived");
        assert_eq!(
            seen["idempotency-key"], "order-1",
            "the client's key, as sent"
        );
        seen["idempotency-scoped-key"].to_str().unwrap().to_owned()
    };
    let (status, _, _) = pay_once(&url, "acct_a", Some("order-1"), "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    let a = scoped(&up);
    assert!(a.starts_with("idem-") && a.len() == 5 + 64, "{a}");
    // Another caller's same key: another scoped key.
    let (status, _, _) = pay_once(&url, "acct_b", Some("order-1"), "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    let b = scoped(&up);
    assert_ne!(a, b);
    // A client cannot name one: a keyless request to no route carries none of its own.
    let forged = client()
        .post(proxy.url("/free"))
        .header("idempotency-scoped-key", "idem-forged")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 201);
    let seen = up.seen.lock().unwrap().clone().unwrap();
    assert!(!seen.contains_key("idempotency-scoped-key"), "{seen:?}");
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_s_key_budget_refuses_new_keys_past_it_and_replays_the_rest() {
    let (up, proxy) = started(r#"key_budget = { keys = 2, per = "1h" }"#).await;
    let url = proxy.url("/payments");
    for key in ["k1", "k2"] {
        let (status, _, _) = pay_once(&url, "acct_a", Some(key), "{}").await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let (status, headers, body) = pay_once(&url, "acct_a", Some("k3"), "{}").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(headers.contains_key("retry-after"));
    // Keys it has replay; another caller has a budget of its own.
    let (status, headers, _) = pay_once(&url, "acct_a", Some("k1"), "{}").await;
    assert_eq!(
        (status, &headers["idempotent-replayed"]),
        (StatusCode::CREATED, &"true".parse().unwrap())
    );
    let (status, _, _) = pay_once(&url, "acct_b", Some("k3"), "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!((up.runs("k3"), up.total()), (1, 3));
    proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_budget_is_the_caller_s_across_the_paths_of_its_route() {
    let up = Upstream::default();
    let toml = config(
        upstream(up.clone()).await,
        r#"key_budget = { keys = 2, per = "1h" }"#,
    )
    .replace("path = \"/payments\"", "path = \"/{name}\"");
    let proxy = proxy(&toml, Arc::new(MemoryStore::new())).await;
    let (status, _, _) = pay_once(&proxy.url("/payments"), "acct_a", Some("k1"), "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, _) = pay_once(&proxy.url("/free"), "acct_a", Some("k2"), "{}").await;
    assert_eq!(status, StatusCode::CREATED);
    // Another path of the same route is no fresh budget.
    let (status, _, body) = pay_once(&proxy.url("/payments"), "acct_a", Some("k3"), "{}").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(up.total(), 2);
    proxy.shutdown().await;
}
