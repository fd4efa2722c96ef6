//! The backoff: refused settings, no cap.

use std::time::Duration;

use idem_consumer::{Backoff, BackoffError};

#[test]
fn a_backoff_that_cannot_work_is_refused() {
    assert_eq!(
        Backoff::new(Duration::ZERO, Duration::from_secs(1)),
        Err(BackoffError::ZeroDelay)
    );
    assert!(matches!(
        Backoff::new(Duration::from_secs(2), Duration::from_secs(1)),
        Err(BackoffError::FirstOverMax { .. })
    ));
    let backoff =
        Backoff::new(Duration::from_millis(1), Duration::from_secs(u64::MAX / 2)).unwrap();
    // A huge delivery count never overflows.
    assert!(backoff.delay(Some(u64::MAX)) > Duration::ZERO);
    assert_eq!(backoff.delay(Some(0)), Duration::from_millis(1));
}

#[test]
fn no_cap_on_the_backoff_means_the_longest_duration_idem_stores() {
    let backoff = Backoff::new(Duration::from_secs(5), Duration::MAX).unwrap();
    assert_eq!(backoff.delay(Some(1_000)), idem_core::raw::MAX_DURATION);
    assert_eq!(backoff.delay(Some(1)), Duration::from_secs(5));
}
