//! Records the store did not write: what a human, a script or an older version left in
//! the store's tables or keys. A store test plants one with its own client, then runs
//! [`assert_foreign_record_is_refused`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{
    Admin, Error, Fingerprint, Idempotency, Key, Store, StoreError, Timestamp, WorkError,
    key::StepName, record::AttemptId, record::Lease, store::ClaimOutcome, store::ClaimRequest,
    store::WriteOutcome,
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
