//! The driver's promises: heartbeats never stall the work, the first answer
//! equals every replay, poison steps name themselves, values that cannot be stored are
//! stored as failures (never run twice), and the 1.0 API shapes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::driver::Unstorable;
use idem_core::{
    ConfigError, Error, Fingerprint, Heartbeat, Idempotency, Key, ManualClock, MemoryStore,
    Outcome, Purger, Record, Store, StoreError, WorkError, WorkResultExt, done,
    driver::InterruptedKind, key::StepName, raw::MAX_DURATION, record::Lease, record::ValuePart,
    store::ClaimOutcome, store::ClaimRequest, store::Expiry, store::Operation, store::RenewOutcome,
    store::WriteOutcome,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

fn key(name: &str) -> Key {
    Key::new("acct_42/payments.create", name).expect("valid")
}

fn fp() -> Fingerprint {
    Fingerprint::of_bytes("amount=500")
}

/// A memory store with hooks: a renewal can be held until released, checkpoints can fail
/// a number of times first, and the record limit can be set.
#[derive(Clone, Default)]
struct Hooked {
    inner: MemoryStore,
    hold_renewals: Arc<AtomicBool>,
    renewal_started: Arc<Notify>,
    release_renewals: Arc<Notify>,
    renewals: Arc<AtomicUsize>,
    checkpoint_failures: Arc<AtomicUsize>,
    record_limit: Option<usize>,
    /// Answers `Fenced` to a completion of a record already completed (under any lease):
    /// stricter than the contract, which answers a repeat `Applied`.
    fence_repeated_completions: bool,
}

#[async_trait]
impl Store for Hooked {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(request).await
    }
    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        if self.fence_repeated_completions {
            let record = self.inner.get(&lease.key).await?;
            if record.is_some_and(|record| record.state == idem_core::State::Completed) {
                return Ok(WriteOutcome::Fenced);
            }
        }
        self.inner.complete(lease, response).await
    }
    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.inner.fail(lease, response).await
    }
    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        self.inner.release(lease).await
    }
    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        if self.hold_renewals.load(Ordering::SeqCst) {
            // Like a renewal waiting for a row lock the work's own transaction holds.
            let released = self.release_renewals.notified();
            self.renewal_started.notify_one();
            released.await;
        }
        self.inner.renew(lease, extend).await
    }
    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        let failures = &self.checkpoint_failures;
        if failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(StoreError::Unavailable {
                operation: Operation::Checkpoint,
                source: "connection reset".into(),
            });
        }
        self.inner.checkpoint(lease, step, value).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }
    fn max_record_bytes(&self) -> Option<usize> {
        self.record_limit
    }
}

#[tokio::test]
async fn a_renewal_that_waits_never_stalls_the_work() {
    let store = Hooked::default();
    store.hold_renewals.store(true, Ordering::SeqCst);
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_millis(300))
        .heartbeat(Heartbeat::Every(Duration::from_millis(10)))
        .build()
        .unwrap();
    let k = key("k");
    let work = idem.execute(&k, fp(), |_ctx| {
        let store = store.clone();
        async move {
            // A renewal has started and is stuck (on a lock this work holds, say): the
            // work must still be polled to finish, which then lets the renewal go.
            store.renewal_started.notified().await;
            store.release_renewals.notify_one();
            done("finished".to_string())
        }
    });
    let outcome = tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .expect("the work finished although a renewal was pending");
    assert_eq!(outcome.unwrap().value().as_deref(), Some("finished"));
}

#[tokio::test]
async fn a_renewal_that_hangs_is_bounded_and_the_next_beat_tries_again() {
    let store = Hooked::default();
    store.hold_renewals.store(true, Ordering::SeqCst);
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_millis(300))
        .heartbeat(Heartbeat::Every(Duration::from_millis(10)))
        .build()
        .unwrap();
    let outcome = idem
        .execute(&key("k"), fp(), |_ctx| async {
            // Renewals never return; each is cut off after one interval.
            tokio::time::sleep(Duration::from_millis(100)).await;
            done(1)
        })
        .await
        .unwrap();
    assert_eq!(outcome.value(), Some(1));
    let renewals = store.renewals.load(Ordering::SeqCst);
    assert!(
        renewals >= 2,
        "a hung renewal is abandoned and the next beat starts another: {renewals}"
    );
}

