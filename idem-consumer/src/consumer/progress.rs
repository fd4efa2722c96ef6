//! In-progress marks: a delivery marked with the broker while it waits or runs, the last
//! mark let land before the settlement.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use crate::Message;

/// `run`, with the message marked in progress with the broker every
/// [`Message::progress_interval`] until it ends. A mark sent when `run` ends is let
/// finish (for at most one interval), so that it never lands after the settlement.
pub(super) async fn while_in_progress<M, F>(message: &M, run: F) -> F::Output
where
    M: Message + ?Sized,
    F: Future,
{
    let Some(every) = message.progress_interval().filter(|every| !every.is_zero()) else {
        return run.await;
    };
    let marking = AtomicBool::new(false);
    let beat = mark_in_progress(message, every, &marking);
    tokio::pin!(run);
    tokio::pin!(beat);
    let output = tokio::select! {
        biased;
        output = &mut run => output,
        never = &mut beat => match never {},
    };
    if marking.load(Ordering::SeqCst) {
        let landed = std::future::poll_fn(|cx| match beat.as_mut().poll(cx) {
            Poll::Ready(never) => match never {},
            Poll::Pending if marking.load(Ordering::SeqCst) => Poll::Pending,
            Poll::Pending => Poll::Ready(()),
        });
        let _ = tokio::time::timeout(every, landed).await;
    }
    output
}

/// Marks the message in progress every `every`, for as long as it is polled; `marking`
/// is set while a mark is on its way.
async fn mark_in_progress<M: Message + ?Sized>(
    message: &M,
    every: Duration,
    marking: &AtomicBool,
) -> Infallible {
    // A period too long to add to now never ticks.
    let Some(first) = tokio::time::Instant::now().checked_add(every) else {
        return std::future::pending().await;
    };
    let mut ticks = tokio::time::interval_at(first, every);
    // A tick missed while the broker was slow is not made up in a burst.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        marking.store(true, Ordering::SeqCst);
        if let Err(err) = message.in_progress().await {
            tracing::debug!(error = %err, "idem-consumer: the broker did not take an in-progress mark");
        }
        marking.store(false, Ordering::SeqCst);
    }
}
