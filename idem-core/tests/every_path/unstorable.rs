//! What the store cannot hold: a failure, a step or a result too large or not
//! serialisable, a record the steps filled, and what a compensation still records then.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::driver::{InterruptedKind, Unstorable};
use idem_core::record::ValuePart;
use idem_core::{
    Error, Heartbeat, Idempotency, ManualClock, MemoryStore, State, Store, WorkError,
    store::Operation,
};

use crate::support::{
    Fault, Faulty, LEASE, Ledger, TIMEOUT, charge_then_fail, driver, fp, key, store_on,
};

#[tokio::test(start_paused = true)]
async fn a_failure_the_store_cannot_hold_is_stored_as_a_marker() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    // The store refuses failures over 100 bytes, without saying so up front.
    store.set(Operation::Fail, Fault::FailLimit(100));
    let runs = AtomicUsize::new(0);
    let work = |_ctx| async {
        runs.fetch_add(1, Ordering::SeqCst);
        Err::<String, _>(WorkError::Permanent("x".repeat(500)))
    };
    let first = idem.execute(&key("too-large"), fp(), work).await;
    assert!(
        matches!(
            first,
            Err(Error::Unstorable {
                part: ValuePart::Failure,
                reason: Unstorable::TooLarge { limit: 100, .. },
                ..
            })
        ),
        "{first:?}"
    );
    let record = store.get(&key("too-large")).await.unwrap().unwrap();
    assert_eq!(record.state, State::Failed, "the key is not held");
    clock.advance(2 * LEASE);
    let again = idem.execute(&key("too-large"), fp(), work).await;
    assert!(matches!(
        again,
        Err(Error::Unstorable {
            part: ValuePart::Failure,
            reason: Unstorable::TooLarge { .. },
            replayed: true,
            ..
        })
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// An error that does not serialise.
#[derive(Debug, serde::Deserialize)]
struct Opaque;

impl serde::Serialize for Opaque {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("opaque"))
    }
}

#[tokio::test(start_paused = true)]
async fn a_failure_that_cannot_be_stored_still_undoes_the_steps() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    let ledger = Ledger::default();
    let l = ledger.clone();
    let outcome = idem
        .execute(&key("opaque"), fp(), move |ctx| async move {
            let l2 = l.clone();
            ctx.step_with_undo(
                "charge",
                || async { Ok::<_, WorkError<Opaque>>(()) },
                move |()| async move {
                    l2.add("refund");
                    Ok(())
                },
            )
            .await?;
            Err::<(), _>(WorkError::Permanent(Opaque))
        })
        .await;
    assert!(
        matches!(
            outcome,
            Err(Error::Unstorable {
                reason: Unstorable::Unserializable,
                ..
            })
        ),
        "{outcome:?}"
    );
    assert_eq!(ledger.count("refund"), 1, "the charge was refunded");
    let record = store.get(&key("opaque")).await.unwrap().unwrap();
    assert_eq!(record.state, State::Failed);
}