#[tokio::test]
async fn completed_in_the_works_own_transaction_is_success_even_after_a_fenced_beat() {
    let store = Hooked::default();
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_millis(300))
        .heartbeat(Heartbeat::Every(Duration::from_millis(10)))
        .build()
        .unwrap();
    let outcome = idem
        .execute(&key("k"), fp(), |ctx| {
            let store = store.clone();
            async move {
                commit_in_own_transaction(&ctx, &store, "receipt-7").await?;
                // Beats land after the commit and are fenced: the record is completed.
                tokio::time::sleep(Duration::from_millis(60)).await;
                assert!(ctx.is_lease_lost());
                done("receipt-7".to_string())
            }
        })
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::Completed {
            value: "receipt-7".to_string(),
            replayed: false
        }
    );
    assert!(store.renewals.load(Ordering::SeqCst) >= 1);
}

/// What `complete_in` does inside the work's own transaction, then the commit: the result
/// written through `store` itself, and marked written.
async fn commit_in_own_transaction(
    ctx: &idem_core::Context,
    store: &impl Store,
    value: &str,
) -> Result<(), idem_core::driver::Interrupted> {
    let completion = ctx.prepare_completion(&value.to_string())?;
    let written = store
        .complete(completion.lease(), completion.bytes())
        .await
        .unwrap();
    assert_eq!(written, WriteOutcome::Applied);
    completion.written();
    Ok(())
}

/// A driver over `store` with a ten-second lease and retention, no heartbeat.
fn committing(store: &MemoryStore) -> Idempotency<MemoryStore> {
    Idempotency::builder(store.clone())
        .lease(Duration::from_secs(10))
        .retention(Duration::from_secs(10))
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_committed_result_is_answered_after_its_record_expired() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let outcome = committing(&store)
        .execute(&key("k"), fp(), |ctx| {
            let (store, clock) = (store.clone(), clock.clone());
            async move {
                commit_in_own_transaction(&ctx, &store, "receipt-7").await?;
                // The work runs on past the result's retention: the record expires.
                clock.advance(Duration::from_secs(25));
                done("receipt-7".to_string())
            }
        })
        .await;
    // It answered "lease lost", and the retry it asked for ran the work again.
    assert_eq!(
        outcome.unwrap(),
        Outcome::Completed {
            value: "receipt-7".to_string(),
            replayed: false
        }
    );
}

/// The work's own result outlived its retention and was purged; another attempt claimed
/// the key afresh (its token starts again at 1, as this owner's did) and stored the same
/// bytes. The record is not this owner's: the same token and bytes, another attempt.
#[tokio::test]
async fn a_purged_result_reclaimed_under_the_same_token_is_not_taken_for_this_owners() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let (first, second) = (committing(&store), committing(&store));
    let outcome = first
        .execute(&key("k"), fp(), |ctx| {
            let (store, clock) = (store.clone(), clock.clone());
            async move {
                commit_in_own_transaction(&ctx, &store, "mine").await?;
                clock.advance(Duration::from_secs(25));
                assert_eq!(store.purge_expired(10).await.unwrap(), 1);
                let theirs = second
                    .execute(&key("k"), fp(), |ctx| async move {
                        assert_eq!(ctx.token(), 1, "a fresh record starts at token 1");
                        done("mine".to_string())
                    })
                    .await
                    .unwrap();
                assert!(!theirs.replayed());
                done("mine".to_string())
            }
        })
        .await;
    assert!(matches!(outcome, Err(Error::LeaseLost)), "{outcome:?}");
}

#[tokio::test]
async fn a_result_written_then_rolled_back_is_never_answered() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let (first, second) = (committing(&store), committing(&store));
    let outcome = first
        .execute(&key("k"), fp(), |ctx| {
            let clock = clock.clone();
            async move {
                // The store wrote the result inside the work's transaction, which then rolled
                // back: nothing stands. The lease runs out and another owner takes over and
                // stores its own result.
                let completion = ctx.prepare_completion(&"mine".to_string())?;
                completion.written();
                clock.advance(Duration::from_secs(11));
                // Its result is the same bytes (the work is deterministic): still another
                // lease's record.
                let theirs = second
                    .execute(&key("k"), fp(), |_ctx| async { done("mine".to_string()) })
                    .await
                    .unwrap();
                assert_eq!(theirs.value(), Some("mine".to_string()));
                // The work wrongly returns success anyway.
                done("mine".to_string())
            }
        })
        .await;
    assert!(matches!(outcome, Err(Error::LeaseLost)), "{outcome:?}");
}

