//! Long work and owners that stop without a word (docs/DESIGN.md §2.5): the retention
//! cliff, an owner cut off from its store, and undo marks that only move forward.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Admin, ConfigError, Error, Fingerprint, Heartbeat, Idempotency, Key, ManualClock, MemoryStore,
    Outcome, Record, Store, StoreError, WorkError, key::StepName, record::Lease,
    store::ClaimOutcome, store::ClaimRequest, store::Operation, store::RenewOutcome,
    store::WriteOutcome,
};

fn key(name: &str) -> Key {
    Key::new("long-work", name).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of_bytes("request")
}

/// The memory store, with renewals cut off on demand (a partition between the owner and
/// its store, always or for a window of time), renewals answered late, a first claim that
/// never arrives, and, on demand, an undo's start mark delivered again right after its
/// end mark (a delayed duplicate of the owner's own write).
struct Store2 {
    inner: MemoryStore,
    renewals_fail: AtomicBool,
    /// Renewals sent within this window fail.
    renewals_fail_between: Mutex<Option<(tokio::time::Instant, tokio::time::Instant)>>,
    /// Renewals apply at once and answer this much later.
    renewal_answers_after: Mutex<Duration>,
    /// The next claim never reaches the store and never answers.
    claim_lost_once: AtomicBool,
    /// Claims apply at once and answer this much later.
    claim_answers_after: Mutex<Duration>,
    /// An operator releases the key just before the next renewal arrives.
    operator_release_before_renewal: AtomicBool,
    redeliver_start_marks: AtomicBool,
    /// The last start mark written: the lease, its name and its value.
    start_mark: Mutex<Option<(Lease, StepName, Vec<u8>)>>,
    renewals: AtomicUsize,
}

