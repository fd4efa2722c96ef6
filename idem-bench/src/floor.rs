//! The memory store's own floor: claim-and-complete pairs per second at the Store level,
//! on one core, and with 16 tasks on different keys over every core; and the driver's
//! cost per `execute` on the same store and core, typed and as bytes, beside the store
//! alone making the same calls in the same rounds, so that what the driver adds is the
//! difference of two timed loops made alike rather than of two noisy throughputs (still a
//! difference of medians: a noisy run can read a little high or low).

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{
    Fingerprint, Idempotency, Key, MemoryStore, Outcome, Store, WorkError, store::ClaimOutcome,
    store::ClaimRequest, store::WriteOutcome,
};
use serde::Serialize;

use crate::target::{BoxError, RESPONSE};

fn requests(prefix: &str, n: usize) -> Result<Vec<ClaimRequest>, BoxError> {
    let fingerprint = Fingerprint::of_bytes("bench");
    (0..n)
        .map(|i| {
            let key = Key::new("bench", format!("{prefix}{i}"))?;
            Ok(ClaimRequest::new(
                key,
                fingerprint,
                Duration::from_secs(60),
                Duration::from_secs(3600),
            ))
        })
        .collect()
}

/// Claims and completes every request; the requests are built before the clock starts.
async fn pairs(store: &MemoryStore, requests: &[ClaimRequest]) -> Result<(), BoxError> {
    for request in requests {
        let ClaimOutcome::Claimed { lease, .. } = store.claim(request).await? else {
            return Err("a fresh key was not claimed".into());
        };
        if store.complete(&lease, RESPONSE).await? != WriteOutcome::Applied {
            return Err("a completion was fenced".into());
        }
    }
    Ok(())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Median over `rounds` of [`one_core_once`], each on a fresh store.
pub(crate) fn one_core(n: usize, rounds: usize) -> Result<f64, BoxError> {
    Ok(median(
        (0..rounds.max(1))
            .map(|_| one_core_once(n))
            .collect::<Result<_, _>>()?,
    ))
}

/// Median over `rounds` of [`many_tasks_once`], each on a fresh store.
pub(crate) fn many_tasks(
    n: usize,
    tasks: usize,
    threads: usize,
    rounds: usize,
) -> Result<f64, BoxError> {
    Ok(median(
        (0..rounds.max(1))
            .map(|_| many_tasks_once(n, tasks, threads))
            .collect::<Result<_, _>>()?,
    ))
}

/// Pairs per second on a single-threaded runtime.
fn one_core_once(n: usize) -> Result<f64, BoxError> {
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    runtime.block_on(async {
        let store = MemoryStore::new();
        let warm = requests("warm", n / 10 + 1)?;
        pairs(&store, &warm).await?;
        let timed = requests("timed", n)?;
        let started = Instant::now();
        pairs(&store, &timed).await?;
        Ok(n as f64 / started.elapsed().as_secs_f64())
    })
}

/// Pairs per second with `tasks` tasks on distinct keys over a runtime of `threads` workers.
fn many_tasks_once(n: usize, tasks: usize, threads: usize) -> Result<f64, BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .build()?;
    runtime.block_on(async {
        let store = MemoryStore::new();
        let batches: Vec<Vec<ClaimRequest>> = (0..tasks)
            .map(|t| requests(&format!("t{t}-"), n / tasks))
            .collect::<Result<_, _>>()?;
        let store = Arc::new(store);
        let started = Instant::now();
        let handles: Vec<_> = batches
            .into_iter()
            .map(|batch| {
                let store = Arc::clone(&store);
                tokio::spawn(async move { pairs(&store, &batch).await.map_err(|e| e.to_string()) })
            })
            .collect();
        for handle in handles {
            handle.await??;
        }
        Ok((n / tasks * tasks) as f64 / started.elapsed().as_secs_f64())
    })
}

/// Median over `rounds` of the nanoseconds one [`Fingerprint::of_bytes`] of the
/// benchmark's request takes, `n` in a row.
pub(crate) fn fingerprint_ns(n: usize, rounds: usize) -> f64 {
    median(
        (0..rounds.max(1))
            .map(|_| {
                let started = Instant::now();
                for _ in 0..n {
                    std::hint::black_box(Fingerprint::of_bytes(std::hint::black_box(
                        crate::target::REQUEST,
                    )));
                }
                started.elapsed().as_secs_f64() * 1e9 / n.max(1) as f64
            })
            .collect(),
    )
}

