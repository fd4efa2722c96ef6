//! The lease as the owner holds it: lost or held, its end on this process's clock, and
//! the fenced writes made under it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Context, Held, lock};
use crate::driver::durable::{self, Write};
use crate::driver::observe;
use crate::{StoreError, record::Lease, store::WriteOutcome};

impl Context {
    /// True while the lease counts as lost: the store fenced one of this owner's writes
    /// (another attempt took the key over: for good), or the lease has ended on this
    /// process's own clock with no renewal confirmed since (a partition, an overloaded
    /// store, a pause longer than the heartbeat). While it is, [`Context::step`] starts no
    /// new effect.
    ///
    /// The owner cannot tell "taken over" from "cut off": a lease it last confirmed and
    /// that has ended may be another attempt's by now, so it stops either way, a fiftieth
    /// of the lease early to allow for clock drift. A renewal sent before that end and
    /// answered after it proves the lease never lapsed (the store renews live leases
    /// only), and the lease counts as held again.
    pub fn is_lease_lost(&self) -> bool {
        self.inner.lost.load(Ordering::SeqCst) || self.lease_ended_locally()
    }

    /// Completes once the lease counts as lost (see [`Context::is_lease_lost`]): `select!`
    /// on it to stop work that no longer counts. Completes by itself, with no store call,
    /// a fiftieth of the lease before its end on this process's clock when no renewal
    /// confirmed since moved that end. A renewal still on its way may then land and
    /// restore the lease: the owner could not know, and stopping was the safe side.
    pub async fn lease_lost(&self) {
        loop {
            let notified = self.inner.lost_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_lease_lost() {
                return;
            }
            if self.inner.detached {
                // No lease to run out: only a fence ends it.
                notified.await;
                continue;
            }
            let end = self.local_end();
            tokio::select! {
                () = notified => {}
                // A renewal may have moved the end meanwhile: checked again at the top.
                () = tokio::time::sleep_until(end) => {}
            }
        }
    }

    /// When this owner stops starting effects: the lease's end on this process's clock,
    /// less the margin.
    fn local_end(&self) -> tokio::time::Instant {
        let deadline = self.lease_deadline();
        deadline
            .checked_sub(self.inner.lease_margin)
            .unwrap_or(deadline)
    }

    /// True once the lease has ended on this process's clock (less the margin).
    fn lease_ended_locally(&self) -> bool {
        !self.inner.detached && tokio::time::Instant::now() >= self.local_end()
    }

    /// True once the store fenced one of this owner's writes: lost for good.
    pub(crate) fn is_fenced(&self) -> bool {
        self.inner.lost.load(Ordering::SeqCst)
    }

    pub(crate) fn mark_lost(&self) {
        if !self.inner.lost.swap(true, Ordering::SeqCst) {
            observe::count(observe::LEASE_LOSSES);
        }
        self.inner.lost_notify.notify_waiters();
    }

    /// A renewal landed: the lease as renewed, and its end on this process's clock.
    pub(crate) fn set_lease(&self, lease: Lease, deadline: tokio::time::Instant) {
        *lock(&self.inner.held) = Held { lease, deadline };
    }

    /// When the lease ends, on this process's clock (see `Held::deadline`).
    pub(crate) fn lease_deadline(&self) -> tokio::time::Instant {
        lock(&self.inner.held).deadline
    }

    /// Runs a fenced write under this lease, retried while the lease lasts, finished in a
    /// task of its own if the caller drops `execute` first.
    pub(crate) async fn durable(&self, write: Write) -> Result<WriteOutcome, StoreError> {
        if self.inner.detached {
            return Ok(WriteOutcome::Applied);
        }
        let owner = self.clone();
        durable::Survive::new(async move { owner.durable_in_place(write).await }).await
    }

    /// [`Context::durable`] for a caller that already survives being dropped
    /// ([`durable::finish`]): the write runs in its future, not in one of its own.
    pub(crate) async fn durable_in_place(&self, write: Write) -> Result<WriteOutcome, StoreError> {
        if self.inner.detached {
            return Ok(WriteOutcome::Applied);
        }
        let (lease, deadline) = {
            let held = lock(&self.inner.held);
            (held.lease.clone(), held.deadline)
        };
        durable::in_place(
            Arc::clone(&self.inner.store),
            lease,
            write,
            self.inner.store_timeout,
            Some(deadline),
            self.inner.jitter.clone(),
        )
        .await
    }
}