impl Store2 {
    fn new(inner: MemoryStore) -> Arc<Self> {
        Arc::new(Self {
            inner,
            renewals_fail: AtomicBool::new(false),
            renewals_fail_between: Mutex::new(None),
            renewal_answers_after: Mutex::new(Duration::ZERO),
            claim_lost_once: AtomicBool::new(false),
            claim_answers_after: Mutex::new(Duration::ZERO),
            operator_release_before_renewal: AtomicBool::new(false),
            redeliver_start_marks: AtomicBool::new(false),
            start_mark: Mutex::new(None),
            renewals: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl Store for Store2 {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        if self.claim_lost_once.swap(false, Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let claimed = self.inner.claim(request).await;
        let late = *self.claim_answers_after.lock().unwrap();
        tokio::time::sleep(late).await;
        claimed
    }
    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
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
        if self
            .operator_release_before_renewal
            .swap(false, Ordering::SeqCst)
        {
            self.inner.release_key(&lease.key).await?;
        }
        let now = tokio::time::Instant::now();
        let cut_off = *self.renewals_fail_between.lock().unwrap();
        if self.renewals_fail.load(Ordering::SeqCst)
            || cut_off.is_some_and(|(from, to)| from <= now && now < to)
        {
            return Err(StoreError::Unavailable {
                operation: Operation::Renew,
                source: "no route to host".into(),
            });
        }
        let renewed = self.inner.renew(lease, extend).await;
        let late = *self.renewal_answers_after.lock().unwrap();
        tokio::time::sleep(late).await;
        renewed
    }
    async fn checkpoint(
        &self,
        lease: &Lease,
        step: &StepName,
        value: &[u8],
    ) -> Result<WriteOutcome, StoreError> {
        let written = self.inner.checkpoint(lease, step, value).await?;
        if self.redeliver_start_marks.load(Ordering::SeqCst)
            && step.as_str().starts_with("idem.undo")
        {
            if value.starts_with(b"started") {
                *self.start_mark.lock().unwrap() =
                    Some((lease.clone(), step.clone(), value.to_vec()));
            } else {
                let delayed = self.start_mark.lock().unwrap().take();
                if let Some((lease, step, value)) = delayed {
                    // The start mark's first delivery was slow: a copy lands after the end.
                    let _ = self.inner.checkpoint(&lease, &step, &value).await?;
                }
            }
        }
        Ok(written)
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }
}

/// The minimal case: lease and retention of 2 s; the work checkpoints `charge`,
/// then its outcome is unknown (it stops without releasing). 2.1 s later the retry must
/// find the step, not a fresh record.
#[tokio::test]
async fn a_retry_after_the_lease_ran_out_never_charges_twice() {
    let clock = ManualClock::new();
    let store = MemoryStore::with_clock(clock.clone());
    let two = Duration::from_secs(2);
    let idem = Idempotency::builder(store)
        .lease(two)
        .retention(two)
        .build()
        .unwrap();
    let charges = Arc::new(AtomicUsize::new(0));
    let run = |charges: Arc<AtomicUsize>, finish: bool| {
        move |ctx: idem_core::Context| async move {
            let charge: String = ctx
                .step("charge", || async move {
                    charges.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, WorkError<String>>("ch_1".to_string())
                })
                .await?;
            if finish {
                Ok(charge)
            } else {
                Err(WorkError::Unknown("the receipt timed out".to_string()))
            }
        }
    };
    let first = idem
        .execute(&key("cliff"), fp(), run(Arc::clone(&charges), false))
        .await;
    assert!(matches!(first, Ok(Outcome::Unknown(_))), "{first:?}");
    clock.advance(Duration::from_millis(2_100));
    let second = idem
        .execute(&key("cliff"), fp(), run(Arc::clone(&charges), true))
        .await
        .unwrap();
    assert_eq!(second.value(), Some("ch_1".to_string()));
    assert_eq!(
        charges.load(Ordering::SeqCst),
        1,
        "the retry after the lease ran out charged again: the record was gone with its step"
    );
}

/// Renewals fail without being fenced (a partition): once the lease it last confirmed has
/// ended by its own clock, the owner starts no new step, and the work is told.
#[tokio::test(start_paused = true)]
async fn an_owner_cut_off_from_its_store_stops_starting_steps() {
    let store = Store2::new(MemoryStore::new());
    let lease = Duration::from_millis(300);
    let idem = Idempotency::builder(Arc::clone(&store))
        .lease(lease)
        .build()
        .unwrap();
    store.renewals_fail.store(true, Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    let steps = Arc::new(Mutex::new(Vec::new()));
    let told = Arc::new(AtomicBool::new(false));
    let outcome = idem
        .execute(&key("partition"), fp(), {
            let (steps, told) = (Arc::clone(&steps), Arc::clone(&told));
            move |ctx| async move {
                let watcher = tokio::spawn({
                    let (ctx, told) = (ctx.clone(), Arc::clone(&told));
                    async move {
                        ctx.lease_lost().await;
                        told.store(true, Ordering::SeqCst);
                    }
                });
                for i in 0..40u32 {
                    let steps = Arc::clone(&steps);
                    ctx.step(&format!("s{i}"), || async move {
                        steps.lock().unwrap().push(started.elapsed());
                        Ok::<_, WorkError<String>>(i)
                    })
                    .await?;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                watcher.abort();
                Ok::<_, WorkError<String>>(())
            }
        })
        .await;
    assert!(
        matches!(outcome, Err(Error::LeaseLost)),
        "the work is interrupted once the lease ends on the owner's clock: {outcome:?}"
    );
    let steps = steps.lock().unwrap().clone();
    assert!(
        store.renewals.load(Ordering::SeqCst) >= 2,
        "the heartbeat tried to renew"
    );
    assert!(
        steps.iter().all(|at| *at < lease),
        "no step starts after the lease ended: {steps:?}"
    );
    assert_eq!(
        steps.len(),
        6,
        "steps every 50 ms until the lease's end: {steps:?}"
    );
    assert!(told.load(Ordering::SeqCst), "Context::lease_lost completed");
}

/// The same owner with a store that answers: its renewals move its lease, and the work
/// runs past the first lease to its end.
#[tokio::test(start_paused = true)]
async fn an_owner_whose_renewals_land_goes_on() {
    let store = Store2::new(MemoryStore::new());
    let idem = Idempotency::builder(Arc::clone(&store))
        .lease(Duration::from_millis(300))
        .build()
        .unwrap();
    let outcome = idem
        .execute(&key("renewed"), fp(), |ctx| async move {
            for i in 0..20u32 {
                ctx.step(
                    &format!("s{i}"),
                    || async move { Ok::<_, WorkError<String>>(i) },
                )
                .await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok::<_, WorkError<String>>(ctx.is_lease_lost())
        })
        .await
        .unwrap();
    assert_eq!(outcome.value(), Some(false));
}

/// Without heartbeats, `lease_lost` completes by itself when the lease ends, with no
/// store call, and a step after that is refused.
#[tokio::test(start_paused = true)]
async fn without_heartbeats_the_lease_ends_on_the_owners_clock() {
    let store = Store2::new(MemoryStore::new());
    let lease = Duration::from_millis(500);
    let idem = Idempotency::builder(Arc::clone(&store))
        .lease(lease)
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let outcome = idem
        .execute(&key("no-heartbeat"), fp(), |ctx| async move {
            ctx.lease_lost().await;
            let waited = started.elapsed();
            assert!(ctx.is_lease_lost());
            let late = ctx
                .step("late", || async { Ok::<_, WorkError<String>>(()) })
                .await;
            Ok::<_, WorkError<String>>((waited, late.is_err()))
        })
        .await
        .unwrap();
    let (waited, refused) = outcome.value().unwrap();
    assert!(refused, "a step after the lease ended is refused");
    assert!(
        waited < lease && waited >= lease - lease / 50,
        "lease_lost completes a fiftieth of the lease before its end: {waited:?}"
    );
    assert_eq!(store.renewals.load(Ordering::SeqCst), 0);
}

/// An undo answers Retryable, so its end mark says `retry`; a delayed copy of its own
/// start mark lands after that. The next run must still run the undo (not report it
/// interrupted), and exactly once more.
#[tokio::test(start_paused = true)]
async fn delayed_start_marks_do_not_undo_an_end() {
    let clock = ManualClock::new();
    let store = Store2::new(MemoryStore::with_clock(clock.clone()));
    store.redeliver_start_marks.store(true, Ordering::SeqCst);
    let lease = Duration::from_secs(30);
    let idem = Idempotency::builder(Arc::clone(&store))
        .lease(lease)
        .heartbeat(Heartbeat::Off)
        .build()
        .unwrap();
    let refunds = Arc::new(AtomicUsize::new(0));
    let run = |refunds: Arc<AtomicUsize>| {
        move |ctx: idem_core::Context| async move {
            ctx.step_with_undo(
                "charge",
                || async { Ok::<_, WorkError<String>>("ch_1".to_string()) },
                move |_charge: String| async move {
                    // Refunds are down the first time: nothing happened.
                    if refunds.fetch_add(1, Ordering::SeqCst) == 0 {
                        Err(WorkError::Retryable("refunds are down".to_string()))
                    } else {
                        Ok(())
                    }
                },
            )
            .await?;
            Err::<(), _>(WorkError::Permanent("no courier".to_string()))
        }
    };
    let first = idem
        .execute(&key("undo-marks"), fp(), run(Arc::clone(&refunds)))
        .await;
    assert!(
        matches!(first, Err(Error::CompensationPending { ref step }) if step == "charge"),
        "{first:?}"
    );
    clock.advance(lease);
    let second = idem
        .execute(&key("undo-marks"), fp(), run(Arc::clone(&refunds)))
        .await
        .unwrap();
    let Outcome::Compensated { compensation, .. } = second else {
        panic!("compensated: {second:?}")
    };
    assert_eq!(
        compensation.undone,
        ["charge"],
        "the retryable undo ran again; a stale start mark must not make it interrupted: \
         {compensation:?}"
    );
    assert!(compensation.interrupted.is_empty());
    assert_eq!(refunds.load(Ordering::SeqCst), 2);
}

/// A renewal sent while the lease was live, answered just after the owner's own end of
/// the lease (a slow store): the lease never lapsed, and the owner goes on. It stops for
/// good only when fenced.
#[tokio::test(start_paused = true)]
async fn a_renewal_answered_just_after_the_owners_end_keeps_the_lease() {
    let store = Store2::new(MemoryStore::new());
    // Every 150 ms on a lease of 300: each renewal lands at once and answers 147 ms
    // later, past the owner's end (294 ms after the claim), within its 150 ms bound.
    *store.renewal_answers_after.lock().unwrap() = Duration::from_millis(147);
    let idem = Idempotency::builder(Arc::clone(&store))
        .lease(Duration::from_millis(300))
        .heartbeat(Heartbeat::Every(Duration::from_millis(150)))
        .build()
        .unwrap();
    let outcome = idem
        .execute(&key("slow-renewal"), fp(), |ctx| async move {
            // Someone watches the lease: it reads the lost state in the window (294 to
            // 297 ms), which an owner that stopped for good on that reading never left.
            let watcher = tokio::spawn({
                let ctx = ctx.clone();
                async move { ctx.lease_lost().await }
            });
            tokio::time::sleep(Duration::from_millis(600)).await;
            ctx.step("late", || async { Ok::<_, WorkError<String>>(1) })
                .await?;
            watcher.abort();
            Ok::<_, WorkError<String>>("done".to_string())
        })
        .await;
    assert!(
        matches!(outcome, Ok(Outcome::Completed { .. })),
        "the renewals kept the lease; the owner must not have stopped for good: {outcome:?}"
    );
}

/// The work fails late in its lease, the last renewal before it having failed: the
/// compensation's heartbeat renews at once (one interval after the lease was last
/// confirmed), not one interval after the compensation began, past the lease's end.
#[tokio::test(start_paused = true)]
async fn a_compensation_late_in_the_lease_renews_at_once() {
    let store = Store2::new(MemoryStore::new());
    let start = tokio::time::Instant::now();
    *store.renewals_fail_between.lock().unwrap() = Some((
        start + Duration::from_millis(150),
        start + Duration::from_millis(250),
    ));
    let idem = Idempotency::builder(Arc::clone(&store))
        .lease(Duration::from_millis(300))
        .build()
        .unwrap();
    let undone = Arc::new(Mutex::new(Vec::new()));
    let outcome = idem
        .execute(&key("late-compensation"), fp(), {
            let undone = Arc::clone(&undone);
            move |ctx| async move {
                for (name, takes) in [("reserve", 10), ("charge", 150)] {
                    let undone = Arc::clone(&undone);
                    ctx.step_with_undo(
                        name,
                        || async { Ok::<_, WorkError<String>>(()) },
                        move |()| async move {
                            tokio::time::sleep(Duration::from_millis(takes)).await;
                            undone.lock().unwrap().push(name);
                            Ok(())
                        },
                    )
                    .await?;
                }
                // The renewal at 100 ms landed (the lease now ends at 400 ms); the one at
                // 200 ms failed. The work fails at 299 ms.
                tokio::time::sleep_until(start + Duration::from_millis(299)).await;
                Err::<(), _>(WorkError::Permanent("no courier".to_string()))
            }
        })
        .await;
    let Ok(Outcome::Compensated { compensation, .. }) = outcome else {
        panic!("the compensation finishes: {outcome:?}")
    };
    assert_eq!(compensation.undone, ["charge", "reserve"]);
    assert_eq!(*undone.lock().unwrap(), ["charge", "reserve"]);
}

/// The first try of the claim never arrives; the second, after the store timeout, wins a
/// lease that starts then. The owner's own end of the lease counts from a renewal sent
/// at once, not from the first try: its steps run.
#[tokio::test(start_paused = true)]
async fn a_claim_won_on_a_retry_starts_with_a_whole_lease() {
    let store = Store2::new(MemoryStore::new());
    store.claim_lost_once.store(true, Ordering::SeqCst);
    let idem = Idempotency::builder(Arc::clone(&store))
        .lease(Duration::from_secs(2))
        .store_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let outcome = idem
        .execute(&key("slow-claim"), fp(), |ctx| async move {
            ctx.step("charge", || async { Ok::<_, WorkError<String>>(1) })
                .await
        })
        .await;
    assert!(
        matches!(outcome, Ok(Outcome::Completed { .. })),
        "a lease won on the second try, 3 s after the first was sent, is whole: {outcome:?}"
    );
}

/// One claim try answered after most of the lease (a slow store, a timeout longer than
/// the lease): the owner confirms its lease with a renewal before it starts, so its steps
/// run.
#[tokio::test(start_paused = true)]
async fn a_claim_answered_late_starts_with_a_whole_lease() {
    let store = Store2::new(MemoryStore::new());
    *store.claim_answers_after.lock().unwrap() = Duration::from_millis(1_500);
    let idem = Idempotency::builder(Arc::clone(&store))
        .lease(Duration::from_secs(2))
        .store_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let outcome = idem
        .execute(&key("late-claim-answer"), fp(), |ctx| async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            ctx.step("charge", || async { Ok::<_, WorkError<String>>(1) })
                .await
        })
        .await;
    assert!(
        matches!(outcome, Ok(Outcome::Completed { .. })),
        "{outcome:?}"
    );
    assert_eq!(store.renewals.load(Ordering::SeqCst), 1, "confirmed once");
}

/// A claim answered late, and an operator released the key before the confirming
/// renewal: the work never starts.
#[tokio::test(start_paused = true)]
async fn a_claim_fenced_before_the_work_starts_runs_nothing() {
    let store = Store2::new(MemoryStore::new());
    *store.claim_answers_after.lock().unwrap() = Duration::from_secs(11);
    store
        .operator_release_before_renewal
        .store(true, Ordering::SeqCst);
    let idem = Idempotency::builder(Arc::clone(&store))
        .lease(Duration::from_secs(30))
        .store_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let outcome = idem
        .execute(&key("fenced-claim"), fp(), {
            let ran = Arc::clone(&ran);
            move |_ctx| async move {
                ran.store(true, Ordering::SeqCst);
                Ok::<_, WorkError<String>>(())
            }
        })
        .await;
    assert!(matches!(outcome, Err(Error::LeaseLost)), "{outcome:?}");
    assert!(!ran.load(Ordering::SeqCst), "the work must not start");
}

/// `Heartbeat::Every` must leave a renewal time to land before the owner stops itself.
#[test]
fn a_heartbeat_too_close_to_the_lease_is_refused() {
    let lease = Duration::from_millis(300);
    let longest = (lease - lease / 50) * 9 / 10;
    let build = |every| {
        Idempotency::builder(MemoryStore::new())
            .lease(lease)
            .heartbeat(Heartbeat::Every(every))
            .build()
    };
    assert!(build(longest).is_ok());
    assert!(matches!(
        build(longest + Duration::from_nanos(1)),
        Err(ConfigError::HeartbeatNotShorterThanLease { .. })
    ));
}
