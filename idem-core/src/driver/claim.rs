//! The claim, and the wait for another attempt under `InFlightPolicy::Wait`.

use std::time::Duration;

use tokio::time::Instant;

use super::builder::Settings;
use super::{Error, Idempotency, InFlightPolicy, observe, policy, retry_store};
use crate::raw::clamp_duration;
use crate::record::{AttemptId, Lease, Steps};
use crate::store::{ClaimOutcome, ClaimRequest, Operation, RenewOutcome};
use crate::{Fingerprint, Key, Store};

impl<S: Store + ?Sized + 'static> Idempotency<S> {
    /// Claims the key, waiting for another attempt under [`InFlightPolicy::Wait`].
    pub(super) async fn claim(&self, key: &Key, fingerprint: Fingerprint) -> Result<Claim, Error> {
        let Settings {
            lease,
            retention,
            in_flight,
            ..
        } = *self.settings;
        // The same request (same attempt id) on every try: a claim that landed but whose
        // answer was lost returns the same lease instead of in-flight.
        let mut request = ClaimRequest::new(key.clone(), fingerprint, lease, retention);
        let waiting = match in_flight {
            // A wait too long for the clock to count is a wait without end.
            InFlightPolicy::Wait { timeout } => Some(Instant::now().checked_add(timeout)),
            InFlightPolicy::Reject => None,
        };
        let mut backoff = policy::WAIT_FIRST_BACKOFF;
        let mut waited = false;
        loop {
            let timeout = self.settings.store_timeout;
            let sent = Instant::now();
            let mut tries = 0u32;
            let outcome = retry_store(
                Operation::Claim,
                timeout,
                None,
                &self.settings.jitter,
                || {
                    tries += 1;
                    self.store.claim(&request)
                },
            )
            .await?;
            return Ok(match outcome {
                ClaimOutcome::Claimed {
                    lease: granted,
                    resumed,
                    steps,
                    ..
                } => {
                    // A retried claim whose first try landed gets its own lease back as
                    // `resumed: false`, whether that try created the record or took it
                    // over. A takeover shows in a lease that did not start with the
                    // record, or in a token past the first; the second also counts a
                    // fresh record that replaced an absent one (token + 1) as resumed,
                    // the safe side: the work then finds no steps done.
                    let resumed = resumed
                        || tries > 1
                            && (granted.token > 1
                                || granted.lease_until
                                    != granted.created_at.saturating_add(clamp_duration(lease)));
                    observe::count(observe::CLAIMS);
                    if resumed {
                        observe::count(observe::TAKEOVERS);
                        tracing::info!(token = granted.token, "took over an expired lease");
                    }
                    // A claim answered a third of a lease after its first try was sent
                    // (slow tries, retries): counted from that send, its lease may be
                    // mostly gone, or over, on this process's clock.
                    let answered = Instant::now();
                    let late =
                        answered.saturating_duration_since(sent) >= clamp_duration(lease) / 3;
                    let (granted, deadline, settled) = if late {
                        let (granted, deadline) = Box::pin(self.confirm(granted, sent)).await?;
                        (granted, deadline, Instant::now())
                    } else {
                        (granted, sent + clamp_duration(lease), answered)
                    };
                    Claim::Won(Won {
                        lease: granted,
                        deadline,
                        settled,
                        resumed,
                        steps,
                    })
                }
                ClaimOutcome::Replay { response, .. } => Claim::Replay(response),
                ClaimOutcome::ReplayFailure { response, .. } => Claim::ReplayFailure(response),
                ClaimOutcome::InFlight { retry_after, .. } => {
                    let now = Instant::now();
                    let left = match waiting {
                        Some(Some(deadline)) if now < deadline => Some(deadline - now),
                        Some(None) => Some(Duration::MAX),
                        _ => None,
                    };
                    match left {
                        Some(left) => {
                            if !waited {
                                waited = true;
                                observe::count(observe::WAITS);
                            }
                            let pause = self.settings.jitter.jittered(backoff).min(left);
                            // Boxed: a rare path, and a timer is large (cache-line aligned).
                            Box::pin(tokio::time::sleep(pause)).await;
                            backoff = (backoff * 2).min(policy::WAIT_MAX_BACKOFF);
                            // A new attempt after an in-flight answer: the store answers
                            // the attempt whose lease ended (this one's, if a try landed
                            // and its answer came too late) in flight, never a takeover.
                            request = request.with_attempt(AttemptId::random());
                            continue;
                        }
                        None => {
                            observe::count(observe::IN_FLIGHT_REJECTIONS);
                            return Err(Error::InFlight { retry_after });
                        }
                    }
                }
                ClaimOutcome::Mismatch => {
                    observe::count(observe::MISMATCHES);
                    return Err(Error::Mismatch);
                }
            });
        }
    }
}

impl<S: Store + ?Sized + 'static> Idempotency<S> {
    /// A lease won on a late claim, with its end on this process's clock.
    /// Which try landed is unknown, so the end counts from the first try's send (`sent`):
    /// after slow tries that may be past already, and the work could start no step. One
    /// renewal, sent now, gives an end counted from now; a renewal that fails leaves the
    /// first count (the safe side). A fenced one means the key is no longer this
    /// attempt's (an operator released it, or the lease ended and another took over):
    /// the work does not start.
    async fn confirm(&self, granted: Lease, sent: Instant) -> Result<(Lease, Instant), Error> {
        let lease = clamp_duration(self.settings.lease);
        let resent = Instant::now();
        // A millisecond more than the lease, so that the renewal moves the end even when
        // it lands in the millisecond the claim did; the end counted here is the lease.
        let extend = lease.saturating_add(std::time::Duration::from_millis(1));
        let renewal = tokio::time::timeout(
            self.settings.store_timeout,
            self.store.renew(&granted, extend),
        )
        .await;
        match renewal {
            Ok(Ok(RenewOutcome::Renewed(renewed))) => Ok((renewed, resent + lease)),
            Ok(Ok(RenewOutcome::Fenced)) => {
                observe::count(observe::FENCED_WRITES);
                tracing::info!("a claim won late was fenced before the work began");
                Err(Error::LeaseLost)
            }
            Ok(Err(err)) => {
                observe::store_error(Operation::Renew);
                tracing::warn!(error = %err, "could not confirm a claim won late");
                Ok((granted, sent + lease))
            }
            Err(_) => {
                observe::store_error(Operation::Renew);
                tracing::warn!("could not confirm a claim won late: the renewal timed out");
                Ok((granted, sent + lease))
            }
        }
    }
}

/// What the claim left the driver to do.
pub(super) enum Claim {
    Won(Won),
    Replay(Vec<u8>),
    ReplayFailure(Vec<u8>),
}

/// A won claim: the lease and what the work starts from.
pub(super) struct Won {
    pub(super) lease: Lease,
    /// When the lease ends on this process's clock.
    pub(super) deadline: Instant,
    /// When the claim was settled: where the work's duration starts.
    pub(super) settled: Instant,
    pub(super) resumed: bool,
    pub(super) steps: Steps,
}
