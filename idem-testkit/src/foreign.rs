//! Records the store did not write: what a human, a script or an older version left in
//! the store's tables or keys. A store test plants one with its own client, then runs
//! [`assert_foreign_record_is_refused`]; records at the last token, then
//! [`assert_the_last_token_is_never_passed`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{
    Admin, Error, Fingerprint, Idempotency, Key, State, Store, StoreError, Timestamp, WorkError,
    admin::ReleaseKeyOutcome, key::StepName, record::AttemptId, record::Lease, store::ClaimOutcome,
    store::ClaimRequest, store::WriteOutcome,
};

/// Checks a store's answers for the record planted under `key`, which the store cannot
/// decode (`what` says how it is broken, for the failure messages):
///
/// - `claim` never answers `Claimed` (treating the record as absent would run the work
///   again), never panics, and answers [`StoreError::Corrupt`] naming the key's short
///   hash; `get` answers the same error;
/// - `complete`, `fail`, `release`, `renew` and `checkpoint` with a lease the record never
///   gave out change nothing: an error or `Fenced`, never `Applied`;
/// - [`Idempotency::execute`] answers [`Error::Store`] and the work does not run;
/// - [`Admin::raw`] still shows what is stored, so an operator can read it.
///
/// # Panics
/// When the store breaks one of these rules.
pub async fn assert_foreign_record_is_refused(store: Arc<dyn Admin>, key: &Key, what: &str) {
    let hash = key.short_hash().to_string();
    let request = ClaimRequest::new(
        key.clone(),
        Fingerprint::of_bytes("foreign"),
        Duration::from_secs(60),
        Duration::from_secs(3600),
    );
    let claimed = store.claim(&request).await;
    match &claimed {
        Err(err @ StoreError::Corrupt { .. }) => assert!(
            err.to_string().contains(&hash),
            "{what}: the error must name the key's hash #{hash}: {err}"
        ),
        Ok(ClaimOutcome::Claimed { .. }) => {
            panic!("{what}: claim treated the record as absent, which runs the work again")
        }
        other => panic!("{what}: claim must answer Corrupt, not {other:?}"),
    }
    let got = store.get(key).await;
    assert!(
        matches!(&got, Err(StoreError::Corrupt { .. })),
        "{what}: get must answer Corrupt, not {got:?}"
    );
    let lease = Lease::new(
        key.clone(),
        1,
        AttemptId::random(),
        Timestamp::now().saturating_add(Duration::from_secs(60)),
        Timestamp::now(),
    );
    let step = StepName::new("step").expect("a valid step name");
    let writes = [
        ("complete", store.complete(&lease, b"\"x\"").await),
        ("fail", store.fail(&lease, b"\"x\"").await),
        ("checkpoint", store.checkpoint(&lease, &step, b"1").await),
        ("release", store.release(&lease).await),
    ];
    for (name, written) in writes {
        assert!(
            !matches!(written, Ok(WriteOutcome::Applied)),
            "{what}: {name} with a lease the record never gave out must change nothing"
        );
    }
    let renewed = store.renew(&lease, Duration::from_secs(60)).await;
    assert!(
        !matches!(renewed, Ok(idem_core::store::RenewOutcome::Renewed(_))),
        "{what}: renew with a lease the record never gave out must change nothing"
    );
    let runs = AtomicUsize::new(0);
    let answer = Idempotency::new(Arc::clone(&store))
        .execute(key, Fingerprint::of_bytes("foreign"), |_ctx| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, WorkError<()>>(())
        })
        .await;
    assert!(
        matches!(answer, Err(Error::Store(StoreError::Corrupt { .. }))),
        "{what}: execute must answer the store's Corrupt error, not {answer:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "{what}: the work ran");
    let shown = store.raw(key).await;
    assert!(
        matches!(&shown, Ok(Some(fields)) if !fields.is_empty()),
        "{what}: raw must still show what is stored, not {shown:?}"
    );
}

/// Records at the last token ([`MAX_TOKEN`](idem_core::raw::MAX_TOKEN)), for
/// [`assert_the_last_token_is_never_passed`]: the keys a store test plants them under with
/// its own client. Each is at the last token, with the fingerprint
/// [`LastTokenRecords::fingerprint`] and the attempt id `attempt`, created an hour or more
/// ago, and holds a step where the store can plant one. Leases that ended did so an hour or
/// more ago (more than any clock-skew margin the store allows for).
///
/// ```
/// use idem_core::record::AttemptId;
/// use idem_testkit::LastTokenRecords;
///
/// let planted = LastTokenRecords::under("foreign", AttemptId::from_bytes([0; 16]))?;
/// assert_eq!(planted.completed.key(), "last-token-completed");
/// // Plant each record with the store's own client, then run the check.
/// # Ok::<(), idem_core::key::KeyError>(())
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LastTokenRecords {
    /// Completed with [`LastTokenRecords::RESPONSE`], its lease ended, unexpired.
    pub completed: Key,
    /// In progress, its lease live for another hour or more.
    pub held: Key,
    /// In progress, its lease ended, unexpired: present, so a claim would take it over.
    pub ended: Key,
    /// In progress, its lease ended and expired: absent, so a claim starts afresh.
    pub absent: Key,
    /// The attempt id every planted record carries: the owner's, with the token, in the
    /// lease that fences its writes.
    pub attempt: AttemptId,
}

