//! A store outage after the work ran: the driver keeps trying to store the result while
//! its lease lasts, so the work does not run a second time (found by the chaos runs: a
//! Redis restart outlived the three quick tries, and the key's work ran again after its
//! lease ended).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{
    Error, Fingerprint, Heartbeat, Idempotency, Key, MemoryStore, Outcome, Record, Store,
    StoreError, WorkError, key::StepName, record::Lease, store::ClaimOutcome, store::ClaimRequest,
    store::Operation, store::RenewOutcome, store::WriteOutcome,
};

/// The memory store, with its writes after the claim failing `outage` times first
/// (or, with `hang`, never answering instead: a connection whose packets are dropped).
struct Outage {
    inner: MemoryStore,
    outage: usize,
    failed: AtomicUsize,
    hang: bool,
    /// Calls hanging now: a hung call's future not yet dropped.
    hanging: AtomicUsize,
    /// The most calls still hanging when a call got through.
    hanging_at_answer: AtomicUsize,
}

/// Counts a hung call until its future is dropped.
struct Hanging<'a>(&'a AtomicUsize);

impl Drop for Hanging<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Outage {
    async fn down(&self, operation: Operation) -> Result<(), StoreError> {
        if self.failed.fetch_add(1, Ordering::SeqCst) < self.outage {
            if self.hang {
                self.hanging.fetch_add(1, Ordering::SeqCst);
                let _hanging = Hanging(&self.hanging);
                std::future::pending::<()>().await;
            }
            return Err(StoreError::Unavailable {
                operation,
                source: "connection refused".into(),
            });
        }
        self.hanging_at_answer
            .fetch_max(self.hanging.load(Ordering::SeqCst), Ordering::SeqCst);
        Ok(())
    }
}

#[async_trait]
impl Store for Outage {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(request).await
    }
    async fn complete(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.down(Operation::Complete).await?;
        self.inner.complete(lease, response).await
    }
    async fn fail(&self, lease: &Lease, response: &[u8]) -> Result<WriteOutcome, StoreError> {
        self.down(Operation::Fail).await?;
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
        self.down(Operation::Checkpoint).await?;
        self.inner.checkpoint(lease, step, value).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(limit).await
    }
}

fn driver(outage: usize, lease: Duration) -> Idempotency<Outage> {
    builder(outage, lease, false).build().unwrap()
}

fn builder(outage: usize, lease: Duration, hang: bool) -> idem_core::IdempotencyBuilder<Outage> {
    let store = Outage {
        inner: MemoryStore::new(),
        outage,
        failed: AtomicUsize::new(0),
        hang,
        hanging: AtomicUsize::new(0),
        hanging_at_answer: AtomicUsize::new(0),
    };
    Idempotency::builder(store)
        .lease(lease)
        .heartbeat(Heartbeat::Off)
}

/// The work: counts its runs and answers `charge-N`, N the runs before it.
async fn charge(runs: Arc<AtomicUsize>) -> Result<String, WorkError<()>> {
    let n = runs.fetch_add(1, Ordering::SeqCst);
    Ok(format!("charge-{n}"))
}

#[tokio::test(start_paused = true)]
async fn a_result_is_stored_across_an_outage_shorter_than_the_lease() {
    // Eight failures in a row: the old three quick tries gave up after 75 ms.
    let idem = driver(8, Duration::from_secs(30));
    let key = Key::new("payments", "outage").unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let work = |_ctx| charge(Arc::clone(&runs));
    let first = idem
        .execute(&key, Fingerprint::of_bytes("r"), work)
        .await
        .unwrap();
    assert_eq!(first.value().as_deref(), Some("charge-0"));
    let again = idem
        .execute(&key, Fingerprint::of_bytes("r"), work)
        .await
        .unwrap();
    assert!(again.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");
}

#[tokio::test(start_paused = true)]
async fn a_checkpoint_is_stored_across_an_outage_shorter_than_the_lease() {
    let idem = driver(8, Duration::from_secs(30));
    let key = Key::new("payments", "outage-step").unwrap();
    let outcome = idem
        .execute(&key, Fingerprint::of_bytes("r"), |ctx| async move {
            ctx.step("debit", || async { Ok::<_, WorkError<()>>(500u32) })
                .await
        })
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Completed { value: 500, .. }));
}

#[tokio::test(start_paused = true)]
async fn dropping_execute_while_the_result_write_backs_off_still_stores_it() {
    // The caller gives up (a request timeout) while the driver waits between tries of
    // the result's write: the write goes on by itself and lands, and the retry replays.
    let idem = driver(5, Duration::from_secs(30));
    let key = Key::new("payments", "dropped-in-backoff").unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let work = |_ctx| charge(Arc::clone(&runs));
    let gave_up = tokio::time::timeout(
        Duration::from_millis(1),
        idem.execute(&key, Fingerprint::of_bytes("r"), work),
    )
    .await;
    assert!(gave_up.is_err(), "the caller gave up first: {gave_up:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran");
    assert_eq!(
        idem.store().failed.load(Ordering::SeqCst),
        1,
        "the caller gave up after one failed write, waiting before the next"
    );
    assert_eq!(
        idem.store().get(&key).await.unwrap().unwrap().state,
        idem_core::State::InProgress,
        "nothing stored yet when the caller gave up"
    );
    // Long enough for the remaining tries and their backoff, well within the lease.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let record = idem.store().get(&key).await.unwrap().unwrap();
    assert_eq!(record.state, idem_core::State::Completed);
    let again = idem
        .execute(&key, Fingerprint::of_bytes("r"), work)
        .await
        .unwrap();
    assert!(again.replayed());
    assert_eq!(again.value().as_deref(), Some("charge-0"));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");
}

