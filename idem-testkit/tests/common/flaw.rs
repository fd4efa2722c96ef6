//! The flaws a store can be broken with, one at a time.

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Flaw {
    /// `complete` writes whatever the record's token or state.
    SkipsFenceOnComplete,
    /// Completion overwrites the fingerprint.
    ForgetsFingerprintOnCompletion,
    /// `claim` reads, lets other tasks run, then writes: not atomic.
    NonAtomicClaim,
    /// `purge_expired` also removes expired records whose lease is live.
    PurgesLiveLeases,
    /// An expired record counts as absent even while a live lease holds it (an earlier
    /// contract).
    ExpiredIsAbsentDespiteLease,
    /// Storage names are `<namespace><scope length>:<scope>:<key>`, with nothing ending the
    /// namespace, and purge matches names by the raw namespace prefix (DynamoDB's
    /// early layout).
    UnterminatedNamespace,
    /// Names are right, but purge deletes absent records of every namespace on the backend.
    PurgeReachesOtherNamespaces,
    /// Durations reach the backend unclamped, and it refuses those past a century
    /// (PostgreSQL's and Redis's early failures).
    RefusesLongDurations,
    /// An operator's release ends the lease but keeps the token and the attempt: the owner
    /// is not fenced.
    ReleaseKeepsTheOwner,
    /// `list` ignores the cursor: every page starts from the beginning.
    ListForgetsTheCursor,
    /// A takeover's claim answers no checkpoints (a store that reads steps from the wrong
    /// column): the new owner redoes steps, and a saga forgets it was compensating.
    TakeoverForgetsSteps,
    /// `complete` reads the record, checks the fence, lets other tasks run, then writes:
    /// a takeover between the check and the write is overwritten.
    NonAtomicComplete,
    /// `complete` or `fail` retried by the same lease stores the retry's bytes over the
    /// first ones (still answering Applied).
    RewritesOnRetry,
    /// The record limit is checked against each write alone, never counting the steps the
    /// record already holds.
    LimitIgnoresSteps,
    /// The record limit is enforced on results and checkpoints but not on failures.
    LimitSparesFailures,
    /// A lease is live while `now <= lease_until`: one millisecond too long.
    LeaseLiveAtItsEnd,
    /// A record expires once `now > expires_at`: one millisecond too late.
    PresentAtItsExpiry,
    /// `complete` and `fail` keep `expires_at` as it was: a result stored after the
    /// retention ended is absent the moment it is stored.
    KeepsExpiryOnFinish,
    /// A release keeps a record with no step until its retention ends (an earlier
    /// contract): a corrected request under the key is a mismatch.
    ReleaseKeepsAnEmptyRecord,
    /// A release ends the record's lifetime even when it holds steps: the next claim
    /// starts afresh and runs those steps again.
    ReleaseForgetsSteps,
    /// A release sets `lease_until = now` even after the lease ran out: the end moves to
    /// the release, past the one the record was kept for.
    ReleaseMovesTheLeaseEnd,
    /// Takeovers, renewals and checkpoints keep `expires_at` as it was (an earlier
    /// contract): a record whose owner stops at the end of its retention is absent the
    /// moment the lease lapses, and its steps run again.
    ExpiryIgnoresTheLease,
    /// Claims answer leases without the request's retention (a store that builds its
    /// lease with `Lease::new` alone), so renewals and checkpoints keep nothing past the
    /// lease.
    LeaseWithoutRetention,
    /// A renewal applies to a lease that has ended (released, or run out) while nobody
    /// took over: a late heartbeat holds the key for an owner that is gone.
    RenewsEndedLeases,
    /// A late claim of the attempt whose lease ended takes the record over again.
    LateClaimTakesOver,
    /// A checkpoint of an undo's end mark answers Applied and writes nothing: a takeover
    /// reads the undo as started and never ended.
    DropsUndoEndMarks,
    /// A checkpoint keeps the record one retention past the end of the lease it is
    /// handed, not the record's: an older copy of the lease (same attempt and token, after
    /// a purge) leaves the record short of its own lease end, and a release then loses
    /// its steps.
    CheckpointExpiryFromTheLeaseCopy,
    /// `complete` reads the record in one round trip and writes in another, with no
    /// condition on the write (a claim made atomic, a completion left as GET then SET):
    /// a takeover between the two is overwritten.
    CompleteOverTwoRoundTrips,
    /// `renew` reads the record in one round trip and writes it back with the new lease
    /// in another: a takeover between the two is undone, and the old owner holds the key
    /// again.
    RenewOverTwoRoundTrips,
    /// Every claim leaves a task of the store's running for ever (a watcher it never
    /// stops).
    LeaksATaskPerClaim,
}