impl LastTokenRecords {
    /// The stored response of [`LastTokenRecords::completed`], byte for byte.
    ///
    /// ```
    /// assert_eq!(idem_testkit::LastTokenRecords::RESPONSE, b"\"paid\"");
    /// ```
    pub const RESPONSE: &'static [u8] = b"\"paid\"";

    /// The keys `last-token-completed`, `last-token-held`, `last-token-ended` and
    /// `last-token-absent` under `scope`, for records whose attempt id is `attempt`.
    ///
    /// # Errors
    /// A `scope` that is no valid key part.
    ///
    /// ```
    /// use idem_core::record::AttemptId;
    /// use idem_testkit::LastTokenRecords;
    ///
    /// let planted = LastTokenRecords::under("s", AttemptId::from_bytes([7; 16]))?;
    /// assert_eq!((planted.absent.scope(), planted.absent.key()), ("s", "last-token-absent"));
    /// # Ok::<(), idem_core::key::KeyError>(())
    /// ```
    pub fn under(scope: &str, attempt: AttemptId) -> Result<Self, idem_core::key::KeyError> {
        let key = |name: &str| Key::new(scope, format!("last-token-{name}"));
        Ok(Self {
            completed: key("completed")?,
            held: key("held")?,
            ended: key("ended")?,
            absent: key("absent")?,
            attempt,
        })
    }

    /// The fingerprint every planted record carries, and the check's claims ask with.
    ///
    /// ```
    /// use idem_testkit::LastTokenRecords;
    ///
    /// assert_eq!(LastTokenRecords::fingerprint(), LastTokenRecords::fingerprint());
    /// assert_eq!(LastTokenRecords::fingerprint().as_bytes().len(), 32);
    /// ```
    pub fn fingerprint() -> Fingerprint {
        Fingerprint::of_bytes("at the last token")
    }
}

