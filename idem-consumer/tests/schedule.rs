//! Scheduled jobs: one run per slot across schedulers, crashes taken over, settings
//! that cannot work refused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_consumer::{ScheduleError, ScheduledJob};
use idem_core::{Context, Error, Idempotency, ManualClock, MemoryStore, Outcome, done};

mod common;
use common::FailingClaims;

const LEASE: Duration = Duration::from_secs(30);
const MINUTE: Duration = Duration::from_secs(60);

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn job(store: MemoryStore, period: Duration) -> ScheduledJob<MemoryStore> {
    // A week's retention: a daily job's window (a day and a lease) must fit in it.
    let idem = Idempotency::builder(store)
        .lease(LEASE)
        .retention(Duration::from_secs(7 * 86_400))
        .build()
        .unwrap();
    ScheduledJob::new(idem, "report", period).unwrap()
}

#[test]
fn slots_are_due_times_never_the_clock_of_the_run() {
    let hourly = job(MemoryStore::new(), Duration::from_secs(3600));
    // 22:59:59.999 and 22:00:00 are both the 22:00 slot.
    let ten = at(1_796_162_400); // 2026-12-01T22:00:00Z
    assert_eq!(hourly.slot_at(ten), ten);
    assert_eq!(hourly.slot_at(ten + Duration::from_millis(3_599_999)), ten);
    assert_eq!(hourly.next_slot_after(ten), ten + Duration::from_secs(3600));
    assert_eq!(
        hourly.key_of(ten + Duration::from_secs(5)).key(),
        "2026-12-01T22:00:00.000Z"
    );
    assert_eq!(hourly.key_of(ten).scope(), "schedule/report");

    // Daily at 02:30.
    let daily = job(MemoryStore::new(), Duration::from_secs(86_400))
        .offset(Duration::from_secs(9000))
        .unwrap();
    let midnight = at(1_796_169_600); // 2026-12-02T00:00:00Z
    assert_eq!(
        daily.slot_at(midnight + Duration::from_secs(9000)),
        midnight + Duration::from_secs(9000)
    );
    assert_eq!(
        daily.slot_at(midnight + Duration::from_secs(8999)),
        midnight - Duration::from_secs(86_400) + Duration::from_secs(9000)
    );
    // Before the epoch's first slot nothing goes negative.
    assert_eq!(
        daily.slot_at(UNIX_EPOCH),
        UNIX_EPOCH + Duration::from_secs(9000) - Duration::from_secs(9000)
    );
}

#[test]
fn a_tick_covers_the_lease_and_a_period_of_earlier_slots() {
    let every_minute = job(MemoryStore::new(), MINUTE);
    let now = at(1_796_162_400 + 30);
    // Window: lease (30 s) + period (60 s) = 90 s back from 22:00:30 = 21:59:00.
    assert_eq!(
        every_minute.due_slots(now),
        [at(1_796_162_400 - 60), at(1_796_162_400)]
    );
    let only_now = every_minute.clone().catch_up(Duration::ZERO).unwrap();
    assert_eq!(only_now.due_slots(now), [at(1_796_162_400)]);
}