/// Nanoseconds per `execute` on the memory store on one core (medians of the rounds).
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct DriverFloor {
    /// The store alone: one claim and one completion of the requests the driver sends,
    /// built beforehand, from a new store in the driver's own rounds (reports before this
    /// field's neighbours existed measured it on a warmed store with other keys).
    pub(crate) store_pair_ns: f64,
    /// The store alone: one claim of a completed key.
    pub(crate) store_replay_ns: f64,
    /// What the driver adds to the store's calls for a new key: `fresh_ns` less
    /// `store_pair_ns`.
    pub(crate) own_fresh_ns: f64,
    /// What the driver adds for a replay: `replay_ns` less `store_replay_ns`.
    pub(crate) own_replay_ns: f64,
    /// `execute` of a new key, its work returning the typed receipt (serde_json).
    pub(crate) fresh_ns: f64,
    /// `execute` of a completed key: the typed receipt decoded from the store's bytes.
    pub(crate) replay_ns: f64,
    /// `execute_bytes` of a new key (no serde).
    pub(crate) fresh_bytes_ns: f64,
    /// `execute_bytes` of a completed key.
    pub(crate) replay_bytes_ns: f64,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Receipt {
    charge: String,
    status: String,
}

/// The driver's floor: `n` keys built before the clock starts, executed fresh and then
/// replayed, typed and as bytes, each on a new store, median of `rounds`. In the same
/// rounds, the store alone does the same calls on the same keys from a new store (the
/// claims the driver would send, built beforehand), so what the driver adds is the
/// difference of two runs made alike: the map's growth, the allocator's state and the
/// keys are the same on both sides.
pub(crate) fn driver(n: usize, rounds: usize) -> Result<DriverFloor, BoxError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let fingerprint = Fingerprint::of_bytes(crate::target::REQUEST);
    let keys: Vec<Key> = (0..n)
        .map(|i| Key::new("bench/checkout", format!("k{i}")))
        .collect::<Result<_, _>>()?;
    let settings = Idempotency::new(MemoryStore::new());
    let claims: Vec<ClaimRequest> = keys
        .iter()
        .map(|key| {
            ClaimRequest::new(
                key.clone(),
                fingerprint,
                settings.lease(),
                settings.retention(),
            )
        })
        .collect();
    let per_op = |started: Instant| started.elapsed().as_secs_f64() * 1e9 / n.max(1) as f64;
    let mut runs: [Vec<f64>; 6] = Default::default();
    for _ in 0..rounds.max(1) {
        runtime.block_on(async {
            let store = MemoryStore::new();
            let started = Instant::now();
            pairs(&store, &claims).await?;
            runs[4].push(per_op(started));
            let started = Instant::now();
            for claim in &claims {
                let ClaimOutcome::Replay { .. } = store.claim(claim).await? else {
                    return Err::<(), BoxError>("a completed key was not replayed".into());
                };
            }
            runs[5].push(per_op(started));
            drop(store);
            let typed = Idempotency::new(MemoryStore::new());
            for replay in [false, true] {
                let started = Instant::now();
                for key in &keys {
                    let outcome = typed
                        .execute(key, fingerprint, |_ctx| async {
                            Ok::<_, WorkError<()>>(Receipt {
                                charge: "ch_3PqX9".into(),
                                status: "ok".into(),
                            })
                        })
                        .await?;
                    if !matches!(outcome, Outcome::Completed { replayed, .. } if replayed == replay)
                    {
                        return Err::<(), BoxError>(
                            "the typed execute did not end as expected".into(),
                        );
                    }
                }
                runs[usize::from(replay)].push(per_op(started));
            }
            let bytes = Idempotency::new(MemoryStore::new());
            for replay in [false, true] {
                let started = Instant::now();
                for key in &keys {
                    let outcome = bytes
                        .execute_bytes(key, fingerprint, |_ctx| async {
                            Ok::<_, WorkError<Vec<u8>>>(RESPONSE.to_vec())
                        })
                        .await?;
                    if !matches!(outcome, Outcome::Completed { replayed, .. } if replayed == replay)
                    {
                        return Err("the bytes execute did not end as expected".into());
                    }
                }
                runs[2 + usize::from(replay)].push(per_op(started));
            }
            Ok(())
        })?;
    }
    let [
        fresh,
        replay,
        fresh_bytes,
        replay_bytes,
        pair,
        replayed_claim,
    ] = runs;
    let (fresh, replay) = (median(fresh), median(replay));
    let (store_pair_ns, store_replay_ns) = (median(pair), median(replayed_claim));
    Ok(DriverFloor {
        store_pair_ns,
        store_replay_ns,
        own_fresh_ns: fresh - store_pair_ns,
        own_replay_ns: replay - store_replay_ns,
        fresh_ns: fresh,
        replay_ns: replay,
        fresh_bytes_ns: median(fresh_bytes),
        replay_bytes_ns: median(replay_bytes),
    })
}

/// Prints the driver's floor: what `execute` takes, what the store alone takes, and the
/// difference.
pub(crate) fn print_driver(d: &DriverFloor) {
    println!(
        "the driver on one core, ns per execute: fresh {:.0} (as bytes {:.0}), replay {:.0} (as bytes {:.0}); the store alone: {:.0} ns per claim+complete, {:.0} per replayed claim",
        d.fresh_ns,
        d.fresh_bytes_ns,
        d.replay_ns,
        d.replay_bytes_ns,
        d.store_pair_ns,
        d.store_replay_ns
    );
    println!(
        "the driver's own cost, ns per execute: fresh {:.0}, replay {:.0}",
        d.own_fresh_ns, d.own_replay_ns
    );
}