/// Checks a store's answers for records at the last token
/// ([`MAX_TOKEN`](idem_core::raw::MAX_TOKEN)), as the state machine gives them
/// ([`idem_core::machine::TokenAtLimit`]):
///
/// - a present record there is read as any other: replayed when finished, in flight while
///   its lease lives, a mismatch under another fingerprint;
/// - a late copy of the owner's own claim after its lease ended is in flight with no time
///   left, as at any token;
/// - but never taken over, and never released by an operator, live lease or not: no next
///   token could fence its owner. Both answer [`StoreError::Corrupt`] naming the key's
///   short hash, and the record is unchanged ([`Admin::raw`] shows the same fields
///   before and after, a mismatch's claim included);
/// - its owner still stores its result there: the fence holds;
/// - an absent one is claimed afresh from token 1, under any fingerprint, without its
///   steps and with a new creation time, and its old owner's writes are fenced from the
///   new lifetime.
///
/// Only records written by hand, or 2^53 − 1 claims of one key, get there.
///
/// ```no_run
/// use std::sync::Arc;
/// use idem_core::{record::AttemptId, Admin};
/// use idem_testkit::{assert_the_last_token_is_never_passed, LastTokenRecords};
///
/// # async fn check(store: Arc<dyn Admin>) -> Result<(), idem_core::key::KeyError> {
/// let planted = LastTokenRecords::under("foreign", AttemptId::from_bytes([0; 16]))?;
/// // Plant the four records with the store's own client first (see the fields' docs).
/// assert_the_last_token_is_never_passed(store, &planted).await;
/// # Ok(())
/// # }
/// ```
///
/// # Panics
/// When the store breaks one of these rules.
pub async fn assert_the_last_token_is_never_passed(
    store: Arc<dyn Admin>,
    planted: &LastTokenRecords,
) {
    let request = |key: &Key, fingerprint: Fingerprint| {
        ClaimRequest::new(
            key.clone(),
            fingerprint,
            Duration::from_secs(60),
            Duration::from_secs(3600),
        )
    };
    let same = |key: &Key| request(key, LastTokenRecords::fingerprint());
    // The owner's lease: the fence reads the token and the attempt id, not the times.
    let owners = |key: &Key| {
        Lease::new(
            key.clone(),
            idem_core::raw::MAX_TOKEN,
            planted.attempt,
            Timestamp::now(),
            Timestamp::now(),
        )
    };
    let answer = store.claim(&same(&planted.completed)).await;
    assert!(
        matches!(&answer, Ok(ClaimOutcome::Replay { response, .. }) if response == LastTokenRecords::RESPONSE),
        "a completed record at the last token is replayed: {answer:?}"
    );
    let released = store.release_key(&planted.completed).await;
    assert!(
        matches!(released, Ok(ReleaseKeyOutcome::Finished(State::Completed))),
        "an operator's release of a completed record answers Finished: {released:?}"
    );
    let answer = store.claim(&same(&planted.held)).await;
    assert!(
        matches!(answer, Ok(ClaimOutcome::InFlight { .. })),
        "a live lease at the last token is in flight: {answer:?}"
    );
    let hash = |key: &Key| key.short_hash().to_string();
    let refused = |what: &str, key: &Key, answer: Result<String, StoreError>| match answer {
        Err(err @ StoreError::Corrupt { .. }) => assert!(
            err.to_string().contains(&hash(key)) && err.to_string().contains("limit"),
            "{what}: the error must name the key's hash #{} and the limit: {err}",
            hash(key)
        ),
        other => panic!("{what} at the last token must answer Corrupt, not {other:?}"),
    };
    let before = store
        .raw(&planted.held)
        .await
        .expect("raw reads the record");
    refused(
        "an operator's release of a live lease",
        &planted.held,
        store
            .release_key(&planted.held)
            .await
            .map(|answer| format!("{answer:?}")),
    );
    assert_eq!(
        store
            .raw(&planted.held)
            .await
            .expect("raw reads the record"),
        before,
        "a refused release changes nothing"
    );
    let before = store
        .raw(&planted.ended)
        .await
        .expect("raw reads the record");
    assert!(before.is_some(), "raw shows the planted record");
    let answer = store
        .claim(&request(
            &planted.ended,
            Fingerprint::of_bytes("another request"),
        ))
        .await;
    assert!(
        matches!(answer, Ok(ClaimOutcome::Mismatch)),
        "another fingerprint is a mismatch, at the last token too: {answer:?}"
    );
    let late = same(&planted.ended).with_attempt(planted.attempt);
    let answer = store.claim(&late).await;
    assert!(
        matches!(answer, Ok(ClaimOutcome::InFlight { retry_after, .. }) if retry_after.is_zero()),
        "the owner's own late claim after its lease ended is in flight with no time left: {answer:?}"
    );
    refused(
        "a takeover",
        &planted.ended,
        store
            .claim(&same(&planted.ended))
            .await
            .map(|answer| format!("{answer:?}")),
    );
    refused(
        "an operator's release",
        &planted.ended,
        store
            .release_key(&planted.ended)
            .await
            .map(|answer| format!("{answer:?}")),
    );
    assert_eq!(
        store
            .raw(&planted.ended)
            .await
            .expect("raw reads the record"),
        before,
        "a mismatch, a late claim, a refused takeover or release changes nothing"
    );
    let completed = store.complete(&owners(&planted.ended), b"\"late\"").await;
    assert!(
        matches!(completed, Ok(WriteOutcome::Applied)),
        "the owner at the last token still stores its result: {completed:?}"
    );
    let answer = store.claim(&same(&planted.ended)).await;
    assert!(
        matches!(&answer, Ok(ClaimOutcome::Replay { response, .. }) if response == b"\"late\""),
        "and it is replayed: {answer:?}"
    );
    let started = Timestamp::now();
    let new_lease = match store
        .claim(&request(
            &planted.absent,
            Fingerprint::of_bytes("a new request"),
        ))
        .await
    {
        Ok(ClaimOutcome::Claimed {
            lease,
            resumed,
            steps,
            ..
        }) => {
            assert_eq!(lease.token, 1, "an absent record starts again from token 1");
            assert!(!resumed, "a fresh claim resumes nothing");
            assert!(steps.is_empty(), "a fresh claim keeps no step: {steps:?}");
            let age = started.saturating_duration_since(lease.created_at);
            assert!(
                age < Duration::from_secs(60),
                "a fresh claim has a new creation time, not the old one ({age:?} before the claim)"
            );
            lease
        }
        other => panic!("an absent record at the last token is claimed afresh: {other:?}"),
    };
    let record = store
        .get(&planted.absent)
        .await
        .expect("get reads the new record")
        .expect("the new record is present");
    assert_eq!(
        (record.token, record.fingerprint, record.steps.len()),
        (1, Fingerprint::of_bytes("a new request"), 0),
        "the new lifetime keeps nothing of the old"
    );
    let fenced = store.complete(&owners(&planted.absent), b"\"stale\"").await;
    assert!(
        matches!(fenced, Ok(WriteOutcome::Fenced)),
        "the old owner's write is fenced from the new lifetime: {fenced:?}"
    );
    // The token fences too, not the attempt alone: the new attempt at the old token.
    let old_token = Lease::new(
        planted.absent.clone(),
        idem_core::raw::MAX_TOKEN,
        new_lease.attempt,
        new_lease.lease_until,
        new_lease.created_at,
    );
    let fenced = store.complete(&old_token, b"\"stale\"").await;
    assert!(
        matches!(fenced, Ok(WriteOutcome::Fenced)),
        "a lease at the old token is fenced from the new lifetime: {fenced:?}"
    );
    let applied = store.complete(&new_lease, b"\"new\"").await;
    assert!(
        matches!(applied, Ok(WriteOutcome::Applied)),
        "the new owner stores its result: {applied:?}"
    );
}
