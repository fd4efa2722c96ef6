//! Clients: send, and on a timeout or an in-flight answer, send again.

use std::time::Duration;

use crate::checkout::{Answer, Checkout};
use crate::storm::{Order, Pattern};

/// A client gives up after this many tries (it never needs nearly as many).
const MAX_TRIES: usize = 200;

/// Sends until the order is answered for good: paid (fresh or replayed) or refused.
async fn send_until_answered<C: Checkout>(shop: &C, order: &str, cents: u64, crash_first: bool) {
    for attempt in 0..MAX_TRIES {
        match shop
            .request(order, cents, crash_first && attempt == 0)
            .await
        {
            Answer::Paid | Answer::Conflict => return,
            Answer::InFlight(retry_after) => {
                tokio::time::sleep(retry_after.min(Duration::from_millis(20))).await;
            }
            Answer::Crashed | Answer::TimedOut | Answer::Retry => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// Plays one order's pattern against `shop`.
pub(crate) async fn play<C: Checkout>(shop: &C, order: &Order) {
    let (id, cents) = (order.id.as_str(), order.cents);
    match order.pattern {
        Pattern::Single => send_until_answered(shop, id, cents, false).await,
        Pattern::TimeoutResend => {
            // The first request keeps running on the server while the client resends.
            let first = send_until_answered(shop, id, cents, false);
            let resend = async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                send_until_answered(shop, id, cents, false).await;
            };
            tokio::join!(first, resend);
        }
        Pattern::DoubleClick => {
            tokio::join!(
                send_until_answered(shop, id, cents, false),
                send_until_answered(shop, id, cents, false)
            );
        }
        Pattern::Burst(n) => {
            let requests: Vec<_> = (0..n)
                .map(|_| send_until_answered(shop, id, cents, false))
                .collect();
            join_all(requests).await;
        }
        Pattern::CrashThenRetry => send_until_answered(shop, id, cents, true).await,
        Pattern::ChangedAmount => {
            send_until_answered(shop, id, cents, false).await;
            send_until_answered(shop, id, cents + 100, false).await;
        }
    }
}

/// Polls futures together, without a dependency for it.
async fn join_all<F: std::future::Future<Output = ()>>(futures: Vec<F>) {
    let mut pinned: Vec<_> = futures.into_iter().map(Box::pin).map(Some).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for slot in &mut pinned {
            if let Some(future) = slot {
                if future.as_mut().poll(cx).is_ready() {
                    *slot = None;
                } else {
                    pending = true;
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
}