#[test]
fn settings_that_cannot_work_are_refused() {
    let idem = || {
        Idempotency::builder(MemoryStore::new())
            .lease(LEASE)
            .build()
            .unwrap()
    };
    assert!(matches!(
        ScheduledJob::new(idem(), "r", Duration::ZERO),
        Err(ScheduleError::Period(_))
    ));
    assert!(matches!(
        ScheduledJob::new(idem(), "r", Duration::from_micros(1500)),
        Err(ScheduleError::Period(_))
    ));
    assert!(matches!(
        ScheduledJob::new(idem(), "bad\nname", MINUTE),
        Err(ScheduleError::Name(_))
    ));
    assert!(matches!(
        ScheduledJob::new(idem(), "x".repeat(5000), MINUTE),
        Err(ScheduleError::Name(_))
    ));
    // A period far shorter than the lease is fine: the default window stops at its most.
    let fast = ScheduledJob::new(
        Idempotency::new(MemoryStore::new()),
        "r",
        Duration::from_millis(50),
    );
    assert!(fast.is_ok(), "{fast:?}");
    let every_minute = ScheduledJob::new(idem(), "r", MINUTE).unwrap();
    assert!(matches!(
        every_minute.clone().offset(MINUTE),
        Err(ScheduleError::Offset { .. })
    ));
    assert!(matches!(
        every_minute.clone().catch_up(MINUTE * 5000),
        Err(ScheduleError::CatchUpTooLong { .. })
    ));
    // Records kept an hour cannot guard a day-long window.
    let short = Idempotency::builder(MemoryStore::new())
        .retention(Duration::from_secs(3600))
        .build()
        .unwrap();
    let err = ScheduledJob::new(short, "r", Duration::from_secs(86_400)).unwrap_err();
    assert!(
        matches!(err, ScheduleError::RetentionTooShort { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("raise the retention"), "{err}");
}

#[tokio::test]
async fn two_schedulers_firing_one_slot_run_it_once() {
    let store = MemoryStore::new();
    let idem = Idempotency::builder(store).lease(LEASE).build().unwrap();
    let (a, b) = (
        ScheduledJob::new(idem.clone(), "report", MINUTE).unwrap(),
        ScheduledJob::new(idem, "report", MINUTE).unwrap(),
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let work = |runs: Arc<AtomicUsize>| {
        move |_ctx: Context, slot: SystemTime| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            done(slot)
        }
    };
    // The second scheduler fires a little late, within the same slot.
    let now = at(1_796_162_400 + 5);
    let (first, second) = tokio::join!(
        a.run_slot(now, work(Arc::clone(&runs))),
        b.run_slot(now + Duration::from_secs(20), work(Arc::clone(&runs)))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
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
    assert!(matches!(second, Err(Error::InFlight { .. })), "{second:?}");
    let later = b.run_slot(now, work(Arc::clone(&runs))).await.unwrap();
    assert!(later.replayed());
    assert_eq!(later.value(), Some(at(1_796_162_400)));
}

#[tokio::test]
async fn a_slot_whose_scheduler_crashed_is_taken_over_by_a_later_tick() {
    let clock = ManualClock::new();
    let every_minute = job(MemoryStore::with_clock(clock.clone()), MINUTE);
    let sent: Arc<Mutex<HashMap<SystemTime, usize>>> = Arc::default();
    let work = |crash: bool, sent: Arc<Mutex<HashMap<SystemTime, usize>>>| {
        move |ctx: Context, slot: SystemTime| {
            let sent = Arc::clone(&sent);
            async move {
                ctx.step("send", || async {
                    *sent.lock().unwrap().entry(slot).or_default() += 1;
                    done(())
                })
                .await
                .map_err(|_| idem_core::WorkError::Unknown(()))?;
                if crash {
                    std::future::pending::<()>().await;
                }
                done(ctx.resumed()).map_err(|_| idem_core::WorkError::Unknown(()))
            }
        }
    };
    let ten = at(1_796_162_400);
    // Scheduler A crashes at 22:00:01, after its step.
    let crashed = tokio::time::timeout(
        Duration::from_millis(20),
        every_minute.run_slot(ten + Duration::from_secs(1), work(true, Arc::clone(&sent))),
    )
    .await;
    assert!(crashed.is_err());

    // Scheduler B's first tick at 22:00:10: 21:59 never ran (caught up), 22:00's lease
    // is live, so that slot is left to A.
    let runs = every_minute
        .run_due(
            ten + Duration::from_secs(10),
            &work(false, Arc::clone(&sent)),
        )
        .await;
    assert_eq!(
        runs.iter().map(|run| run.slot).collect::<Vec<_>>(),
        [ten - MINUTE, ten]
    );
    assert!(
        matches!(
            runs[0].answer,
            Ok(Outcome::Completed {
                value: false,
                replayed: false
            })
        ),
        "{:?}",
        runs[0].answer
    );
    assert!(
        matches!(runs[1].answer, Err(Error::InFlight { .. })),
        "{:?}",
        runs[1].answer
    );

    // B's tick at 22:01:00, after the lease: 22:00 is still in the window, taken over and
    // resumed past its step; 22:01 runs; 21:59 has left the window.
    clock.advance(LEASE + Duration::from_secs(1));
    let runs = every_minute
        .run_due(ten + MINUTE, &work(false, Arc::clone(&sent)))
        .await;
    assert_eq!(
        runs.iter().map(|run| run.slot).collect::<Vec<_>>(),
        [ten, ten + MINUTE]
    );
    assert!(
        matches!(
            runs[0].answer,
            Ok(Outcome::Completed {
                value: true,
                replayed: false
            })
        ),
        "{:?}",
        runs[0].answer
    );
    assert!(
        matches!(
            runs[1].answer,
            Ok(Outcome::Completed {
                value: false,
                replayed: false
            })
        ),
        "{:?}",
        runs[1].answer
    );
    let sent = sent.lock().unwrap();
    assert_eq!(
        *sent,
        HashMap::from([(ten - MINUTE, 1), (ten, 1), (ten + MINUTE, 1)]),
        "each slot's step once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_running_schedulers_run_every_slot_once() {
    // Real time, a 20 ms period, two schedulers for at most 600 ms: each slot once.
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(Duration::from_millis(200))
        .build()
        .unwrap();
    let ran: Arc<Mutex<HashMap<SystemTime, usize>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let job = ScheduledJob::new(idem.clone(), "tick", Duration::from_millis(20)).unwrap();
        let ran = Arc::clone(&ran);
        tasks.push(tokio::spawn(async move {
            job.run(move |_ctx, slot| {
                let ran = Arc::clone(&ran);
                async move {
                    *ran.lock().unwrap().entry(slot).or_default() += 1;
                    done(())
                }
            })
            .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    for task in &tasks {
        task.abort();
    }
    let ran = ran.lock().unwrap();
    assert!(ran.len() >= 5, "slots ran: {}", ran.len());
    assert!(ran.values().all(|&n| n == 1), "a slot ran twice: {ran:?}");
}

#[tokio::test]
async fn schedulers_that_disagree_on_the_period_meet_as_a_mismatch() {
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(LEASE)
        .build()
        .unwrap();
    let hourly = ScheduledJob::new(idem.clone(), "report", Duration::from_secs(3600)).unwrap();
    let half_hourly = ScheduledJob::new(idem, "report", Duration::from_secs(1800)).unwrap();
    let ten = at(1_796_162_400);
    assert!(
        hourly
            .run_slot(ten, |_ctx, _slot| async { done(()) })
            .await
            .is_ok()
    );
    let other = half_hourly
        .run_slot(ten, |_ctx, _slot| async { done(()) })
        .await;
    assert!(matches!(other, Err(Error::Mismatch)), "{other:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_held_past_the_window_is_taken_over_once_its_lease_ends() {
    // Scheduler A runs one slot for 400 ms, heartbeating, far past the window (lease 100
    // ms + period 20 ms), then dies. Scheduler B's loop saw the slot in flight, and takes
    // it over when the lease ends, though the slot left its window long before.
    let lease = Duration::from_millis(100);
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(lease)
        .build()
        .unwrap();
    let period = Duration::from_millis(20);
    let a = ScheduledJob::new(idem.clone(), "long", period).unwrap();
    let b = ScheduledJob::new(idem, "long", period).unwrap();
    let held = a.slot_at(SystemTime::now());
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let dying = tokio::spawn(async move {
        a.run_slot(held, |_ctx, _slot| async move {
            started_tx.send(()).unwrap();
            std::future::pending::<()>().await;
            done(false)
        })
        .await
    });
    started_rx.await.unwrap();
    let resumed: Arc<Mutex<Vec<bool>>> = Arc::default();
    let seen = Arc::clone(&resumed);
    let survivor = tokio::spawn(async move {
        b.run(move |ctx, slot| {
            let seen = Arc::clone(&seen);
            async move {
                if slot == held {
                    seen.lock().unwrap().push(ctx.resumed());
                }
                done(())
            }
        })
        .await
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    dying.abort();
    // The lease ends about a second after the abort: wait for the takeover, bounded.
    for _ in 0..500 {
        if !resumed.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    survivor.abort();
    assert_eq!(
        *resumed.lock().unwrap(),
        [true],
        "taken over once, resuming"
    );
}

/// Runs `job` in a task for `for_how_long`, counting each slot's runs.
async fn run_for(
    job: ScheduledJob<impl idem_core::Store + 'static>,
    for_how_long: Duration,
    work_time: impl Fn(SystemTime) -> Duration + Send + Sync + 'static,
) -> HashMap<SystemTime, usize> {
    let ran: Arc<Mutex<HashMap<SystemTime, usize>>> = Arc::default();
    let seen = Arc::clone(&ran);
    let work_time = Arc::new(work_time);
    let task = tokio::spawn(async move {
        job.run(move |_ctx, slot| {
            let (seen, work_time) = (Arc::clone(&seen), Arc::clone(&work_time));
            async move {
                *seen.lock().unwrap().entry(slot).or_default() += 1;
                tokio::time::sleep(work_time(slot)).await;
                done(())
            }
        })
        .await
    });
    tokio::time::sleep(for_how_long).await;
    task.abort();
    ran.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_error_no_retry_was_expected_to_cure_does_not_drop_the_slot() {
    let store = FailingClaims::new(1);
    let idem = Idempotency::builder(store)
        .lease(Duration::from_millis(200))
        .build()
        .unwrap();
    // A period of a minute: the slot of now is the only one, and its first claim fails.
    let job = ScheduledJob::new(idem, "failover", MINUTE)
        .unwrap()
        .catch_up(Duration::ZERO)
        .unwrap();
    let since_epoch = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap();
    let slot_of_now = SystemTime::UNIX_EPOCH + Duration::from_secs(since_epoch.as_secs() / 60 * 60);
    let ran = run_for(job, Duration::from_millis(2500), |_| Duration::ZERO).await;
    // The run may cross into the next minute's slot, which runs too.
    assert_eq!(
        ran.get(&slot_of_now),
        Some(&1),
        "the slot did not run after the failover: {ran:?}"
    );
    assert!(ran.len() <= 2 && ran.values().all(|&n| n == 1), "{ran:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_that_came_and_went_during_a_long_run_still_run_once() {
    // One slot's work takes 600 ms, far past the window (lease 100 ms + period 50 ms):
    // the slots due meanwhile run after it, late, each once.
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(Duration::from_millis(100))
        .build()
        .unwrap();
    let job = ScheduledJob::new(idem, "long-tick", Duration::from_millis(50)).unwrap();
    let slow = Arc::new(Mutex::new(None::<SystemTime>));
    let first = Arc::clone(&slow);
    let ran = run_for(job, Duration::from_millis(1500), move |slot| {
        let mut first = first.lock().unwrap();
        if first.is_none() {
            *first = Some(slot);
            Duration::from_millis(600)
        } else {
            Duration::ZERO
        }
    })
    .await;
    let slow = slow.lock().unwrap().expect("a slot ran");
    let mut slots: Vec<_> = ran.keys().copied().filter(|slot| *slot >= slow).collect();
    slots.sort();
    assert!(slots.len() >= 15, "{slots:?}");
    for pair in slots.windows(2) {
        assert_eq!(
            pair[1].duration_since(pair[0]).unwrap(),
            Duration::from_millis(50),
            "a slot was skipped: {slots:?}"
        );
    }
    assert!(ran.values().all(|&n| n == 1), "a slot ran twice: {ran:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_remembered_past_its_record_s_retention_is_never_run_again() {
    // B sees slot S in flight at A, then runs a later slot for 1 s, past the 400 ms
    // retention of S's record (which A finishes meanwhile). B must not ask S again then:
    // the record is gone and S would run twice.
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(Duration::from_millis(50))
        .retention(Duration::from_millis(400))
        .build()
        .unwrap();
    let period = Duration::from_millis(50);
    let a = ScheduledJob::new(idem.clone(), "stale", period).unwrap();
    let b = ScheduledJob::new(idem, "stale", period).unwrap();
    let held = a.slot_at(SystemTime::now());
    let ran: Arc<Mutex<HashMap<SystemTime, usize>>> = Arc::default();
    let b_moved_on = Arc::new(tokio::sync::Notify::new());
    let holder = {
        let (ran, b_moved_on) = (Arc::clone(&ran), Arc::clone(&b_moved_on));
        tokio::spawn(async move {
            a.run_slot(held, |_ctx, slot| async move {
                *ran.lock().unwrap().entry(slot).or_default() += 1;
                b_moved_on.notified().await;
                done(())
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let survivor = {
        let (ran, b_moved_on) = (Arc::clone(&ran), Arc::clone(&b_moved_on));
        tokio::spawn(async move {
            b.run(move |_ctx, slot| {
                let (ran, b_moved_on) = (Arc::clone(&ran), Arc::clone(&b_moved_on));
                async move {
                    *ran.lock().unwrap().entry(slot).or_default() += 1;
                    if slot > held {
                        b_moved_on.notify_one();
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    done(())
                }
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(2000)).await;
    survivor.abort();
    assert!(matches!(holder.await, Ok(Ok(_))), "A finished its slot");
    let ran = ran.lock().unwrap();
    assert_eq!(ran.get(&held), Some(&1), "{ran:?}");
}

/// A job of `period` on the memory store, with `lease`, and its runs' slots and times.
fn timed_job(period: Duration, lease: Duration) -> ScheduledJob<MemoryStore> {
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(lease)
        .build()
        .unwrap();
    ScheduledJob::new(idem, "timed", period).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_before_the_cutover_from_a_legacy_scheduler_never_run() {
    let period = Duration::from_millis(100);
    // The legacy scheduler ran every slot up to now; this one adopts from 400 ms on. The
    // catch-up window (a lease and a period) would otherwise run the last ones again.
    let cutover = SystemTime::now() + Duration::from_millis(400);
    let job = timed_job(period, Duration::from_secs(1)).not_before(cutover);
    let ran = run_for(job, Duration::from_millis(1200), |_| Duration::ZERO).await;
    assert!(!ran.is_empty());
    assert!(
        ran.keys().all(|slot| *slot >= cutover),
        "{ran:?} before {cutover:?}"
    );
    assert!(ran.values().all(|&n| n == 1), "{ran:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_up_to_the_skew_fast_never_runs_a_slot_early() {
    let period = Duration::from_millis(100);
    let skew = Duration::from_millis(250);
    let job = timed_job(period, Duration::from_secs(1))
        .catch_up(Duration::ZERO)
        .unwrap()
        .clock_skew(skew);
    let late: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let seen = Arc::clone(&late);
    let task = tokio::spawn(async move {
        job.run(move |_ctx, slot| {
            let late = SystemTime::now().duration_since(slot).unwrap_or_default();
            seen.lock().unwrap().push(late);
            async { done(()) }
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(1200)).await;
    task.abort();
    let late = late.lock().unwrap().clone();
    assert!(late.len() >= 3, "{late:?}");
    // Every slot ran at least the skew after its time, by this clock.
    assert!(late.iter().all(|late| *late >= skew), "{late:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_the_latest_slot_only_skips_what_came_and_went() {
    let period = Duration::from_millis(50);
    // Each run takes 300 ms: six slots come and go during each.
    let job = timed_job(period, Duration::from_millis(100))
        .catch_up(Duration::ZERO)
        .unwrap()
        .backlog(idem_consumer::Backlog::Latest(std::num::NonZeroUsize::MIN));
    let ran = run_for(job, Duration::from_millis(1300), |_| {
        Duration::from_millis(300)
    })
    .await;
    assert!(ran.values().all(|&n| n == 1), "{ran:?}");
    // Back to back, about four runs, never the 26 slots that came.
    assert!((2..=6).contains(&ran.len()), "{ran:?}");
    let mut slots: Vec<_> = ran.keys().copied().collect();
    slots.sort();
    for pair in slots.windows(2) {
        assert!(
            pair[1].duration_since(pair[0]).unwrap() >= Duration::from_millis(250),
            "a skipped slot ran: {slots:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_past_its_timeout_is_stopped_and_taken_over_when_its_lease_ends() {
    let period = Duration::from_secs(60);
    let job = timed_job(period, Duration::from_millis(300))
        .catch_up(Duration::from_secs(1))
        .unwrap()
        .slot_timeout(Duration::from_millis(200));
    let runs = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let (counted, done_count) = (Arc::clone(&runs), Arc::clone(&finished));
    let task = tokio::spawn(async move {
        job.run(move |_ctx, _slot| {
            let run = counted.fetch_add(1, Ordering::SeqCst);
            let done_count = Arc::clone(&done_count);
            async move {
                if run == 0 {
                    // Hung: only the timeout ends it.
                    std::future::pending::<()>().await;
                }
                done_count.fetch_add(1, Ordering::SeqCst);
                done(())
            }
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    task.abort();
    // Stopped at 200 ms, taken over after the 300 ms lease, finished once.
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(finished.load(Ordering::SeqCst), 1);
}

#[test]
fn a_cron_schedule_in_a_time_zone_follows_daylight_saving_time() {
    let idem = Idempotency::builder(MemoryStore::new())
        .retention(Duration::from_secs(7 * 86_400))
        .build()
        .unwrap();
    let nightly = ScheduledJob::cron(idem, "nightly", "30 2 * * *", "Europe/Paris").unwrap();
    // 2026-10-25, clocks go back at 03:00 CEST: 02:30 happens twice, the slot once.
    let midnight_utc = at(1_792_886_400); // 2026-10-25T00:00:00Z (02:00 CEST)
    let slot = nightly.next_slot_after(midnight_utc);
    assert_eq!(slot, at(1_792_888_200)); // 00:30Z, 02:30 CEST
    let next = nightly.next_slot_after(slot);
    assert_eq!(next, at(1_792_888_200 + 86_400 + 3600)); // the 26th, 01:30Z, 02:30 CET
    // The slot is its instant, keyed as a fixed period's would be.
    assert_eq!(nightly.slot_at(slot + Duration::from_secs(3600)), slot);
    assert_eq!(
        nightly.key_of(slot),
        idem_core::Key::new("schedule/nightly", "2026-10-25T00:30:00.000Z").unwrap()
    );

    let bad = |expression: &str, zone: &str| {
        let idem = Idempotency::builder(MemoryStore::new())
            .retention(Duration::from_secs(7 * 86_400))
            .build()
            .unwrap();
        ScheduledJob::cron(idem, "nightly", expression, zone).unwrap_err()
    };
    assert!(matches!(
        bad("61 2 * * *", "UTC"),
        ScheduleError::Cron { .. }
    ));
    assert!(matches!(
        bad("30 2 * * *", "Mars/Olympus"),
        ScheduleError::TimeZone { .. }
    ));
    assert!(matches!(
        bad("0 0 30 2 *", "UTC"),
        ScheduleError::NeverDue { .. }
    ));
    // A daily schedule's window needs more than the default retention... or says so.
    let short = Idempotency::builder(MemoryStore::new())
        .retention(Duration::from_secs(3600))
        .build()
        .unwrap();
    assert!(matches!(
        ScheduledJob::cron(short, "nightly", "30 2 * * *", "UTC").unwrap_err(),
        ScheduleError::RetentionTooShort { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_policy_never_skips_a_crashed_scheduler_s_slot_in_the_window() {
    // A window of the lease and a period (500 ms): two or three slots.
    let period = Duration::from_millis(200);
    let job = timed_job(period, Duration::from_millis(300))
        .backlog(idem_consumer::Backlog::Latest(std::num::NonZeroUsize::MIN));
    // The previous slot's scheduler crashed mid-work: its lease holds it for 300 ms.
    let previous = job.slot_at(SystemTime::now()) - period;
    let crashed = tokio::time::timeout(
        Duration::from_millis(20),
        job.run_slot(previous, |_ctx, _slot| async {
            std::future::pending::<()>().await;
            done(())
        }),
    )
    .await;
    assert!(crashed.is_err(), "the crashed run was cut off");
    let ran = run_for(job, Duration::from_millis(1500), |_| Duration::ZERO).await;
    assert_eq!(
        ran.get(&previous),
        Some(&1),
        "the crashed slot was skipped: {ran:?}"
    );
}