#[tokio::test(start_paused = true)]
async fn a_record_the_steps_filled_still_records_what_to_undo() {
    let clock = ManualClock::new();
    let mut faulty = Faulty::new(MemoryStore::with_clock(clock.clone()));
    faulty.limit = Some(4096);
    let store = Arc::new(faulty);
    let idem = driver(&store);
    let ledger = Ledger::default();
    let l = ledger.clone();
    let outcome = idem
        .execute(&key("full"), fp(), move |ctx| async move {
            let l2 = l.clone();
            ctx.step_with_undo(
                "charge",
                || async { Ok::<_, WorkError<String>>(()) },
                move |()| async move {
                    l2.add("refund");
                    Ok(())
                },
            )
            .await?;
            // A step that fills the record to just under what the work's own steps may
            // take, leaving less than the room kept for a failure marker.
            ctx.step("label", || async {
                Ok::<_, WorkError<String>>("x".repeat(3530))
            })
            .await?;
            Err::<(), _>(WorkError::Permanent("declined".to_string()))
        })
        .await;
    assert_eq!(
        ledger.count("refund"),
        1,
        "the charge was refunded: {outcome:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_step_whose_value_cannot_be_stored_is_reported_pending() {
    let clock = ManualClock::new();
    let mut faulty = Faulty::new(MemoryStore::with_clock(clock.clone()));
    faulty.limit = Some(4096);
    let store = Arc::new(faulty);
    let idem = driver(&store);
    let outcome = idem
        .execute(&key("unstorable-step"), fp(), |ctx| async move {
            ctx.step_with_undo(
                "charge",
                || async { Ok::<_, WorkError<String>>("r".repeat(8000)) },
                |_receipt: String| async { Ok(()) },
            )
            .await?;
            Ok::<(), WorkError<String>>(())
        })
        .await;
    assert!(
        matches!(
            outcome,
            Err(Error::Unstorable {
                part: ValuePart::Step(_),
                reason: Unstorable::TooLarge { .. },
                ..
            })
        ),
        "{outcome:?}"
    );
    let record = store.get(&key("unstorable-step")).await.unwrap().unwrap();
    let stored = String::from_utf8(record.response.unwrap()).unwrap();
    assert!(
        stored.contains("\"pending\":[\"charge\"]"),
        "the charge is reported for an operator: {stored}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_result_refused_as_too_large_then_a_caller_gone_holds_no_key() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    // The store takes its time to refuse the result, and the caller leaves meanwhile.
    store.set(Operation::Complete, Fault::SlowLimit(TIMEOUT / 2, 100));
    let runs = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&runs);
    let gave_up = tokio::time::timeout(
        TIMEOUT / 4,
        idem.execute(&key("refused-then-gone"), fp(), move |_ctx| async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok::<_, WorkError<String>>("x".repeat(500))
        }),
    )
    .await;
    assert!(
        gave_up.is_err(),
        "the caller left while the result was on its way"
    );
    tokio::time::sleep(5 * TIMEOUT).await;
    let record = store.get(&key("refused-then-gone")).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        State::Failed,
        "the marker landed without the caller"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_undo_error_too_large_for_its_mark_still_stops_the_compensation() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = Idempotency::builder(Arc::clone(&store))
        .lease(LEASE)
        .heartbeat(Heartbeat::Off)
        .store_timeout(TIMEOUT)
        .max_response_bytes(1024)
        .build()
        .unwrap();
    let ledger = Ledger::default();
    let k = key("undo-error-large");
    let work = |ledger: Ledger| {
        move |ctx: idem_core::Context| async move {
            let l = ledger.clone();
            ctx.step_with_undo(
                "reserve",
                || async { Ok::<_, WorkError<String>>(()) },
                move |()| async move {
                    l.add("release");
                    Ok(())
                },
            )
            .await?;
            ctx.step_with_undo(
                "charge",
                || async { Ok::<_, WorkError<String>>(()) },
                |()| async { Err(WorkError::Permanent("x".repeat(2000))) },
            )
            .await?;
            Err::<(), _>(WorkError::Permanent("declined".to_string()))
        }
    };
    let first = idem.execute(&k, fp(), work(ledger.clone())).await;
    clock.advance(2 * LEASE);
    let again = idem.execute(&k, fp(), work(ledger.clone())).await;
    assert_eq!(
        ledger.count("release"),
        0,
        "an undo that failed for good stops the compensation: {first:?} then {again:?}"
    );
    let record = store.get(&k).await.unwrap().unwrap();
    assert_eq!(record.state, State::Failed);
    let stored = String::from_utf8(record.response.unwrap()).unwrap();
    assert!(stored.contains("\"pending\":[\"reserve\"]"), "{stored}");
}

#[tokio::test(start_paused = true)]
async fn a_record_with_no_room_to_compensate_reports_every_step_pending() {
    let clock = ManualClock::new();
    let mut faulty = Faulty::new(MemoryStore::with_clock(clock.clone()));
    faulty.limit = Some(4096);
    let store = Arc::new(faulty);
    let idem = driver(&store);
    const NAMES: [&str; 12] = [
        "reserve-the-stock-in-warehouse-01",
        "reserve-the-stock-in-warehouse-02",
        "reserve-the-stock-in-warehouse-03",
        "reserve-the-stock-in-warehouse-04",
        "reserve-the-stock-in-warehouse-05",
        "reserve-the-stock-in-warehouse-06",
        "reserve-the-stock-in-warehouse-07",
        "reserve-the-stock-in-warehouse-08",
        "reserve-the-stock-in-warehouse-09",
        "reserve-the-stock-in-warehouse-10",
        "reserve-the-stock-in-warehouse-11",
        "reserve-the-stock-in-warehouse-12",
    ];
    let outcome = idem
        .execute(&key("no-room"), fp(), |ctx| async move {
            for name in NAMES {
                ctx.step_with_undo(
                    name,
                    || async { Ok::<_, WorkError<String>>(()) },
                    |()| async { Ok(()) },
                )
                .await?;
            }
            ctx.step("label", || async {
                Ok::<_, WorkError<String>>("x".repeat(3050))
            })
            .await?;
            Err::<(), _>(WorkError::Permanent("declined".to_string()))
        })
        .await;
    assert!(outcome.is_err(), "{outcome:?}");
    let record = store.get(&key("no-room")).await.unwrap().unwrap();
    let stored: serde_json::Value = serde_json::from_slice(&record.response.unwrap()).unwrap();
    let pending = &stored["compensation"]["pending"];
    assert_eq!(
        pending.as_array().map(Vec::len),
        Some(NAMES.len()),
        "every step reported pending, none undone: {stored}"
    );
    assert!(
        stored["compensation"]
            .get("undone")
            .is_none_or(|u| u == &serde_json::json!([]))
    );
}

