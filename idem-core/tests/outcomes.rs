//! The driver on the memory store with a manual clock: deterministic, no sleeping.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::driver::Unstorable;
use idem_core::{
    ConfigError, Context, Error, Fingerprint, Idempotency, Key, ManualClock, MemoryStore, Outcome,
    Record, State, Store, StoreError, WorkError, key::StepName, record::Lease, record::ValuePart,
    store::ClaimOutcome, store::ClaimRequest, store::Operation, store::RenewOutcome,
    store::WriteOutcome,
};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

const LEASE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    charge_id: String,
    amount: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum PaymentError {
    Declined,
    ProviderDown,
    TimedOut,
}

fn setup() -> (Idempotency<MemoryStore>, ManualClock) {
    let clock = ManualClock::new();
    let idem = Idempotency::builder(MemoryStore::with_clock(clock.clone()))
        .lease(LEASE)
        .build()
        .expect("valid settings");
    (idem, clock)
}

fn key() -> Key {
    Key::new("acct_42/payments.create", "order-1187").expect("valid")
}

fn fingerprint(amount: u64) -> Fingerprint {
    Fingerprint::builder()
        .field("EUR")
        .field(amount.to_be_bytes())
        .finish()
}

/// Work that counts its runs and returns a receipt.
fn charge(
    runs: &Arc<AtomicUsize>,
) -> impl FnOnce(idem_core::Context) -> std::future::Ready<Result<Receipt, WorkError<PaymentError>>>
{
    let runs = Arc::clone(runs);
    move |_ctx| {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        std::future::ready(Ok(Receipt {
            charge_id: format!("ch_{n}"),
            amount: 500,
        }))
    }
}

