//! Responses replayed byte for byte, and keys at the edges of the rules.

use idem_core::{ClaimOutcome, Key, MAX_PART_LEN, State, Store, StoreError, WriteOutcome};

use crate::Capabilities;
use crate::support::{HOUR, claim, claimed, get_some, key, ok, request};

/// Completes a fresh key with `response` and checks that a retry gets exactly those bytes.
async fn round_trip(store: &dyn Store, name: &str, response: &[u8]) {
    let k = key("payloads", name);
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert_eq!(
        ok(store.complete(&lease, response).await, "complete"),
        WriteOutcome::Applied
    );
    match claim(store, &request(&k, "a", HOUR, HOUR)).await {
        ClaimOutcome::Replay {
            response: replayed, ..
        } => {
            assert!(
                replayed == response,
                "{name}: replayed {} bytes differ from the {} stored",
                replayed.len(),
                response.len()
            );
        }
        other => panic!("{name}: expected a replay, the store answered {other:?}"),
    }
    assert!(
        get_some(store, &k).await.response.as_deref() == Some(response),
        "{name}: get returns other bytes"
    );

    // The same bytes as a permanent failure.
    let k = key("payloads", &format!("{name}-failed"));
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert_eq!(
        ok(store.fail(&lease, response).await, "fail"),
        WriteOutcome::Applied
    );
    match claim(store, &request(&k, "a", HOUR, HOUR)).await {
        ClaimOutcome::ReplayFailure {
            response: replayed, ..
        } => {
            assert!(
                replayed == response,
                "{name}: replayed failure differs from the stored one"
            );
        }
        other => panic!("{name}: expected a replayed failure, the store answered {other:?}"),
    }
}

pub(crate) async fn replays_are_byte_exact(store: &dyn Store) {
    round_trip(store, "empty", b"").await;
    let all_bytes: Vec<u8> = (0..=255).collect();
    round_trip(store, "all-256-byte-values", &all_bytes).await;
    round_trip(
        store,
        "invalid-utf8-and-nul",
        b"\xff\xfe\x00\x00{\"a\":1}\x00",
    )
    .await;
}

pub(crate) async fn large_responses_replay_or_are_refused(store: &dyn Store, caps: &Capabilities) {
    let limit = store.max_record_bytes();
    let size = limit.unwrap_or(caps.max_response_bytes);
    // A pattern that is not all one byte, so truncation or reordering shows.
    let large: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    round_trip(store, "largest", &large).await;

    if let Some(limit) = limit {
        let k = key("payloads", "one-byte-over");
        let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
        let mut over = large;
        over.push(7);
        match store.complete(&lease, &over).await {
            Err(StoreError::ResponseTooLarge { size, limit: said }) => {
                assert_eq!((size, said), (over.len(), limit));
            }
            other => {
                panic!("one byte over the declared limit must be ResponseTooLarge, got {other:?}")
            }
        }
        let record = get_some(store, &k).await;
        assert_eq!(
            record.state,
            State::InProgress,
            "a refused response writes nothing"
        );
        assert_eq!(record.response, None);
        assert_eq!(
            ok(store.complete(&lease, b"small").await, "complete"),
            WriteOutcome::Applied
        );
    }
}

pub(crate) async fn keys_at_the_limits(store: &dyn Store) {
    let longest = "k".repeat(MAX_PART_LEN);
    let keys = [
        Key::new("s".repeat(MAX_PART_LEN), longest.clone()).expect("255 bytes is allowed"),
        Key::new("bestellungen/zahlung", "schlüssel-✓-鍵-🔑").expect("unicode is allowed"),
        // 85 three-byte characters: 255 bytes exactly.
        Key::new("scope", "鍵".repeat(85)).expect("255 bytes is allowed"),
        Key::new(
            "with spaces and {braces}",
            "quotes ' \" and \\ slashes; DROP TABLE",
        )
        .expect("valid"),
    ];
    for (i, k) in keys.iter().enumerate() {
        let (lease, _, _) = claimed(store, &request(k, "a", HOUR, HOUR)).await;
        let response = format!("response {i}");
        assert_eq!(
            ok(
                store.complete(&lease, response.as_bytes()).await,
                "complete"
            ),
            WriteOutcome::Applied
        );
        let record = get_some(store, k).await;
        assert_eq!(&record.key, k, "the key reads back exactly");
        assert_eq!(record.response.as_deref(), Some(response.as_bytes()));
    }
    // A key one character short of another is a different record.
    let short = Key::new("s".repeat(MAX_PART_LEN), "k".repeat(MAX_PART_LEN - 1)).expect("valid");
    let (lease, _, _) = claimed(store, &request(&short, "b", HOUR, HOUR)).await;
    assert_eq!(lease.token, 1);
}
