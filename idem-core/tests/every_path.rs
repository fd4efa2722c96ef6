//! The guarantee on paths the happy cases never walk: a caller that goes away after the
//! work returned, a takeover whose answer was lost, a release into a hung store, a store
//! that holds less than it said, a compensation taken over, an undo interrupted, a
//! failure that cannot be stored beside its undos, and settings at their extremes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::driver::Unstorable;
use idem_core::record::ValuePart;
use idem_core::{
    Error, Fingerprint, Heartbeat, Idempotency, InFlightPolicy, Key, ManualClock, MemoryStore,
    Outcome, Record, State, Store, StoreError, Timestamp, WorkError, key::StepName, record::Lease,
    store::ClaimOutcome, store::ClaimRequest, store::Operation, store::RenewOutcome,
    store::WriteOutcome,
};

/// What a [`Faulty`] store does to one kind of call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Passes the call through.
    None,
    /// Fails the next `n` calls before they apply.
    Refuse(usize),
    /// Applies the next call, then answers as if the connection broke.
    LoseAnswer,
    /// Never answers.
    Hang,
    /// Answers after this long (then applies).
    Slow(Duration),
    /// A `complete` or `fail` with more than this many bytes is `TooLarge`.
    FailLimit(usize),
    /// As `FailLimit`, after this long.
    SlowLimit(Duration, usize),
    /// Waits once, then panics.
    Panic,
}

/// The memory store with a fault per operation.
struct Faulty {
    inner: MemoryStore,
    faults: Mutex<Vec<(Operation, Fault)>>,
    /// What `max_record_bytes` declares.
    limit: Option<usize>,
}

impl Faulty {
    fn new(inner: MemoryStore) -> Self {
        Self {
            inner,
            faults: Mutex::new(Vec::new()),
            limit: None,
        }
    }

    fn set(&self, operation: Operation, fault: Fault) {
        let mut faults = self.faults.lock().unwrap();
        faults.retain(|(op, _)| *op != operation);
        faults.push((operation, fault));
    }

    fn fault(&self, operation: Operation) -> Fault {
        let mut faults = self.faults.lock().unwrap();
        let Some((_, fault)) = faults.iter_mut().find(|(op, _)| *op == operation) else {
            return Fault::None;
        };
        let now = *fault;
        *fault = match now {
            Fault::Refuse(n) if n > 1 => Fault::Refuse(n - 1),
            Fault::Refuse(_) | Fault::LoseAnswer => Fault::None,
            other => other,
        };
        now
    }

    async fn call<O>(
        &self,
        operation: Operation,
        size: usize,
        apply: impl std::future::Future<Output = Result<O, StoreError>>,
    ) -> Result<O, StoreError> {
        let broken = || StoreError::Unavailable {
            operation,
            source: "connection reset".into(),
        };
        let part = if operation == Operation::Fail {
            ValuePart::Failure
        } else {
            ValuePart::Result
        };
        match self.fault(operation) {
            Fault::None => apply.await,
            Fault::Refuse(_) => Err(broken()),
            Fault::LoseAnswer => {
                apply.await?;
                Err(broken())
            }
            Fault::Hang => std::future::pending().await,
            Fault::Slow(pause) => {
                tokio::time::sleep(pause).await;
                apply.await
            }
            Fault::FailLimit(limit) if size > limit => {
                Err(StoreError::TooLarge { part, size, limit })
            }
            Fault::FailLimit(_) => apply.await,
            Fault::Panic => {
                tokio::task::yield_now().await;
                panic!("the store panicked mid-call");
            }
            Fault::SlowLimit(pause, limit) => {
                tokio::time::sleep(pause).await;
                if size > limit {
                    return Err(StoreError::TooLarge { part, size, limit });
                }
                apply.await
            }
        }
    }
}

#[async_trait]
impl Store for Faulty {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.call(Operation::Claim, 0, self.inner.claim(request))
            .await
    }
    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        let apply = self.inner.complete(lease, response);
        self.call(Operation::Complete, response.len(), apply).await
    }
    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        let apply = self.inner.fail(lease, response);
        self.call(Operation::Fail, response.len(), apply).await
    }
    async fn release(&self, lease: &Lease) -> Result<WriteOutcome, StoreError> {
        self.call(Operation::Release, 0, self.inner.release(lease))
            .await
    }
    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<RenewOutcome, StoreError> {
        self.call(Operation::Renew, 0, self.inner.renew(lease, extend))
            .await
    }
    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        let apply = self.inner.checkpoint(lease, step, value);
        self.call(Operation::Checkpoint, value.len(), apply).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }
    fn max_record_bytes(&self) -> Option<usize> {
        self.limit
    }
}

