//! Renewing the lease while the work runs, without ever stalling the work.
//!
//! A renewal runs beside the work, not in its place: the work is polled whether or not a
//! renewal is pending. That matters when the work holds a lock the renewal needs (a
//! transaction that completed the record in the same database and has yet to commit): the
//! renewal waits for the lock, the work goes on, commits, and the renewal proceeds.
//! Each renewal is bounded by the heartbeat interval, and only one runs at a time.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::Poll;
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};

use super::{Context, observe};
use crate::{raw::clamp_duration, store::Operation, store::RenewOutcome};

/// Polls `work` to completion, renewing the lease for `extend` every `every` beside it. A
/// fenced renewal marks the lease lost on `context` (the work can watch
/// [`Context::lease_lost`]); the work itself is never dropped here.
pub(super) async fn run<Fut: Future>(
    work: Fut,
    context: &Context,
    every: Option<Duration>,
    extend: Duration,
) -> Fut::Output {
    run_while(work, context, every, extend, || true).await
}

/// [`run`], renewing only while `keep` says so: once it answers false, the lease is left
/// to end.
pub(super) async fn run_while<Fut: Future>(
    work: Fut,
    context: &Context,
    every: Option<Duration>,
    extend: Duration,
    keep: impl Fn() -> bool,
) -> Fut::Output {
    let Some(every) = every else {
        return work.await;
    };
    let mut work = pin!(work);
    // Made when the work first waits: most work that finishes in its first poll (an
    // answer from memory, a replayed handler) never needs a timer.
    let mut ticks: Option<tokio::time::Interval> = None;
    let mut renewal: Option<Pin<Box<dyn Future<Output = ()> + Send>>> = None;
    poll_fn(|cx| {
        if let Poll::Ready(output) = work.as_mut().poll(cx) {
            return Poll::Ready(output);
        }
        let ticks = ticks.get_or_insert_with(|| {
            // One interval after the lease was last confirmed (the claim, or the last
            // renewal, was sent), not after this call began: a compensation that starts
            // late in the lease renews at once instead of a whole interval on, past the
            // lease's end. Never later than now.
            let started = Instant::now();
            let confirmed = context
                .lease_deadline()
                .checked_sub(clamp_duration(extend))
                .map_or(started, |sent| sent.min(started));
            let mut ticks = tokio::time::interval_at(confirmed + every, every);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            ticks
        });
        loop {
            if let Some(pending) = renewal.as_mut() {
                if pending.as_mut().poll(cx).is_pending() {
                    break;
                }
                renewal = None;
            }
            // Only a fence ends the renewals: past the owner's own end of the lease a
            // renewal may still find it live in the store (the margin), and counts.
            if context.is_fenced() || !keep() || ticks.poll_tick(cx).is_pending() {
                break;
            }
            renewal = Some(Box::pin(renew(context.clone(), extend, every)));
        }
        Poll::Pending
    })
    .await
}

async fn renew(context: Context, extend: Duration, timeout: Duration) {
    let lease = context.lease();
    // The store starts the renewed lease no earlier than now: counted from here, the
    // process's idea of its end is never later than the store's.
    let sent = Instant::now();
    let renewal = tokio::time::timeout(timeout, context.store().renew(&lease, extend)).await;
    match renewal {
        Ok(Ok(RenewOutcome::Renewed(renewed))) => {
            context.set_lease(renewed, sent + clamp_duration(extend));
        }
        Ok(Ok(RenewOutcome::Fenced)) => {
            // Another attempt took over, or this one's result is already stored (completed
            // in the caller's transaction). Either way the lease is over; the final write
            // tells which.
            observe::count(observe::FENCED_WRITES);
            tracing::debug!(
                "heartbeat fenced: the record is no longer in progress under this lease"
            );
            context.mark_lost();
        }
        Ok(Err(err)) => {
            // The next beat tries again; the fence protects the result if the lease runs
            // out meanwhile.
            observe::store_error(Operation::Renew);
            tracing::warn!(error = %err, "heartbeat failed");
        }
        Err(_) => {
            observe::store_error(Operation::Renew);
            tracing::warn!(?timeout, "heartbeat timed out");
        }
    }
}
