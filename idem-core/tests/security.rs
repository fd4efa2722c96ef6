//! Driver security and payments features on the memory store: metrics without raw scopes,
//! sagas whose undo cannot finish yet, encrypted raw bytes, reserved step names and
//! settings warnings.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{
    Aes256GcmCodec, Error, Fingerprint, Heartbeat, Idempotency, Key, ManualClock, MemoryStore,
    Outcome, Store, WorkError, driver::InterruptedKind, driver::Provider, driver::SettingsWarning,
    driver::TokenBucket, driver::observe,
};

const LEASE: Duration = Duration::from_secs(10);

fn key(scope: &str, name: &str) -> Key {
    Key::new(scope, name).unwrap()
}

#[test]
fn new_keys_are_counted_under_the_applications_label_never_the_scope() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let idem = Idempotency::builder(MemoryStore::new())
                .key_budget(TokenBucket::new(1, Duration::from_secs(3600)))
                .scope_label(|scope| scope.rsplit('/').next().unwrap_or("other").to_owned())
                .build()
                .unwrap();
            let ok = |_ctx| async { Ok::<_, WorkError<()>>(1) };
            let fp = Fingerprint::of_bytes("r");
            idem.execute(&key("acct_42/payments.create", "a"), fp, ok)
                .await
                .unwrap();
            idem.execute(&key("acct_42/payments.create", "a"), fp, ok)
                .await
                .unwrap(); // a replay is not new
            let refused = idem
                .execute(&key("acct_42/payments.create", "b"), fp, ok)
                .await;
            assert!(matches!(refused, Err(Error::KeyBudgetExhausted { .. })));
            idem.execute(&key("acct_7/refunds.create", "a"), fp, ok)
                .await
                .unwrap();
        });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let count = |name: &str, label: &str| {
        snapshot
            .iter()
            .filter(|(k, _, _, _)| {
                k.key().name() == name
                    && k.key()
                        .labels()
                        .any(|l| l.key() == "scope" && l.value() == label)
            })
            .map(|(_, _, _, v)| match v {
                DebugValue::Counter(n) => *n,
                _ => 0,
            })
            .sum::<u64>()
    };
    assert_eq!(count(observe::NEW_KEYS, "payments.create"), 1);
    assert_eq!(count(observe::NEW_KEYS, "refunds.create"), 1);
    assert_eq!(count(observe::KEY_BUDGET_REJECTIONS, "payments.create"), 1);
    for (k, _, _, _) in &snapshot {
        assert!(
            k.key().labels().all(|l| !l.value().contains("acct_")),
            "a raw scope reached a label: {k:?}"
        );
    }
}

#[tokio::test]
async fn an_undo_that_cannot_finish_yet_holds_the_key_until_a_takeover_finishes() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let idem = Idempotency::builder(store)
        .lease(LEASE)
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let k = key("orders", "refund-down");
    let fp = Fingerprint::of_bytes("order");
    let (charges, refunds) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let work = |refund_works: bool| {
        let (charges, refunds) = (Arc::clone(&charges), Arc::clone(&refunds));
        move |ctx: idem_core::Context| async move {
            ctx.step_with_undo(
                "charge",
                || async {
                    charges.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, WorkError<String>>(500u32)
                },
                move |amount: u32| async move {
                    if !refund_works {
                        return Err(WorkError::Retryable(format!(
                            "refund of {amount} timed out"
                        )));
                    }
                    refunds.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                },
            )
            .await?;
            Err::<(), _>(WorkError::Permanent("out of stock".to_string()))
        }
    };
    let first = idem.execute(&k, fp, work(false)).await;
    match &first {
        Err(err @ Error::CompensationPending { step }) => {
            assert_eq!(step, "charge");
            assert!(err.is_retryable());
        }
        other => panic!("an undo that timed out: {other:?}"),
    }
    let held = idem.execute(&k, fp, work(true)).await;
    assert!(
        matches!(held, Err(Error::InFlight { .. })),
        "the key stays held: {held:?}"
    );
    clock.advance(LEASE);
    let finished = idem.execute(&k, fp, work(true)).await.unwrap();
    let Outcome::Compensated {
        error,
        compensation,
        replayed: false,
    } = finished
    else {
        panic!("{finished:?}")
    };
    assert_eq!(error, "out of stock");
    assert_eq!(compensation.undone, ["charge"]);
    assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");
    assert_eq!(refunds.load(Ordering::SeqCst), 1, "refunded once");
}

#[tokio::test]
async fn raw_bytes_are_encrypted_too() {
    let store = MemoryStore::new();
    let idem = Idempotency::builder(store.clone())
        .codec(Aes256GcmCodec::new(3, [9; 32]))
        .build()
        .unwrap();
    let k = key("webhooks/stripe", "evt_1");
    let body = b"{\"customer\":\"Ada Lovelace\"}".to_vec();
    let work = |_ctx| {
        let body = body.clone();
        async move { Ok::<_, WorkError<Vec<u8>>>(body) }
    };
    let first = idem
        .execute_bytes(&k, Fingerprint::of_bytes("e"), work)
        .await
        .unwrap();
    assert_eq!(first.clone().value(), Some(body.clone()));
    let stored = store.get(&k).await.unwrap().unwrap().response.unwrap();
    assert!(!stored.windows(8).any(|w| w == b"Lovelace"));
    assert_eq!(stored.len(), body.len() + 33);
    let again = idem
        .execute_bytes(&k, Fingerprint::of_bytes("e"), work)
        .await
        .unwrap();
    assert!(again.replayed());
    assert_eq!(again.value(), Some(body));
}

#[tokio::test]
async fn idem_keeps_its_own_step_names() {
    let idem = Idempotency::new(MemoryStore::new());
    let answer = idem
        .execute(
            &key("s", "reserved"),
            Fingerprint::of_bytes("r"),
            |ctx| async move {
                ctx.step("idem.saga", || async { Ok::<_, WorkError<()>>(1) })
                    .await
            },
        )
        .await;
    match answer {
        Err(Error::Interrupted(interrupted)) => {
            assert_eq!(interrupted.kind(), InterruptedKind::InvalidStepName);
            let source = std::error::Error::source(&interrupted).unwrap().to_string();
            assert!(source.contains("idem."), "{source}");
        }
        other => panic!("a reserved step name: {other:?}"),
    }
}

#[test]
fn a_retention_shorter_than_a_providers_is_a_warning_not_an_error() {
    let idem = Idempotency::builder(MemoryStore::new())
        .retention(Duration::from_secs(3600))
        .provider(Provider::STRIPE)
        .provider(Provider::PAYPAL.with_retention(Duration::from_secs(3 * 3600)))
        .build()
        .unwrap();
    let names: Vec<_> = idem
        .warnings()
        .iter()
        .map(|warning| match warning {
            SettingsWarning::RetentionShorterThanProvider { provider, .. } => *provider,
            _ => "other",
        })
        .collect();
    assert_eq!(names, ["stripe", "paypal"]);
    let quiet = Idempotency::builder(MemoryStore::new())
        .retention(Duration::from_secs(31 * 24 * 3600))
        .provider(Provider::ADYEN)
        .build()
        .unwrap();
    assert!(quiet.warnings().is_empty());
}