const LEASE: Duration = Duration::from_secs(30);
const TIMEOUT: Duration = Duration::from_secs(1);

fn key(name: &str) -> Key {
    Key::new("every-path", name).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of_bytes("request")
}

/// A driver over a shared faulty store on `clock`.
fn driver(store: &Arc<Faulty>) -> Idempotency<Arc<Faulty>> {
    Idempotency::builder(Arc::clone(store))
        .lease(LEASE)
        .heartbeat(Heartbeat::Off)
        .store_timeout(TIMEOUT)
        .build()
        .unwrap()
}

fn store_on(clock: &ManualClock) -> Arc<Faulty> {
    Arc::new(Faulty::new(MemoryStore::with_clock(clock.clone())))
}

#[tokio::test(start_paused = true)]
async fn a_result_survives_the_caller_going_away_after_the_work_returned() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    let runs = Arc::new(AtomicUsize::new(0));
    let work = |runs: Arc<AtomicUsize>| {
        move |_ctx| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, WorkError<String>>("charged".to_string())
        }
    };
    // The caller gives up while the result is on its way to a slow store.
    store.set(Operation::Complete, Fault::Slow(TIMEOUT / 2));
    let gave_up = tokio::time::timeout(
        TIMEOUT / 4,
        idem.execute(&key("dropped"), fp(), work(Arc::clone(&runs))),
    )
    .await;
    assert!(gave_up.is_err(), "the caller timed out first");
    tokio::time::sleep(Duration::from_secs(5)).await;
    store.set(Operation::Complete, Fault::None);
    let record = store.get(&key("dropped")).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        State::Completed,
        "the write went on without the caller"
    );
    clock.advance(2 * LEASE);
    let retry = idem
        .execute(&key("dropped"), fp(), work(Arc::clone(&runs)))
        .await
        .unwrap();
    assert_eq!(
        retry,
        Outcome::Completed {
            value: "charged".to_string(),
            replayed: true
        }
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");
}

/// A store that panics while the result's write waits: the caller sees that one panic, and
/// nothing goes on to poll the panicked write again (which would panic a second time, in
/// a task of its own).
#[tokio::test]
async fn a_store_that_panics_mid_write_panics_once_in_the_caller() {
    static RESUMED: AtomicUsize = AtomicUsize::new(0);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .map(|text| (*text).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        if message.contains("resumed after panicking") {
            RESUMED.fetch_add(1, Ordering::SeqCst);
        }
        previous(info);
    }));
    let store = store_on(&ManualClock::new());
    store.set(Operation::Complete, Fault::Panic);
    let idem = driver(&store);
    let caller = tokio::spawn(async move {
        idem.execute(&key("panics"), fp(), |_ctx| async {
            Ok::<_, WorkError<String>>("charged".to_owned())
        })
        .await
    });
    let err = caller
        .await
        .expect_err("the store's panic reaches the caller");
    assert!(err.is_panic());
    // Anything handed on would run now.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        RESUMED.load(Ordering::SeqCst),
        0,
        "a panicked write was polled again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_takeover_whose_answer_was_lost_still_says_it_resumed() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    // An earlier attempt claimed and then vanished.
    let abandoned = ClaimRequest::new(key("lost"), fp(), LEASE, 10 * LEASE);
    assert!(matches!(
        store.inner.claim(&abandoned).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    clock.advance(LEASE);
    // The takeover lands, but its answer is lost; the retry gets the same lease back.
    store.set(Operation::Claim, Fault::LoseAnswer);
    let idem = driver(&store);
    let outcome = idem
        .execute(&key("lost"), fp(), |ctx| async move {
            Ok::<_, WorkError<String>>((ctx.resumed(), ctx.token()))
        })
        .await
        .unwrap();
    assert_eq!(outcome.into_result(), Ok((true, 2)), "a takeover, told so");

    // A takeover in the very millisecond the record was created (a Retryable run released
    // its lease at once), its answer lost: still a takeover.
    let released = idem
        .execute(&key("same-ms"), fp(), |_ctx| async {
            Err::<bool, _>(WorkError::Retryable("down".to_string()))
        })
        .await
        .unwrap();
    assert!(matches!(released, Outcome::Retryable(_)));
    store.set(Operation::Claim, Fault::LoseAnswer);
    let outcome = idem
        .execute(&key("same-ms"), fp(), |ctx| async move {
            Ok::<_, WorkError<String>>(ctx.resumed())
        })
        .await
        .unwrap();
    assert_eq!(outcome.into_result(), Ok(true));

    // A fresh claim whose answer was lost is still a fresh one.
    store.set(Operation::Claim, Fault::LoseAnswer);
    let outcome = idem
        .execute(&key("fresh"), fp(), |ctx| async move {
            Ok::<_, WorkError<String>>(ctx.resumed())
        })
        .await
        .unwrap();
    assert_eq!(outcome.into_result(), Ok(false));
}

#[tokio::test(start_paused = true)]
async fn a_release_into_a_hung_store_is_bounded() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    store.set(Operation::Release, Fault::Hang);
    let started = tokio::time::Instant::now();
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        idem.execute(&key("release"), fp(), |_ctx| async {
            Err::<String, _>(WorkError::Retryable("provider down".to_string()))
        }),
    )
    .await
    .expect("execute returns although the release never answers");
    assert!(matches!(outcome, Ok(Outcome::Retryable(_))));
    // Three tries of one store_timeout each, and the backoff between them.
    assert!(started.elapsed() <= 3 * TIMEOUT + Duration::from_millis(100));
}

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

