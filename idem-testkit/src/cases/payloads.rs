//! Responses replayed byte for byte, records at their size limit, and keys at the edges
//! of the rules.

use idem_core::record::ValuePart;
use idem_core::{
    Key, State, Store, StoreError, key::MAX_PART_LEN, key::StepName, store::ClaimOutcome,
    store::WriteOutcome,
};

use crate::Capabilities;
use crate::support::{HOUR, claim, claimed, get_some, key, ok, request};

fn step(name: &str) -> StepName {
    StepName::new(name).expect("valid step name")
}

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
            Err(StoreError::TooLarge {
                part: ValuePart::Result,
                size,
                limit: said,
            }) => {
                assert_eq!((size, said), (over.len(), limit));
            }
            other => {
                panic!(
                    "one byte over the declared limit must be TooLarge (the result), got {other:?}"
                )
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

        // The same bytes as a permanent failure: refused alike, for the same reason.
        let k = key("payloads", "one-byte-over-failed");
        let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
        match store.fail(&lease, &over).await {
            Err(StoreError::TooLarge {
                part: ValuePart::Failure,
                size,
                limit: said,
            }) => {
                assert_eq!((size, said), (over.len(), limit));
            }
            other => panic!(
                "a failure one byte over the declared limit must be TooLarge (the failure), got {other:?}"
            ),
        }
        let record = get_some(store, &k).await;
        assert_eq!(
            (record.state, record.response),
            (State::InProgress, None),
            "a refused failure writes nothing"
        );
        assert_eq!(
            ok(store.fail(&lease, b"small").await, "fail"),
            WriteOutcome::Applied
        );
        assert_eq!(
            claim(store, &request(&k, "a", HOUR, HOUR)).await,
            ClaimOutcome::replay_failure(b"small".to_vec())
        );
    }
}

/// The size error a refused checkpoint must be, or a panic naming what the store did.
fn expect_step_too_large(
    answer: Result<WriteOutcome, StoreError>,
    step: &str,
    size: usize,
    limit: usize,
    what: &str,
) {
    match answer {
        Err(StoreError::TooLarge {
            part: ValuePart::Step(named),
            size: said,
            limit: declared,
        }) => assert_eq!(
            (named.as_str(), said, declared),
            (step, size, limit),
            "{what}: TooLarge names the step, its size (name and value) and the limit"
        ),
        other => panic!("{what} must be TooLarge (the step), the store answered {other:?}"),
    }
}

/// The size error a refused result or failure must be, or a panic naming what the store
/// did.
fn expect_response_too_large(
    answer: Result<WriteOutcome, StoreError>,
    part: ValuePart,
    size: usize,
    limit: usize,
    what: &str,
) {
    match answer {
        Err(StoreError::TooLarge {
            part: named,
            size: said,
            limit: declared,
        }) => assert_eq!(
            (named, said, declared),
            (part, size, limit),
            "{what}: TooLarge names the value (result or failure), its size and the limit"
        ),
        other => panic!("{what} must be TooLarge, the store answered {other:?}"),
    }
}

pub(crate) async fn steps_count_toward_the_record_limit(store: &dyn Store) {
    let Some(limit) = store.max_record_bytes() else {
        // A store that declares no limit must have none that bites at the sizes the
        // driver allows: two 1 MiB checkpoints and a 1 MiB result beside them all land.
        let k = key("limits", "no-limit");
        let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
        let mib = |byte: u8| vec![byte; 1024 * 1024];
        for (name, byte) in [("first", 1), ("second", 2)] {
            assert_eq!(
                ok(
                    store.checkpoint(&lease, &step(name), &mib(byte)).await,
                    "checkpoint"
                ),
                WriteOutcome::Applied,
                "a store without a declared limit takes a 1 MiB checkpoint beside others"
            );
        }
        assert_eq!(
            ok(store.complete(&lease, &mib(3)).await, "complete"),
            WriteOutcome::Applied
        );
        let record = get_some(store, &k).await;
        assert_eq!(record.steps.get("first"), Some(&mib(1)));
        assert_eq!(record.steps.get("second"), Some(&mib(2)));
        assert_eq!(record.response, Some(mib(3)));
        return;
    };
    // Well over the limit together, well under it alone: a store whose limit is only
    // approximate (DynamoDB's counts its own attribute overhead) still decides these.
    let part = limit / 10 * 6;
    let big = |byte: u8| vec![byte; part];

    // A checkpoint too large on its own.
    let k = key("limits", "step-alone");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    let huge = vec![1; limit];
    expect_step_too_large(
        store.checkpoint(&lease, &step("huge"), &huge).await,
        "huge",
        "huge".len() + limit,
        limit,
        "a checkpoint over the limit on its own",
    );
    assert!(
        get_some(store, &k).await.steps.is_empty(),
        "a refused checkpoint writes nothing"
    );

    // A checkpoint that fits alone, not beside another; rewriting a step counts its old
    // value out.
    let k = key("limits", "beside");
    let (lease, _, _) = claimed(store, &request(&k, "a", HOUR, HOUR)).await;
    assert_eq!(
        ok(
            store.checkpoint(&lease, &step("s1"), &big(1)).await,
            "checkpoint"
        ),
        WriteOutcome::Applied
    );
    let before = get_some(store, &k).await;
    expect_step_too_large(
        store.checkpoint(&lease, &step("s2"), &big(2)).await,
        "s2",
        "s2".len() + part,
        limit,
        "a checkpoint that fits alone but not beside the record's steps",
    );
    assert_eq!(
        get_some(store, &k).await,
        before,
        "a refused checkpoint writes nothing"
    );
    assert_eq!(
        ok(
            store.checkpoint(&lease, &step("s1"), &big(3)).await,
            "checkpoint"
        ),
        WriteOutcome::Applied,
        "a step rewritten with a value of its old size fits in its old room"
    );
    let before = get_some(store, &k).await;
    assert_eq!(before.steps.get("s1"), Some(&big(3)));

    // A result, then a failure, that fit alone but not beside that step.
    expect_response_too_large(
        store.complete(&lease, &big(4)).await,
        ValuePart::Result,
        part,
        limit,
        "a result that fits alone but not beside the record's steps",
    );
    expect_response_too_large(
        store.fail(&lease, &big(5)).await,
        ValuePart::Failure,
        part,
        limit,
        "a failure that fits alone but not beside the record's steps",
    );
    assert_eq!(
        get_some(store, &k).await,
        before,
        "a refused result or failure writes nothing: still in progress, steps kept"
    );
    // Still the owner's to finish, with a result that fits.
    let small = vec![6; limit / 10 * 3];
    assert_eq!(
        ok(store.complete(&lease, &small).await, "complete"),
        WriteOutcome::Applied
    );
    let done = get_some(store, &k).await;
    assert_eq!(done.state, State::Completed);
    assert!(done.response.as_deref() == Some(&small[..]));
    assert!(
        claim(store, &request(&k, "a", HOUR, HOUR)).await == ClaimOutcome::replay(small),
        "the smaller result replays"
    );
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
