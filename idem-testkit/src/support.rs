//! Small helpers shared by the cases.

use std::time::Duration;

use idem_core::{
    Fingerprint, Key, Record, Store, record::Lease, record::Steps, store::ClaimOutcome,
    store::ClaimRequest,
};

/// A lease or retention that outlives any test run on any server.
pub(crate) const HOUR: Duration = Duration::from_secs(3600);
/// A lease or retention that is over the moment it starts.
pub(crate) const ZERO: Duration = Duration::ZERO;
/// A lease that lasts through a few round trips to any server.
pub(crate) const MINUTE: Duration = Duration::from_secs(60);
/// The driver's lease in the cases that let it run out: long enough for a claim and a
/// step's round trips on a loaded server before the owner's lease ends on its own clock
/// (the driver starts no effect after that), short enough to wait out.
pub(crate) const SHORT_LEASE: Duration = Duration::from_millis(500);

pub(crate) fn key(scope: &str, key: &str) -> Key {
    Key::new(scope, key).expect("test keys are valid")
}

pub(crate) fn fp(text: &str) -> Fingerprint {
    Fingerprint::of_bytes(text)
}

pub(crate) fn request(
    key: &Key,
    fingerprint: &str,
    lease: Duration,
    retention: Duration,
) -> ClaimRequest {
    ClaimRequest::new(key.clone(), fp(fingerprint), lease, retention)
}

pub(crate) async fn claim<S: Store + ?Sized>(store: &S, request: &ClaimRequest) -> ClaimOutcome {
    store
        .claim(request)
        .await
        .unwrap_or_else(|err| panic!("claim failed with a store error: {err}"))
}

/// Claims and insists on a fresh or taken-over lease.
pub(crate) async fn claimed<S: Store + ?Sized>(
    store: &S,
    request: &ClaimRequest,
) -> (Lease, bool, Steps) {
    match claim(store, request).await {
        ClaimOutcome::Claimed {
            lease,
            resumed,
            steps,
            ..
        } => (lease, resumed, steps),
        other => panic!("expected Claimed, the store answered {other:?}"),
    }
}

pub(crate) async fn get<S: Store + ?Sized>(store: &S, key: &Key) -> Option<Record> {
    store
        .get(key)
        .await
        .unwrap_or_else(|err| panic!("get failed with a store error: {err}"))
}

pub(crate) async fn get_some<S: Store + ?Sized>(store: &S, key: &Key) -> Record {
    get(store, key)
        .await
        .expect("get found no record where one must be")
}

/// Unwraps a store call that must not fail.
pub(crate) fn ok<T>(result: Result<T, idem_core::StoreError>, what: &str) -> T {
    result.unwrap_or_else(|err| panic!("{what} failed with a store error: {err}"))
}

/// Tells whoever runs the case what it could not check (a skip): on stderr itself, since
/// the test harness keeps a passing test's `eprintln!` out of sight; not inside a quiet
/// report, where every case's output is left out.
pub(crate) fn notice(case: &str, text: &str) {
    use std::io::Write as _;
    if !crate::quiet::is_quiet() {
        let _ = writeln!(std::io::stderr(), "\n!!! {case}: {text}\n");
    }
}

/// Lets `duration` pass for the store: moves the suite's clock, or waits on a real one
/// (a little longer, so the store's clock has certainly moved as far).
pub(crate) async fn let_time_pass(caps: &crate::Capabilities, duration: Duration) {
    match &caps.manual_clock {
        Some(clock) => clock.advance(duration),
        None => tokio::time::sleep(duration + Duration::from_millis(5)).await,
    }
}