#[tokio::test(start_paused = true)]
async fn writes_keep_trying_for_the_lease_whatever_the_stores_clock_says() {
    // The store's clock is years behind this process's: its lease_until is long past on
    // the process's clock, yet the lease is live in the store.
    let clock = ManualClock::starting_at(Timestamp::from_unix_millis(1_000_000));
    let store = store_on(&clock);
    let idem = driver(&store);
    store.set(Operation::Complete, Fault::Refuse(6));
    let runs = AtomicUsize::new(0);
    let work = |_ctx| async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, WorkError<String>>("ok".to_string())
    };
    let first = idem.execute(&key("clock"), fp(), work).await;
    assert!(
        matches!(
            first,
            Ok(Outcome::Completed {
                replayed: false,
                ..
            })
        ),
        "{first:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn the_longest_wait_does_not_panic() {
    let idem = Idempotency::builder(MemoryStore::new())
        .in_flight(InFlightPolicy::Wait {
            timeout: Duration::MAX,
        })
        .build()
        .unwrap();
    let outcome = idem
        .execute(&key("wait"), fp(), |_ctx| async {
            Ok::<_, WorkError<String>>(1)
        })
        .await
        .unwrap();
    assert_eq!(outcome.into_result(), Ok(1));
}

/// A ledger of effects kept outside the store.
#[derive(Default, Clone)]
struct Ledger(Arc<Mutex<Vec<String>>>);

impl Ledger {
    fn add(&self, effect: &str) {
        self.0.lock().unwrap().push(effect.to_string());
    }
    fn count(&self, effect: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| *e == effect)
            .count()
    }
}

#[tokio::test(start_paused = true)]
async fn a_takeover_accounts_for_every_undo_the_failed_run_registered() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    let ledger = Ledger::default();
    let k = key("saga-early");
    // First run: reserve and charge, then shipping fails for good; the charge's refund
    // is not possible yet (Retryable), so the execution stays held mid-compensation.
    let l = ledger.clone();
    let first = idem
        .execute(&k, fp(), move |ctx| async move {
            let l2 = l.clone();
            ctx.step_with_undo(
                "reserve",
                || async { Ok::<_, WorkError<String>>(()) },
                move |()| async move {
                    l2.add("release");
                    Ok(())
                },
            )
            .await?;
            ctx.step_with_undo(
                "charge",
                || async { Ok::<_, WorkError<String>>(()) },
                |()| async { Err(WorkError::Retryable("refunds are down".to_string())) },
            )
            .await?;
            Err::<(), _>(WorkError::Permanent("no courier".to_string()))
        })
        .await;
    assert!(
        matches!(first, Err(Error::CompensationPending { ref step }) if step == "charge"),
        "{first:?}"
    );
    clock.advance(LEASE);
    // The takeover's run of the work stops early, before it re-registers the charge's
    // undo: a plain call that is momentarily down.
    let l = ledger.clone();
    let second = idem
        .execute(&k, fp(), move |ctx| async move {
            let l2 = l.clone();
            ctx.step_with_undo(
                "reserve",
                || async { Ok::<_, WorkError<String>>(()) },
                move |()| async move {
                    l2.add("release");
                    Ok(())
                },
            )
            .await?;
            Err::<(), _>(WorkError::Retryable("fraud check down".to_string()))
        })
        .await;
    assert!(
        matches!(second, Err(Error::CompensationPending { ref step }) if step == "charge"),
        "never stored as compensated with the charge not refunded: {second:?}"
    );
    assert_eq!(ledger.count("release"), 0, "undos run in reverse order");
    clock.advance(LEASE);
    // A run that goes all the way but whose code no longer registers the charge's undo:
    // it is reported pending, and the reservation is released.
    let l = ledger.clone();
    let third = idem
        .execute(&k, fp(), move |ctx| async move {
            let l2 = l.clone();
            ctx.step_with_undo(
                "reserve",
                || async { Ok::<_, WorkError<String>>(()) },
                move |()| async move {
                    l2.add("release");
                    Ok(())
                },
            )
            .await?;
            Ok::<(), WorkError<String>>(())
        })
        .await
        .unwrap();
    let Outcome::Compensated { compensation, .. } = third else {
        panic!("compensated: {third:?}")
    };
    assert_eq!(compensation.undone, ["reserve"]);
    assert_eq!(compensation.pending, ["charge"]);
    assert!(!compensation.is_complete());
    assert_eq!(ledger.count("release"), 1);
}