#[tokio::test(start_paused = true)]
async fn the_automatic_heartbeat_renews_short_leases() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let lease = Duration::from_millis(250);
    let idem = Idempotency::builder(store.clone())
        .lease(lease)
        .build()
        .unwrap();
    let outcome = idem
        .execute(&key("short"), fp(), |_ctx| {
            let (store, clock) = (store.clone(), clock.clone());
            async move {
                // One second of work on a quarter-second lease.
                for _ in 0..10 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    clock.advance(Duration::from_millis(100));
                }
                let duplicate = ClaimRequest::new(key("short"), fp(), lease, lease);
                done(format!("{:?}", store.claim(&duplicate).await.unwrap()))
            }
        })
        .await
        .unwrap();
    let answer = outcome.value().unwrap();
    assert!(answer.starts_with("InFlight"), "{answer}");
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct WithSkipped {
    amount: u64,
    #[serde(skip)]
    cache: u64,
}

#[tokio::test]
async fn the_first_answer_is_what_every_replay_gets() {
    let idem = Idempotency::new(MemoryStore::new());
    let first = idem
        .execute(&key("skip"), fp(), |_ctx| async {
            done(WithSkipped {
                amount: 500,
                cache: 99,
            })
        })
        .await
        .unwrap();
    let replay = idem
        .execute(&key("skip"), fp(), |_ctx| async {
            done(WithSkipped {
                amount: 1,
                cache: 1,
            })
        })
        .await
        .unwrap();
    let expected = WithSkipped {
        amount: 500,
        cache: 0,
    };
    assert_eq!(first.value(), Some(expected.clone()), "the stored value");
    assert_eq!(replay.value(), Some(expected));
}