#[tokio::test(start_paused = true)]
async fn a_compensated_failure_the_store_refuses_keeps_what_was_undone() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    // The store refuses failures over 200 bytes without saying so up front: the work's
    // long error does not fit, the marker with what was undone does.
    store.set(Operation::Fail, Fault::FailLimit(200));
    let ledger = Ledger::default();
    let outcome = idem
        .execute(
            &key("refused-compensated"),
            fp(),
            charge_then_fail(ledger.clone(), false, "x".repeat(300)),
        )
        .await;
    assert!(
        matches!(
            outcome,
            Err(Error::Unstorable {
                part: ValuePart::Failure,
                reason: Unstorable::TooLarge { .. },
                ..
            })
        ),
        "{outcome:?}"
    );
    assert_eq!(ledger.count("refund"), 1);
    let record = store
        .get(&key("refused-compensated"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, State::Failed);
    let stored: serde_json::Value = serde_json::from_slice(&record.response.unwrap()).unwrap();
    assert_eq!(
        stored["compensation"]["undone"],
        serde_json::json!(["charge"]),
        "what was undone stays with the marker: {stored}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failure_too_large_for_the_saga_checkpoint_still_undoes_its_steps() {
    let clock = ManualClock::new();
    let mut faulty = Faulty::new(MemoryStore::with_clock(clock.clone()));
    faulty.limit = Some(4096);
    let store = Arc::new(faulty);
    let idem = driver(&store);
    let ledger = Ledger::default();
    // Too large for the record: the saga checkpoints the marker saying so instead.
    let outcome = idem
        .execute(
            &key("huge-failure"),
            fp(),
            charge_then_fail(ledger.clone(), false, "x".repeat(8192)),
        )
        .await;
    assert_eq!(
        ledger.count("refund"),
        1,
        "the charge was refunded: {outcome:?}"
    );
    assert!(
        matches!(
            outcome,
            Err(Error::Unstorable {
                part: ValuePart::Failure,
                reason: Unstorable::TooLarge { size, .. },
                ..
            }) if size > 8192
        ),
        "{outcome:?}"
    );
}

/// A record filled so that an undo's start mark fits and its end mark does not: the error
/// names the end mark and its own size (`1:true` under `idem.undone:STEP`), nothing else.
#[tokio::test(start_paused = true)]
async fn an_undo_end_mark_that_does_not_fit_is_reported_with_its_own_size() {
    // Ten steps fill the work's room (the record's 4096 bytes less the 512 kept for a
    // marker), which leaves idem's own checkpoints 384 bytes: the saga's checkpoint, then
    // two marks per undo, 41 bytes, more than fit. A failure one byte longer each time
    // moves where the room runs out, until it is between an undo's start and its end.
    const STEPS: [&str; 10] = ["s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9"];
    let padding = "v".repeat(4096 - 512 - 9 * ("s1".len() + "null".len()) - "s0".len() - 2);
    let mut found = None;
    for length in 1..=41 {
        let clock = ManualClock::new();
        let mut faulty = Faulty::new(MemoryStore::with_clock(clock.clone()));
        faulty.limit = Some(4096);
        let store = Arc::new(faulty);
        let padding = padding.clone();
        let outcome = driver(&store)
            .execute(&key("end-mark"), fp(), move |ctx| async move {
                ctx.step_with_undo(
                    STEPS[0],
                    || async { Ok::<_, WorkError<String>>(padding) },
                    |_| async { Ok(()) },
                )
                .await?;
                for step in &STEPS[1..] {
                    ctx.step_with_undo(
                        step,
                        || async { Ok::<_, WorkError<String>>(()) },
                        |()| async { Ok(()) },
                    )
                    .await?;
                }
                Err::<(), _>(WorkError::Permanent("x".repeat(length)))
            })
            .await;
        if let Err(Error::Interrupted(interrupted)) = &outcome
            && let Some(mark) = interrupted.step()
            && mark.starts_with("idem.undone:")
        {
            assert_eq!(interrupted.kind(), InterruptedKind::Unstorable);
            found = Some((length, mark.to_owned(), interrupted.to_string()));
            break;
        }
    }
    let (length, mark, message) =
        found.expect("some failure's length leaves room for a start mark and not its end");
    let size = mark.len() + "1:true".len();
    assert!(
        message.contains(&format!("is {size} bytes")),
        "failure of {length}: {message}"
    );
}