#[tokio::test(start_paused = true)]
async fn an_undo_interrupted_while_it_runs_never_runs_again() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    let ledger = Ledger::default();
    let k = key("undo-interrupted");
    let work = charge_then_decline;
    let first = tokio::time::timeout(
        Duration::from_secs(5),
        idem.execute(&k, fp(), work(ledger.clone(), true)),
    )
    .await;
    assert!(first.is_err(), "the caller gave up mid-undo");
    clock.advance(LEASE);
    let second = idem
        .execute(&k, fp(), work(ledger.clone(), false))
        .await
        .unwrap();
    let Outcome::Compensated { compensation, .. } = second else {
        panic!("compensated: {second:?}")
    };
    assert_eq!(compensation.interrupted, ["charge"]);
    assert!(compensation.undone.is_empty());
    assert_eq!(ledger.count("refund"), 1, "the refund went out once");
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

/// The work of [`saga_of`].
type SagaRun =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), WorkError<String>>> + Send>>;

/// A saga over a shared ledger: `steps`, each with an undo that logs `undo:NAME` after
/// `pause`, then a permanent failure.
fn saga_of(
    ledger: &Ledger,
    steps: &'static [&'static str],
    pause: Duration,
) -> impl FnOnce(idem_core::Context) -> SagaRun + Clone {
    let ledger = ledger.clone();
    move |ctx: idem_core::Context| {
        Box::pin(async move {
            for name in steps {
                let l = ledger.clone();
                ctx.step_with_undo(
                    name,
                    || async { Ok::<_, WorkError<String>>(()) },
                    move |()| async move {
                        tokio::time::sleep(pause).await;
                        l.add(&format!("undo:{name}"));
                        Ok(())
                    },
                )
                .await?;
            }
            Err(WorkError::Permanent("declined".to_string()))
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_caller_gone_mid_compensation_stops_none_of_it() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    let ledger = Ledger::default();
    let k = key("gone-mid-saga");
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        idem.execute(
            &k,
            fp(),
            saga_of(&ledger, &["reserve", "charge"], Duration::from_secs(2)),
        ),
    )
    .await;
    assert!(gave_up.is_err(), "the caller left during the first undo");
    // Nobody retries; the compensation goes on by itself.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(ledger.count("undo:charge"), 1);
    assert_eq!(ledger.count("undo:reserve"), 1);
    let record = store.get(&k).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        State::Failed,
        "the compensated failure is stored"
    );
}

#[tokio::test(start_paused = true)]
async fn the_lease_is_renewed_for_the_whole_compensation() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let lease = Duration::from_secs(3);
    let builder = |store: &Arc<Faulty>| {
        Idempotency::builder(Arc::clone(store))
            .lease(lease)
            .heartbeat(Heartbeat::Every(Duration::from_secs(1)))
            .store_timeout(TIMEOUT)
    };
    let idem = builder(&store).build().unwrap();
    let waiting = builder(&store)
        .in_flight(InFlightPolicy::Wait {
            timeout: Duration::from_secs(60),
        })
        .build()
        .unwrap();
    // The store's clock follows the runtime's, so leases end as time passes.
    let ticking = ticking(&clock);
    let ledger = Ledger::default();
    let k = key("renewed-saga");
    const FIVE: &[&str] = &["a", "b", "c", "d", "e"];
    let first = tokio::spawn({
        let (idem, k, ledger) = (idem.clone(), k.clone(), ledger.clone());
        async move {
            idem.execute(&k, fp(), saga_of(&ledger, FIVE, Duration::from_millis(900)))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let second = waiting
        .execute(&k, fp(), saga_of(&ledger, FIVE, Duration::from_millis(900)))
        .await;
    let first = first.await.unwrap();
    ticking.abort();
    let Ok(Outcome::Compensated { compensation, .. }) = first else {
        panic!("the first owner compensates: {first:?}")
    };
    assert_eq!(compensation.undone, ["e", "d", "c", "b", "a"]);
    assert!(
        matches!(second, Ok(Outcome::Compensated { replayed: true, .. })),
        "the duplicate waited for the owner, never took over: {second:?}"
    );
    for step in FIVE {
        assert_eq!(ledger.count(&format!("undo:{step}")), 1);
    }
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
async fn an_undo_whose_outcome_is_unknown_is_never_run_again() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let idem = driver(&store);
    let ledger = Ledger::default();
    let k = key("undo-unknown");
    let work = |ledger: Ledger| {
        move |ctx: idem_core::Context| async move {
            let l = ledger.clone();
            ctx.step_with_undo(
                "charge",
                || async { Ok::<_, WorkError<String>>(()) },
                move |()| async move {
                    l.add("refund");
                    Err(WorkError::Unknown("the refund timed out".to_string()))
                },
            )
            .await?;
            Err::<(), _>(WorkError::Permanent("declined".to_string()))
        }
    };
    let first = idem.execute(&k, fp(), work(ledger.clone())).await.unwrap();
    let Outcome::Compensated { compensation, .. } = first else {
        panic!("compensated: {first:?}")
    };
    assert_eq!(compensation.interrupted, ["charge"]);
    clock.advance(2 * LEASE);
    let again = idem.execute(&k, fp(), work(ledger.clone())).await.unwrap();
    assert!(again.replayed());
    assert_eq!(
        ledger.count("refund"),
        1,
        "a refund that may have gone out is not sent again"
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

/// A charge whose refund (logged `refund`) then hangs for ever when `hang` (the process
/// dies after the refund went out), and a permanent failure after it.
fn charge_then_decline(ledger: Ledger, hang: bool) -> impl FnOnce(idem_core::Context) -> SagaRun {
    move |ctx: idem_core::Context| {
        Box::pin(async move {
            ctx.step_with_undo(
                "charge",
                || async { Ok::<_, WorkError<String>>(()) },
                move |()| async move {
                    ledger.add("refund");
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    Ok(())
                },
            )
            .await?;
            Err(WorkError::Permanent("declined".to_string()))
        })
    }
}

/// A clock that follows the runtime's (paused) time, moved by a background task.
fn ticking(clock: &ManualClock) -> tokio::task::JoinHandle<()> {
    let clock = clock.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            clock.advance(Duration::from_millis(100));
        }
    })
}

#[tokio::test(start_paused = true)]
async fn an_undo_that_never_returns_does_not_hold_the_key_for_ever() {
    let clock = ManualClock::new();
    let store = store_on(&clock);
    let lease = Duration::from_secs(3);
    let idem = Idempotency::builder(Arc::clone(&store))
        .lease(lease)
        .heartbeat(Heartbeat::Every(Duration::from_secs(1)))
        .store_timeout(TIMEOUT)
        .build()
        .unwrap();
    let ticks = ticking(&clock);
    let ledger = Ledger::default();
    let k = key("undo-hangs");
    let work = charge_then_decline;
    let gave_up = tokio::time::timeout(
        Duration::from_secs(1),
        idem.execute(&k, fp(), work(ledger.clone(), true)),
    )
    .await;
    assert!(gave_up.is_err(), "the caller left; the undo hangs on");
    // One more lease of renewals after the caller left, then the lease ends.
    tokio::time::sleep(4 * lease).await;
    let retry = idem.execute(&k, fp(), work(ledger.clone(), false)).await;
    ticks.abort();
    let Ok(Outcome::Compensated { compensation, .. }) = retry else {
        panic!("a retry takes over once the lease ends: {retry:?}")
    };
    assert_eq!(compensation.interrupted, ["charge"]);
    assert_eq!(ledger.count("refund"), 1);
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
    let l = ledger.clone();
    let outcome = idem
        .execute(&key("refused-compensated"), fp(), move |ctx| async move {
            ctx.step_with_undo(
                "charge",
                || async { Ok::<_, WorkError<String>>(()) },
                move |()| async move {
                    l.add("refund");
                    Ok(())
                },
            )
            .await?;
            Err::<(), _>(WorkError::Permanent("x".repeat(300)))
        })
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