#[tokio::test(start_paused = true)]
async fn an_outage_longer_than_the_lease_still_ends() {
    // The store stays down: the driver stops at the lease's end, and says why.
    let idem = driver(usize::MAX, Duration::from_millis(300));
    let key = Key::new("payments", "down").unwrap();
    let started = tokio::time::Instant::now();
    let answer = idem
        .execute(&key, Fingerprint::of_bytes("r"), |_ctx| async {
            Ok::<_, WorkError<()>>(1)
        })
        .await;
    assert!(matches!(answer, Err(Error::Store(_))), "{answer:?}");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(2),
        "bounded by the lease and the backoff cap, not forever: {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_store_call_that_never_answers_is_bounded_and_retried() {
    // Two calls hang (packets dropped), then the store answers: each hung call counts as
    // failed at the store timeout and is tried again, within the lease.
    let idem = builder(2, Duration::from_secs(30), true)
        .store_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let key = Key::new("payments", "hung").unwrap();
    let started = tokio::time::Instant::now();
    let outcome = idem
        .execute(&key, Fingerprint::of_bytes("r"), |_ctx| async {
            Ok::<_, WorkError<()>>(7)
        })
        .await
        .unwrap();
    assert_eq!(outcome.value(), Some(7));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Each try that ran out of time was dropped before the next was sent: it may hold
    // what the next needs (a pooled connection, a lock).
    assert_eq!(idem.store().hanging_at_answer.load(Ordering::SeqCst), 0);
    assert!(matches!(
        builder(0, Duration::from_secs(1), true)
            .store_timeout(Duration::ZERO)
            .build(),
        Err(idem_core::ConfigError::ZeroStoreTimeout)
    ));
}

/// The memory store, answering claims late and renewals never (`hang`) or with an error.
struct SlowClaim {
    inner: MemoryStore,
    claim_delay: Duration,
    hang: bool,
    renewals: AtomicUsize,
}

#[async_trait]
impl Store for SlowClaim {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        tokio::time::sleep(self.claim_delay).await;
        self.inner.claim(request).await
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
    async fn renew(&self, _: &Lease, _: Duration) -> Result<RenewOutcome, StoreError> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        if self.hang {
            std::future::pending::<()>().await;
        }
        Err(StoreError::Unavailable {
            operation: Operation::Renew,
            source: "connection refused".into(),
        })
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

/// A claim answered late (400 ms of a 1 s lease) is confirmed by a renewal; when that
/// renewal fails or gets no answer, the lease's end still counts from the claim's send,
/// 1 s after it: the work's steps may start until shortly before then (a fiftieth of the
/// lease), and not after.
#[tokio::test(start_paused = true)]
async fn a_late_claim_whose_confirmation_fails_keeps_the_claims_lease() {
    for hang in [false, true] {
        let idem = Idempotency::builder(SlowClaim {
            // The store's own clock stands still: only this process's end of the lease
            // is under test.
            inner: MemoryStore::with_clock(idem_core::ManualClock::new()),
            claim_delay: Duration::from_millis(400),
            hang,
            renewals: AtomicUsize::new(0),
        })
        .lease(Duration::from_secs(1))
        .heartbeat(Heartbeat::Off)
        .store_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
        let key = Key::new("payments", "late").unwrap();
        let sent = tokio::time::Instant::now();
        let lost_at_the_end = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let lost = Arc::clone(&lost_at_the_end);
        let outcome = idem
            .execute(&key, Fingerprint::of_bytes("r"), |ctx| async move {
                let charged: u32 = ctx
                    .step("charge", || async { Ok::<_, WorkError<()>>(5) })
                    .await?;
                // The claim's send plus the lease, less a fiftieth of it: 980 ms.
                tokio::time::sleep_until(sent + Duration::from_millis(985)).await;
                lost.store(ctx.is_lease_lost(), Ordering::SeqCst);
                Ok::<_, WorkError<()>>(charged)
            })
            .await;
        assert!(
            matches!(&outcome, Ok(Outcome::Completed { value: 5, .. })),
            "hang {hang}: {outcome:?}"
        );
        assert_eq!(
            idem.store().renewals.load(Ordering::SeqCst),
            1,
            "confirmed once"
        );
        assert!(
            lost_at_the_end.load(Ordering::SeqCst),
            "hang {hang}: the lease still counted as held past the claim's send plus the lease"
        );
    }
}

/// `execute` dropped while the result's first write hangs (inside the store call's retries):
/// the write goes on by itself, its hung try is dropped at the timeout, the retry stores
/// the result, and the next call replays it without running the work again.
#[tokio::test(start_paused = true)]
async fn a_caller_gone_during_a_hung_write_still_stores_the_result() {
    let idem = builder(1, Duration::from_secs(30), true)
        .store_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let key = Key::new("payments", "gone").unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let work = |_ctx| {
        let runs = Arc::clone(&runs);
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, WorkError<()>>(9)
        }
    };
    let gone = tokio::time::timeout(
        Duration::from_millis(50),
        idem.execute(&key, Fingerprint::of_bytes("r"), work),
    )
    .await;
    assert!(gone.is_err(), "dropped while the write hung: {gone:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        idem.store().hanging.load(Ordering::SeqCst),
        0,
        "the hung try was dropped"
    );
    let again = idem
        .execute(&key, Fingerprint::of_bytes("r"), work)
        .await
        .unwrap();
    assert!(again.replayed(), "{again:?}");
    assert_eq!(again.value(), Some(9));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");
}
