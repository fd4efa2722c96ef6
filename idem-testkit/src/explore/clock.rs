//! Time for stores that keep it in the process (memory, SQLite): a clock that follows
//! Tokio's clock, so that under paused time (`start_paused`) leases, heartbeats, store
//! timeouts and backoffs all move together, deterministically and at once.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::task::Poll;

use idem_core::{Clock, Timestamp};
use tokio::runtime::Handle;
use tokio::time::Instant;

/// A store clock that reads Tokio's clock: under paused time it jumps whenever the runtime
/// has nothing to do but wait, exactly as the driver's own timers do.
///
/// The explorer makes one per run and hands it to a [`Target::virtual_time`] factory;
/// give it to the store as its clock (`MemoryStore::with_clock(clock)`). It reads the
/// runtime it was made on even from another thread (SQLite's connection thread).
///
/// [`Target::virtual_time`]: super::Target::virtual_time
#[derive(Clone, Debug)]
pub struct VirtualClock {
    handle: Handle,
    start: Instant,
    base: Timestamp,
}

impl VirtualClock {
    /// A clock that reads the wall clock's time now, then moves with the current runtime.
    /// Must be called inside that runtime.
    pub(crate) fn new() -> Self {
        Self {
            handle: Handle::current(),
            start: Instant::now(),
            base: Timestamp::now(),
        }
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Timestamp {
        // Entering the runtime makes Tokio's clock readable from threads outside it.
        let _inside = self.handle.enter();
        self.base
            .saturating_add(Instant::now().saturating_duration_since(self.start))
    }
}

/// The clock of one simulated process: the run's [`VirtualClock`], ahead or behind by the
/// run's skew ([`Timing::skew`](super::Timing::skew)). A
/// [`Target::per_process_clocks`](super::Target::per_process_clocks) factory gives each
/// process's store handle one: the first caller's runs behind, every other process's
/// ahead (so a retry sees the first caller's lease end early), the final check's exact.
#[derive(Clone, Debug)]
pub struct ProcessClock {
    base: VirtualClock,
    ahead: bool,
    by: std::time::Duration,
}

impl ProcessClock {
    pub(crate) fn new(base: VirtualClock, ahead: bool, by: std::time::Duration) -> Self {
        Self { base, ahead, by }
    }
}

impl Clock for ProcessClock {
    fn now(&self) -> Timestamp {
        let now = self.base.now();
        if self.ahead {
            now.saturating_add(self.by)
        } else {
            Timestamp::from_unix_millis(
                now.as_unix_millis()
                    .saturating_sub(u64::try_from(self.by.as_millis()).unwrap_or(u64::MAX)),
            )
        }
    }
}

/// Runs one store call so that paused time cannot jump while the call waits on another
/// thread (SQLite's connection thread answers through a channel the runtime cannot see):
/// a blocking task held open for the call's length keeps Tokio from auto-advancing. A call
/// that answers at once (the memory store) pays nothing.
///
/// A store that waits on Tokio timers inside one call would never wake under this: none
/// of the process-clock stores does.
pub(crate) async fn off_the_clock<F: Future>(paused: bool, call: F) -> F::Output {
    let mut call = pin!(call);
    if !paused {
        return call.await;
    }
    if let Poll::Ready(output) = poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await {
        return output;
    }
    let (hold, release) = std::sync::mpsc::channel::<()>();
    // Detached: it ends when `hold` is dropped, with this future or after the call.
    drop(tokio::task::spawn_blocking(move || {
        let _ = release.recv();
    }));
    let output = call.await;
    drop(hold);
    output
}