#[tokio::test]
async fn a_value_that_does_not_round_trip_is_a_stored_failure_from_the_start() {
    let idem = Idempotency::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    for attempt in 0..3 {
        let runs = Arc::clone(&runs);
        let err = idem
            .execute(&key("nan"), fp(), move |_ctx| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                // JSON writes NaN as null, which does not read back as an f64.
                done(f64::NAN)
            })
            .await
            .unwrap_err();
        match err {
            Error::Unstorable {
                part: ValuePart::Result,
                reason: Unstorable::Unserializable,
                replayed,
                ..
            } => assert_eq!(replayed, attempt > 0),
            other => panic!("attempt {attempt}: {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");

    // The same for a permanent error that does not read back.
    let err = idem
        .execute(&key("nan-error"), fp(), |_ctx| async {
            Err::<u8, _>(WorkError::Permanent(f64::NAN))
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unstorable {
                part: ValuePart::Failure,
                reason: Unstorable::Unserializable,
                ..
            }
        ),
        "{err:?}"
    );

    // And for a step's value: the stored failure names the step, on replays too.
    for attempt in 0..2 {
        let err = idem
            .execute(&key("nan-step"), fp(), |ctx| async move {
                let ratio: f64 = ctx.step("ratio", || async { done(f64::NAN) }).await?;
                done(ratio)
            })
            .await
            .unwrap_err();
        match err {
            Error::Unstorable {
                part: ValuePart::Step(ref step),
                reason: Unstorable::Unserializable,
                replayed,
                ..
            } if step == "ratio" => assert_eq!(replayed, attempt > 0),
            other => panic!("attempt {attempt}: {other:?}"),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct DebitV1 {
    cents: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct DebitV2 {
    cents: u64,
    currency: String,
}

#[tokio::test]
async fn a_step_that_no_longer_decodes_names_itself_and_the_way_out() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let idem = Idempotency::builder(store)
        .lease(Duration::from_secs(5))
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let first = idem
        .execute(&key("k"), fp(), |ctx| async move {
            let _: DebitV1 = ctx
                .step("debit", || async { done(DebitV1 { cents: 500 }) })
                .await?;
            Err::<(), _>(WorkError::Unknown(()))
        })
        .await
        .unwrap();
    assert_eq!(first, Outcome::Unknown(()));
    clock.advance(Duration::from_secs(5));
    // Deployed meanwhile: the step's type changed.
    let err = idem
        .execute(&key("k"), fp(), |ctx| async move {
            let _: DebitV2 = ctx
                .step("debit", || async {
                    done(DebitV2 {
                        cents: 500,
                        currency: "EUR".into(),
                    })
                })
                .await?;
            done(())
        })
        .await
        .unwrap_err();
    let Error::Interrupted(interrupted) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(interrupted.kind(), InterruptedKind::StepUndecodable);
    assert_eq!(interrupted.step(), Some("debit"));
    assert!(
        std::error::Error::source(interrupted).is_some(),
        "the decoder's error is kept as the source"
    );
    let message = err.to_string();
    assert!(
        message.contains("`debit`") && message.contains("debit.v2"),
        "{message}"
    );
}

#[tokio::test]
async fn checkpoints_are_retried_like_completions() {
    let store = Hooked::default();
    store.checkpoint_failures.store(2, Ordering::SeqCst);
    let idem = Idempotency::builder(store.clone())
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let outcome = idem
        .execute(&key("k"), fp(), |ctx| async move {
            let debit: u64 = ctx.step("debit", || async { done(500) }).await?;
            done(debit)
        })
        .await
        .unwrap();
    assert_eq!(outcome.value(), Some(500));
    assert_eq!(store.checkpoint_failures.load(Ordering::SeqCst), 0);
    let record = store.get(&key("k")).await.unwrap().unwrap();
    assert_eq!(record.steps["debit"], b"500");
}

/// What the work was told when its step's write failed, checked for the interruption's
/// kind and its source's type; the interruption is handed back as the work's error.
fn told_why<T, E: std::error::Error + 'static>(
    result: Result<T, WorkError<()>>,
    kind: InterruptedKind,
) -> Result<T, WorkError<()>> {
    let Err(WorkError::Interrupted(interrupted)) = result else {
        panic!("the step's write failed: it must be an interruption")
    };
    assert_eq!(interrupted.kind(), kind);
    let source = std::error::Error::source(&interrupted).expect("the cause is kept as the source");
    assert!(source.downcast_ref::<E>().is_some(), "{source:?}");
    Err(WorkError::Interrupted(interrupted))
}

#[tokio::test(start_paused = true)]
async fn a_step_the_store_cannot_write_interrupts_with_the_stores_error_as_source() {
    let store = Hooked::default();
    store
        .checkpoint_failures
        .store(usize::MAX, Ordering::SeqCst);
    let idem = Idempotency::builder(store)
        .lease(Duration::from_secs(5))
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let err = idem
        .execute(&key("k"), fp(), |ctx| async move {
            let debit = ctx.step("debit", || async { done(500_u64) }).await;
            let debit = told_why::<_, StoreError>(debit, InterruptedKind::Store)?;
            done(debit)
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Store(StoreError::Unavailable { .. })),
        "{err:?}"
    );
}

/// A codec that cannot encode a step's value (no randomness for its nonce, say).
#[derive(Debug)]
struct NoRandomnessForSteps;

impl idem_core::Codec for NoRandomnessForSteps {
    fn encode(
        &self,
        at: &idem_core::codec::StoredAt<'_>,
        plain: Vec<u8>,
    ) -> Result<Vec<u8>, idem_core::codec::CodecError> {
        match at.part {
            ValuePart::Step(_) => Err(idem_core::codec::CodecError::Randomness {
                reason: "getrandom failed".into(),
            }),
            _ => Ok(plain),
        }
    }

    fn decode<'a>(
        &self,
        _: &idem_core::codec::StoredAt<'_>,
        stored: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [u8]>, idem_core::codec::CodecError> {
        Ok(std::borrow::Cow::Borrowed(stored))
    }
}

#[tokio::test]
async fn a_step_the_codec_cannot_encode_interrupts_with_the_codecs_error_as_source() {
    let idem = Idempotency::builder(MemoryStore::new())
        .codec(NoRandomnessForSteps)
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let err = idem
        .execute(&key("k"), fp(), |ctx| async move {
            let debit = ctx.step("debit", || async { done(500_u64) }).await;
            let debit = told_why::<_, idem_core::codec::CodecError>(debit, InterruptedKind::Codec)?;
            done(debit)
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Codec {
                what: ValuePart::Step(ref step),
                ..
            } if step == "debit"
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_step_that_cannot_be_stored_fails_for_good_and_never_runs_again() {
    let store = Hooked {
        record_limit: Some(4096),
        ..Hooked::default()
    };
    let idem = Idempotency::builder(store)
        .lease(Duration::from_secs(5))
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    // What the work was told when its step could not be stored: the step, and why.
    let told = Arc::new(std::sync::Mutex::new(Vec::new()));
    for attempt in 0..2 {
        let runs = Arc::clone(&runs);
        let told = Arc::clone(&told);
        let err = idem
            .execute(&key("big-step"), fp(), move |ctx| async move {
                let step: Result<String, _> = ctx
                    .step("receipt", || async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        done("x".repeat(8000))
                    })
                    .await;
                if let Err(WorkError::Interrupted(interrupted)) = &step {
                    let step = interrupted.step().map(str::to_owned);
                    told.lock().unwrap().push((step, interrupted.to_string()));
                }
                step?;
                done(())
            })
            .await
            .unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("bytes, over the")
                && message.contains("; raise the cap or store less"),
            "{message}"
        );
        assert_eq!(message.contains(" (replayed)"), attempt > 0, "{message}");
        match err {
            Error::Unstorable {
                part: ValuePart::Step(step),
                reason: Unstorable::TooLarge { size, limit },
                replayed,
                ..
            } => {
                assert_eq!(step, "receipt");
                assert!(size > limit, "{size} > {limit}");
                assert_eq!(replayed, attempt > 0);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the step ran once");
    {
        let told = told.lock().unwrap();
        let [(step, message)] = told.as_slice() else {
            panic!("{told:?}")
        };
        assert_eq!(step.as_deref(), Some("receipt"));
        assert!(
            message.contains("receipt") && message.contains("bytes"),
            "{message}"
        );
    }

    // A result that fits alone but not beside the checkpoints is a stored failure too.
    let err = idem
        .execute(&key("crowded"), fp(), |ctx| async move {
            let _: String = ctx.step("a", || async { done("y".repeat(3000)) }).await?;
            done("z".repeat(2000))
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unstorable {
                part: ValuePart::Result,
                reason: Unstorable::TooLarge { .. },
                replayed: false,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn bytes_are_stored_and_replayed_as_they_are() {
    let store = MemoryStore::new();
    let idem = Idempotency::new(store.clone());
    let body: Vec<u8> = (0..=255).collect();
    let first = idem
        .execute_bytes(&key("raw"), fp(), |_ctx| {
            let body = body.clone();
            async move { Ok(body) }
        })
        .await
        .unwrap();
    assert_eq!(first.clone().value(), Some(body.clone()));
    let record = store.get(&key("raw")).await.unwrap().unwrap();
    assert_eq!(
        record.response,
        Some(body.clone()),
        "no JSON around the bytes"
    );
    let replay = idem
        .execute_bytes(&key("raw"), fp(), |_ctx| async { Ok(vec![1]) })
        .await
        .unwrap();
    assert_eq!(
        replay,
        Outcome::Completed {
            value: body,
            replayed: true
        }
    );
    // A permanent error's bytes replay exactly too.
    for attempt in 0..2 {
        let outcome = idem
            .execute_bytes(&key("raw-error"), fp(), |_ctx| async {
                Err(WorkError::Permanent(b"\x00declined\xff".to_vec()))
            })
            .await
            .unwrap();
        assert_eq!(
            outcome,
            Outcome::Failed {
                error: b"\x00declined\xff".to_vec(),
                replayed: attempt > 0
            }
        );
    }
}

#[tokio::test]
async fn settings_past_the_limits_are_refused_with_a_clear_error() {
    let build = |lease, retention, heartbeat| {
        Idempotency::builder(MemoryStore::new())
            .lease(lease)
            .retention(retention)
            .heartbeat(heartbeat)
            .build()
    };
    let err = build(Duration::from_secs(1), Duration::MAX, Heartbeat::Auto).unwrap_err();
    assert_eq!(
        err,
        ConfigError::DurationTooLong {
            setting: "retention",
            value: Duration::MAX,
            max: MAX_DURATION
        }
    );
    assert!(err.to_string().contains("MAX_DURATION"), "{err}");
    assert!(build(MAX_DURATION, MAX_DURATION, Heartbeat::Auto).is_ok());
    assert_eq!(
        build(
            Duration::from_millis(2),
            Duration::from_secs(1),
            Heartbeat::Auto
        )
        .unwrap_err(),
        ConfigError::LeaseTooShortForHeartbeat {
            lease: Duration::from_millis(2)
        }
    );
    assert!(
        build(
            Duration::from_millis(2),
            Duration::from_secs(1),
            Heartbeat::Off
        )
        .is_ok()
    );
}

#[tokio::test]
async fn the_longest_durations_work_end_to_end() {
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(MAX_DURATION)
        .retention(MAX_DURATION)
        .build()
        .unwrap();
    for _ in 0..2 {
        let outcome = idem
            .execute(&key("forever"), fp(), |_ctx| async { done(1) })
            .await
            .unwrap();
        assert_eq!(outcome.value(), Some(1));
    }
}

#[tokio::test]
async fn the_driver_clones_without_a_clone_store_and_erases_its_type() {
    // A boxed trait object is a store that is not `Clone`.
    let store: Box<dyn Store> = Box::new(MemoryStore::new());
    let idem = Idempotency::new(store);
    let copy = idem.clone();
    let shared: Idempotency = copy.into_dyn();
    fn assert_state<T: Clone + Send + Sync + 'static>(_: &T) {}
    assert_state(&shared);
    let first = idem
        .execute(&key("k"), fp(), |_ctx| async {
            Ok::<_, String>(7).permanent()
        })
        .await
        .unwrap();
    let replay = shared
        .execute(&key("k"), fp(), |_ctx| async {
            Ok::<_, String>(8).permanent()
        })
        .await
        .unwrap();
    assert_eq!(first.value(), Some(7));
    assert_eq!(
        replay,
        Outcome::Completed {
            value: 7,
            replayed: true
        },
        "clones share the store"
    );
}

#[tokio::test(start_paused = true)]
async fn the_purger_keeps_deleting_absent_records() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    assert_eq!(shared.expiry(), Expiry::Purge);
    for n in 0..25 {
        let request = ClaimRequest::new(
            key(&format!("k{n}")),
            fp(),
            Duration::from_secs(1),
            Duration::from_secs(10),
        );
        let _ = store.claim(&request).await.unwrap();
    }
    let purger = Purger::spawn(shared, Duration::from_secs(60), 10).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(store.len(), 25, "nothing is absent yet");
    clock.advance(Duration::from_secs(10));
    // The next round deletes all 25, ten at a time, without waiting between full batches.
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(store.len(), 0);
    purger.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_fenced_heartbeat_sends_no_more_renewals() {
    let clock = ManualClock::new();
    let store = Hooked {
        inner: MemoryStore::with_clock(clock.clone()),
        ..Hooked::default()
    };
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(1))
        .heartbeat(Heartbeat::Every(Duration::from_millis(100)))
        .build()
        .unwrap();
    let k = key("fenced-heartbeat");
    let at_loss = Arc::new(AtomicUsize::new(0));
    let owner = tokio::spawn({
        let (idem, k, store, at_loss) = (idem.clone(), k.clone(), store.clone(), at_loss.clone());
        async move {
            idem.execute(&k, fp(), |ctx| async move {
                // Fenced by the next renewal: the work goes on a while, as work that
                // does not watch its lease does.
                ctx.lease_lost().await;
                at_loss.store(store.renewals.load(Ordering::SeqCst), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(1)).await;
                done(1)
            })
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The owner's lease ends on the store's clock, and another attempt takes over.
    clock.advance(Duration::from_secs(5));
    // Through the store underneath: the owner's count of renewals stays its own.
    let takeover = Idempotency::builder(store.inner.clone())
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap()
        .execute(&k, fp(), |_ctx| async { done(2) })
        .await
        .unwrap();
    assert_eq!(takeover.value(), Some(2));
    let owner = owner.await.unwrap();
    assert!(
        matches!(owner, Err(Error::LeaseLost)) || owner.as_ref().is_ok_and(|o| o.replayed()),
        "{owner:?}"
    );
    let renewals = at_loss.load(Ordering::SeqCst);
    assert!(renewals >= 1, "the fence came from a renewal");
    assert_eq!(
        store.renewals.load(Ordering::SeqCst),
        renewals,
        "no renewal after the fence"
    );
}

#[tokio::test]
async fn a_prepared_completion_may_fill_the_cap_exactly_and_no_more() {
    let idem = Idempotency::builder(MemoryStore::new())
        .max_response_bytes(16)
        .build()
        .unwrap();
    idem.execute(&key("prepared-edge"), fp(), |ctx| async move {
        // A string of 14 characters is 16 bytes of JSON, the quotes included.
        assert!(ctx.prepare_completion(&"s".repeat(14)).is_ok());
        let over = ctx.prepare_completion(&"s".repeat(15)).err();
        assert_eq!(
            over.map(|interrupted| interrupted.kind()),
            Some(InterruptedKind::Unstorable)
        );
        done(())
    })
    .await
    .unwrap();
}

/// The driver's confirming write after the work's own transaction completed the record
/// is fenced by a store that fences repeats: the record read back is this lease's, with
/// these bytes, so the result stands. Another lease's, or other bytes, would not.
#[tokio::test]
async fn a_fenced_confirmation_of_the_works_own_completion_reads_the_record_back() {
    let store = Hooked {
        fence_repeated_completions: true,
        ..Hooked::default()
    };
    let idem = Idempotency::builder(store.clone())
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let outcome = idem
        .execute(&key("k"), fp(), |ctx| {
            let store = store.clone();
            async move {
                commit_in_own_transaction(&ctx, &store.inner, "receipt-7").await?;
                done("receipt-7".to_string())
            }
        })
        .await;
    assert_eq!(
        outcome.unwrap(),
        Outcome::Completed {
            value: "receipt-7".to_string(),
            replayed: false
        }
    );
}

#[tokio::test]
async fn whether_a_response_fits_is_asked_of_the_codec_near_the_room() {
    let idem = Idempotency::builder(MemoryStore::new())
        .max_response_bytes(100)
        .codec(idem_core::Aes256GcmCodec::new(1, [7; 32]))
        .build()
        .unwrap();
    idem.execute(&key("fits"), fp(), |ctx| async move {
        let room = ctx.room_for_plain_response();
        assert!(
            room > 0 && room < 100,
            "the cipher adds its nonce and tag: {room}"
        );
        assert!(ctx.fits_response(b""));
        assert!(ctx.fits_response(&vec![0; room]));
        assert!(!ctx.fits_response(&vec![0; room + 1]));
        done(())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_step_may_fill_the_room_beside_the_marker_exactly_and_no_more() {
    let store = Hooked {
        record_limit: Some(4096),
        ..Hooked::default()
    };
    let idem = Idempotency::builder(store)
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    // 512 bytes are kept for a failure marker; the step's name and its JSON take the rest.
    let room = 4096 - 512;
    let value_of = |size: usize| "v".repeat(size - "step".len() - 2);
    let fits = idem
        .execute(&key("step-fits"), fp(), |ctx| async move {
            let value: String = ctx.step("step", || async { done(value_of(room)) }).await?;
            done(value.len())
        })
        .await
        .unwrap();
    assert_eq!(fits.value(), Some(room - 6));
    let over = idem
        .execute(&key("step-over"), fp(), |ctx| async move {
            let value: String = ctx
                .step("step", || async { done(value_of(room + 1)) })
                .await?;
            done(value.len())
        })
        .await;
    assert!(
        matches!(
            over,
            Err(Error::Unstorable {
                part: ValuePart::Step(ref step),
                reason: Unstorable::TooLarge { size, limit },
                ..
            }) if step == "step" && size == room + 1 && limit == room
        ),
        "{over:?}"
    );
}