#[tokio::test]
async fn runs_once_and_replays_the_first_result() {
    let (idem, _) = setup();
    let runs = Arc::new(AtomicUsize::new(0));
    let first = idem
        .execute(&key(), fingerprint(500), charge(&runs))
        .await
        .unwrap();
    assert!(!first.replayed());
    let value = first.value().unwrap();
    for _ in 0..5 {
        let again = idem
            .execute(&key(), fingerprint(500), charge(&runs))
            .await
            .unwrap();
        assert_eq!(
            again,
            Outcome::Completed {
                value: value.clone(),
                replayed: true
            }
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_changed_request_under_the_same_key_is_a_mismatch() {
    let (idem, _) = setup();
    let runs = Arc::new(AtomicUsize::new(0));
    idem.execute(&key(), fingerprint(500), charge(&runs))
        .await
        .unwrap();
    let err = idem
        .execute(&key(), fingerprint(900), charge(&runs))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Mismatch), "{err:?}");
    assert!(!err.is_retryable());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_permanent_failure_is_stored_and_replayed() {
    let (idem, _) = setup();
    let runs = Arc::new(AtomicUsize::new(0));
    for attempt in 0..3 {
        let runs = Arc::clone(&runs);
        let outcome = idem
            .execute(&key(), fingerprint(500), move |_ctx| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Err::<Receipt, _>(WorkError::Permanent(PaymentError::Declined))
            })
            .await
            .unwrap();
        assert_eq!(
            outcome,
            Outcome::Failed {
                error: PaymentError::Declined,
                replayed: attempt > 0
            }
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_retryable_failure_releases_the_key_at_once() {
    let (idem, _) = setup();
    let outcome = idem
        .execute(&key(), fingerprint(500), |_ctx| async {
            Err::<Receipt, _>(WorkError::Retryable(PaymentError::ProviderDown))
        })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Retryable(PaymentError::ProviderDown));
    // Nothing is stored, and with no step checkpointed the key is forgotten.
    assert_eq!(idem.store().get(&key()).await.unwrap(), None);
    // No waiting: the next attempt runs the work at once, even as another request.
    let runs = Arc::new(AtomicUsize::new(0));
    let runs2 = Arc::clone(&runs);
    let done = idem
        .execute(&key(), fingerprint(900), move |ctx| async move {
            runs2.fetch_add(1, Ordering::SeqCst);
            assert!(!ctx.resumed(), "a forgotten key is claimed afresh");
            assert_eq!(ctx.token(), 2, "the token goes on in the stored record");
            Ok::<_, WorkError<PaymentError>>(7)
        })
        .await
        .unwrap();
    assert_eq!(
        done,
        Outcome::Completed {
            value: 7,
            replayed: false
        }
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// `failing` fails retryably under the key; the record is kept, so `other` under it for
/// another request is a mismatch.
async fn fails_then_is_kept_for_its_request<T, F, Fut, G, Gut>(
    idem: &Idempotency<MemoryStore>,
    failing: F,
    other: G,
) where
    T: Serialize + serde::de::DeserializeOwned + std::fmt::Debug + PartialEq + 'static,
    F: FnOnce(Context) -> Fut,
    Fut: std::future::Future<Output = Result<T, WorkError<PaymentError>>>,
    G: FnOnce(Context) -> Gut,
    Gut: std::future::Future<Output = Result<T, WorkError<PaymentError>>>,
{
    let outcome = idem.execute(&key(), fingerprint(500), failing).await;
    assert_eq!(
        outcome.unwrap(),
        Outcome::Retryable(PaymentError::ProviderDown)
    );
    assert!(idem.store().get(&key()).await.unwrap().is_some(), "kept");
    let other = idem.execute(&key(), fingerprint(900), other).await;
    assert!(matches!(other, Err(Error::Mismatch)), "{other:?}");
}

#[tokio::test]
async fn a_retryable_failure_after_deriving_a_key_keeps_the_key_for_that_request() {
    let (idem, _) = setup();
    // The work sent a derived key elsewhere, then failed as retryable: the retry must
    // derive the same key, so the other system can deduplicate the two calls.
    let derived = Arc::new(Mutex::new(Vec::new()));
    let work = |fail: bool| {
        let derived = Arc::clone(&derived);
        move |ctx: Context| async move {
            derived.lock().unwrap().push(ctx.derive("provider"));
            if fail {
                return Err(WorkError::Retryable(PaymentError::ProviderDown));
            }
            Ok::<_, WorkError<PaymentError>>(ctx.resumed())
        }
    };
    fails_then_is_kept_for_its_request(&idem, work(true), work(false)).await;
    let done = idem
        .execute(&key(), fingerprint(500), work(false))
        .await
        .unwrap();
    assert_eq!(done.value(), Some(true), "the retry took the record over");
    let derived = derived.lock().unwrap();
    assert_eq!(derived.len(), 2);
    assert_eq!(derived[0], derived[1], "the same derived key on the retry");
}

#[tokio::test]
async fn a_retryable_failure_after_a_step_keeps_the_key_for_that_request() {
    let (idem, _) = setup();
    let steps = Arc::new(AtomicUsize::new(0));
    let work = |fail: bool| {
        let steps = Arc::clone(&steps);
        move |ctx: Context| async move {
            let n: usize = ctx
                .step("reserve", || async move {
                    Ok(steps.fetch_add(1, Ordering::SeqCst) + 1)
                })
                .await?;
            if fail {
                return Err(WorkError::Retryable(PaymentError::ProviderDown));
            }
            Ok::<_, WorkError<PaymentError>>(n)
        }
    };
    // The step was done for this request: another one under the key is a mismatch.
    fails_then_is_kept_for_its_request(&idem, work(true), work(false)).await;
    // The same request takes over at once and resumes past the step.
    let done = idem
        .execute(&key(), fingerprint(500), work(false))
        .await
        .unwrap();
    assert_eq!(done.value(), Some(1));
    assert_eq!(steps.load(Ordering::SeqCst), 1, "the step ran once");
}

#[tokio::test]
async fn an_unknown_outcome_holds_the_key_until_the_lease_ends() {
    let (idem, clock) = setup();
    let outcome = idem
        .execute(&key(), fingerprint(500), |_ctx| async {
            Err::<u32, _>(WorkError::Unknown(PaymentError::TimedOut))
        })
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Unknown(PaymentError::TimedOut));

    let runs = Arc::new(AtomicUsize::new(0));
    let err = idem
        .execute(&key(), fingerprint(500), charge(&runs))
        .await
        .unwrap_err();
    match err {
        Error::InFlight { retry_after } => assert_eq!(retry_after, LEASE),
        other => panic!("expected InFlight, got {other:?}"),
    }
    clock.advance(LEASE);
    let resumed = idem
        .execute(&key(), fingerprint(500), |ctx| async move {
            Ok::<_, WorkError<PaymentError>>(ctx.resumed())
        })
        .await
        .unwrap();
    assert_eq!(
        resumed,
        Outcome::Completed {
            value: true,
            replayed: false
        }
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the work never ran while the lease was held"
    );
}

#[tokio::test]
async fn a_duplicate_while_the_work_runs_is_in_flight() {
    let (idem, clock) = setup();
    let idem = Arc::new(idem);
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let first = tokio::spawn({
        let idem = Arc::clone(&idem);
        async move {
            idem.execute(&key(), fingerprint(500), |_ctx| async move {
                started_tx.send(()).unwrap();
                finish_rx.await.unwrap();
                Ok::<_, WorkError<PaymentError>>("first".to_string())
            })
            .await
        }
    });
    started_rx.await.unwrap();
    clock.advance(Duration::from_secs(10));
    let runs = Arc::new(AtomicUsize::new(0));
    match idem.execute(&key(), fingerprint(500), charge(&runs)).await {
        Err(Error::InFlight { retry_after }) => assert_eq!(retry_after, Duration::from_secs(20)),
        other => panic!("expected InFlight, got {other:?}"),
    }
    finish_tx.send(()).unwrap();
    assert_eq!(
        first.await.unwrap().unwrap().value().as_deref(),
        Some("first")
    );
    let replay = idem
        .execute(&key(), fingerprint(500), |_ctx| async {
            Ok::<String, WorkError<PaymentError>>("never".into())
        })
        .await
        .unwrap();
    assert_eq!(
        replay,
        Outcome::Completed {
            value: "first".to_string(),
            replayed: true
        }
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_stale_owner_learns_it_lost_the_lease_and_the_new_result_stands() {
    let (idem, clock) = setup();
    let idem = Arc::new(idem);
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let stale = tokio::spawn({
        let idem = Arc::clone(&idem);
        async move {
            idem.execute(&key(), fingerprint(500), |_ctx| async move {
                started_tx.send(()).unwrap();
                finish_rx.await.unwrap();
                Ok::<_, WorkError<PaymentError>>("stale".to_string())
            })
            .await
        }
    });
    started_rx.await.unwrap();
    clock.advance(LEASE);
    let winner = idem
        .execute(&key(), fingerprint(500), |_ctx| async {
            Ok::<_, WorkError<PaymentError>>("winner".to_string())
        })
        .await
        .unwrap();
    assert!(!winner.replayed());
    finish_tx.send(()).unwrap();
    let err = stale.await.unwrap().unwrap_err();
    assert!(matches!(err, Error::LeaseLost), "{err:?}");
    let replay = idem
        .execute(&key(), fingerprint(500), |_ctx| async {
            Ok::<String, WorkError<PaymentError>>("never".into())
        })
        .await
        .unwrap();
    assert_eq!(replay.value().as_deref(), Some("winner"));
}

#[tokio::test]
async fn dropping_execute_mid_work_stores_nothing_and_frees_the_key_after_the_lease() {
    let (idem, clock) = setup();
    let runs = Arc::new(AtomicUsize::new(0));
    let k = key();
    {
        let mut pending = std::pin::pin!(idem.execute(&k, fingerprint(500), |_ctx| {
            std::future::pending::<Result<u8, WorkError<PaymentError>>>()
        }));
        // Poll once: the claim happens and the work starts. Then drop it (client gone).
        std::future::poll_fn(|cx| {
            assert!(pending.as_mut().poll(cx).is_pending());
            std::task::Poll::Ready(())
        })
        .await;
    }
    let record = idem
        .store()
        .get(&key())
        .await
        .unwrap()
        .expect("the claim happened");
    assert_eq!((record.state, record.response), (State::InProgress, None));
    assert!(matches!(
        idem.execute(&key(), fingerprint(500), charge(&runs)).await,
        Err(Error::InFlight { .. })
    ));
    clock.advance(LEASE);
    let done = idem
        .execute(&key(), fingerprint(500), charge(&runs))
        .await
        .unwrap();
    assert!(!done.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_result_over_the_cap_is_a_stored_failure_not_a_second_run() {
    let clock = ManualClock::new();
    let idem = Idempotency::builder(MemoryStore::with_clock(clock))
        .max_response_bytes(64)
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    for attempt in 0..2 {
        let runs = Arc::clone(&runs);
        let err = idem
            .execute(&key(), fingerprint(1), move |_ctx| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, WorkError<PaymentError>>("x".repeat(100))
            })
            .await
            .unwrap_err();
        match err {
            Error::Unstorable {
                part: ValuePart::Result,
                reason: Unstorable::TooLarge { size, limit },
                replayed,
                ..
            } => {
                assert_eq!((size, limit, replayed), (102, 64, attempt > 0));
            }
            other => panic!("expected Unstorable (too large), got {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // A result of exactly the cap fits.
    let exact = idem
        .execute(
            &Key::new("s", "exact").unwrap(),
            fingerprint(1),
            |_ctx| async { Ok::<_, WorkError<PaymentError>>("x".repeat(62)) },
        )
        .await
        .unwrap();
    assert!(!exact.replayed());
    // A permanent failure over the cap is stored as the marker saying so, like a result.
    let err = idem
        .execute(
            &Key::new("s", "large-failure").unwrap(),
            fingerprint(1),
            |_ctx| async { Err::<(), _>(WorkError::Permanent("y".repeat(100))) },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unstorable {
                part: ValuePart::Failure,
                reason: Unstorable::TooLarge { .. },
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_unserializable_result_is_a_stored_failure() {
    let (idem, _) = setup();
    for attempt in 0..2 {
        let err = idem
            .execute(&key(), fingerprint(1), |_ctx| async {
                // JSON maps need string keys.
                Ok::<_, WorkError<PaymentError>>(HashMap::from([((1, 2), 3)]))
            })
            .await
            .unwrap_err();
        match err {
            Error::Unstorable {
                part: what,
                reason: Unstorable::Unserializable,
                source,
                replayed,
                ..
            } => {
                assert_eq!(what, ValuePart::Result);
                assert_eq!(replayed, attempt > 0);
                assert_eq!(source.is_some(), attempt == 0);
            }
            other => panic!("expected Unstorable (unserializable), got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_stored_result_of_another_type_is_a_decode_error() {
    let (idem, _) = setup();
    idem.execute(&key(), fingerprint(1), |_ctx| async {
        Ok::<_, WorkError<()>>("text".to_string())
    })
    .await
    .unwrap();
    let err = idem
        .execute(&key(), fingerprint(1), |_ctx| async {
            Ok::<u64, WorkError<()>>(1)
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Decode(_)), "{err:?}");
}

#[tokio::test]
async fn settings_that_cannot_work_are_refused() {
    let build = |lease, retention, cap| {
        Idempotency::builder(MemoryStore::new())
            .lease(lease)
            .retention(retention)
            .max_response_bytes(cap)
            .build()
    };
    let s = Duration::from_secs;
    assert_eq!(
        build(Duration::ZERO, s(60), 1).unwrap_err(),
        ConfigError::ZeroLease
    );
    assert_eq!(
        build(s(60), s(59), 1).unwrap_err(),
        ConfigError::RetentionShorterThanLease {
            retention: s(59),
            lease: s(60)
        }
    );
    assert_eq!(
        build(s(1), s(1), 0).unwrap_err(),
        ConfigError::ZeroResponseCap
    );
    assert!(build(s(1), s(1), 1).is_ok());
}

/// A store whose backend is down: every call fails.
struct DownStore {
    calls: AtomicUsize,
}

impl DownStore {
    fn down(&self, operation: Operation) -> StoreError {
        self.calls.fetch_add(1, Ordering::SeqCst);
        StoreError::Unavailable {
            operation,
            source: "connection refused".into(),
        }
    }
}

#[async_trait]
impl Store for DownStore {
    async fn claim(&self, _: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        Err(self.down(Operation::Claim))
    }
    async fn complete(&self, _: &Lease, _: &[u8]) -> Result<WriteOutcome, StoreError> {
        Err(self.down(Operation::Complete))
    }
    async fn fail(&self, _: &Lease, _: &[u8]) -> Result<WriteOutcome, StoreError> {
        Err(self.down(Operation::Fail))
    }
    async fn release(&self, _: &Lease) -> Result<WriteOutcome, StoreError> {
        Err(self.down(Operation::Release))
    }
    async fn renew(&self, _: &Lease, _: Duration) -> Result<RenewOutcome, StoreError> {
        Err(self.down(Operation::Renew))
    }
    async fn checkpoint(
        &self,
        _: &Lease,
        _: &StepName,
        _: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        Err(self.down(Operation::Checkpoint))
    }
    async fn get(&self, _: &Key) -> Result<Option<Record>, StoreError> {
        Err(self.down(Operation::Get))
    }
    async fn purge_expired(&self, _: usize) -> Result<usize, StoreError> {
        Err(self.down(Operation::PurgeExpired))
    }
}

#[tokio::test(start_paused = true)]
async fn a_store_that_is_down_fails_closed() {
    let idem = Idempotency::new(DownStore {
        calls: AtomicUsize::new(0),
    });
    let runs = Arc::new(AtomicUsize::new(0));
    let err = idem
        .execute(&key(), fingerprint(500), charge(&runs))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Store(StoreError::Unavailable {
                operation: Operation::Claim,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the work never runs without a claim"
    );
    assert_eq!(
        idem.store().calls.load(Ordering::SeqCst),
        3,
        "the claim was retried, boundedly"
    );
    let message = err.to_string();
    assert!(
        message.contains("claim") && message.contains("retry"),
        "{message}"
    );
}

#[tokio::test]
async fn works_through_a_shared_dyn_store() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let idem = Idempotency::new(Arc::clone(&store));
    let runs = Arc::new(AtomicUsize::new(0));
    idem.execute(&key(), fingerprint(1), charge(&runs))
        .await
        .unwrap();
    let record = store.get(&key()).await.unwrap().unwrap();
    assert_eq!(record.state, State::Completed);
    let stored: Receipt = serde_json::from_slice(record.response.as_deref().unwrap()).unwrap();
    assert_eq!(stored.charge_id, "ch_1");
}

/// A codec that frames each value behind a version byte and reads it back as a part of
/// the stored bytes (borrowed, not copied): what a compressing or key-tagging codec does.
#[derive(Debug)]
struct Framed;

impl idem_core::Codec for Framed {
    fn encode(
        &self,
        _: &idem_core::codec::StoredAt<'_>,
        plain: Vec<u8>,
    ) -> Result<Vec<u8>, idem_core::codec::CodecError> {
        Ok([&[1u8][..], &plain].concat())
    }

    fn decode<'a>(
        &self,
        _: &idem_core::codec::StoredAt<'_>,
        stored: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [u8]>, idem_core::codec::CodecError> {
        Ok(std::borrow::Cow::Borrowed(
            stored.get(1..).unwrap_or_default(),
        ))
    }
}

/// A codec that tags each value with a trailing byte and reads it back as the stored
/// bytes less their last: a part that starts where the stored bytes do.
#[derive(Debug)]
struct Trailed;

impl idem_core::Codec for Trailed {
    fn encode(
        &self,
        _: &idem_core::codec::StoredAt<'_>,
        mut plain: Vec<u8>,
    ) -> Result<Vec<u8>, idem_core::codec::CodecError> {
        plain.push(b'#');
        Ok(plain)
    }

    fn decode<'a>(
        &self,
        _: &idem_core::codec::StoredAt<'_>,
        stored: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [u8]>, idem_core::codec::CodecError> {
        Ok(std::borrow::Cow::Borrowed(
            stored.split_last().map_or(&[][..], |(_, value)| value),
        ))
    }
}

#[tokio::test]
async fn a_codec_that_borrows_part_of_the_stored_bytes_replays_the_value_alone() {
    replays_the_value_alone(Framed).await;
    replays_the_value_alone(Trailed).await;
}

async fn replays_the_value_alone(codec: impl idem_core::Codec + 'static) {
    let idem = Idempotency::builder(MemoryStore::new())
        .codec(codec)
        .build()
        .unwrap();
    let bytes_key = Key::new("acct_42/webhooks", "framed-bytes").unwrap();
    for replayed in [false, true] {
        let outcome = idem
            .execute_bytes(&bytes_key, Fingerprint::of_bytes("evt"), |_ctx| async {
                Ok::<_, WorkError<Vec<u8>>>(b"raw answer".to_vec())
            })
            .await
            .unwrap();
        assert_eq!(outcome.replayed(), replayed);
        assert_eq!(outcome.into_result(), Ok(b"raw answer".to_vec()));
    }
    let typed_key = Key::new("acct_42/payments.create", "framed-typed").unwrap();
    for replayed in [false, true] {
        let outcome = idem
            .execute(&typed_key, Fingerprint::of_bytes("req"), |_ctx| async {
                Ok::<_, WorkError<()>>("ch_1".to_owned())
            })
            .await
            .unwrap();
        assert_eq!(outcome.replayed(), replayed);
        assert_eq!(outcome.into_result(), Ok("ch_1".to_owned()));
    }
}

/// A detached context (shadow runs, dry runs) holds no lease that could run out: its steps
/// run and its lease is never lost, however long the work takes. Its recorded end of the
/// lease is the moment it was made and is never read; the `detached` checks are what
/// keep it live.
#[tokio::test(start_paused = true)]
async fn a_detached_context_runs_its_steps_whatever_the_time() {
    let idem = Idempotency::new(MemoryStore::new());
    let ctx = idem.detached_context(&key(), fingerprint(500));
    tokio::time::advance(Duration::from_secs(30 * 86_400)).await;
    assert!(!ctx.is_lease_lost());
    let lost = tokio::time::timeout(Duration::from_secs(3600), ctx.lease_lost()).await;
    assert!(lost.is_err(), "a detached context's lease is never lost");
    let charged: u32 = ctx
        .step("charge", || async { Ok::<_, WorkError<()>>(7) })
        .await
        .unwrap();
    assert_eq!(charged, 7);
}

/// A context shows its key's short hash, token and state, never more.
#[tokio::test]
async fn a_context_shows_its_lease_in_debug() {
    let (idem, _clock) = setup();
    let outcome = idem
        .execute(&key(), fingerprint(500), |ctx| async move {
            Ok::<_, WorkError<()>>(format!("{ctx:?}"))
        })
        .await
        .unwrap();
    let shown = outcome.value().unwrap();
    for part in ["Context", "token: 1", "resumed: false", "lease_lost: false"] {
        assert!(shown.contains(part), "{shown}");
    }
    assert!(
        !shown.contains(key().key()),
        "the key itself is never shown: {shown}"
    );
}

/// The memory store, refusing every result, and the first three failures, as too large
/// for the record.
struct RefusesValues {
    inner: MemoryStore,
    failures_refused: AtomicUsize,
}

fn too_large(part: ValuePart, value: &[u8]) -> StoreError {
    StoreError::TooLarge {
        part,
        size: value.len(),
        limit: 0,
    }
}

#[async_trait]
impl Store for RefusesValues {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(request).await
    }
    async fn complete(&self, _: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        Err(too_large(ValuePart::Result, response))
    }
    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        if self.failures_refused.fetch_add(1, Ordering::SeqCst) < 3 {
            return Err(too_large(ValuePart::Failure, response));
        }
        self.inner.fail(lease, response).await
    }
    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        self.inner.release(lease).await
    }
    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        self.inner.renew(lease, extend).await
    }
    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        self.inner.checkpoint(lease, step, value).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }
}

/// A result the store refuses as too large is replaced by the marker saying so, once: a
/// store that refuses the marker too gets that refusal back, not the marker sent again.
#[tokio::test]
async fn a_refused_marker_is_an_error_not_sent_again() {
    let idem = Idempotency::new(RefusesValues {
        inner: MemoryStore::new(),
        failures_refused: AtomicUsize::new(0),
    });
    let runs = Arc::new(AtomicUsize::new(0));
    let answer = idem.execute(&key(), fingerprint(500), charge(&runs)).await;
    assert!(
        matches!(
            answer,
            Err(Error::Store(StoreError::TooLarge {
                part: ValuePart::Failure,
                ..
            }))
        ),
        "{answer:?}"
    );
    assert_eq!(idem.store().failures_refused.load(Ordering::SeqCst), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
