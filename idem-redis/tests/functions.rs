//! Which form of the Lua the server runs: the library's functions where the server allows
//! them, the scripts where it does not. Each test connects as an ACL user that may run only
//! one of the two, so a store that sent the other form fails with `NOPERM`.

mod common;

use std::time::Duration;

use idem_core::{Fingerprint, Idempotency, Key, Outcome, WorkError};
use idem_redis::RedisStore;

/// Every transition the driver sends on a fresh key, a step, a heartbeat and a replay, then
/// an operator's read.
async fn every_transition(store: RedisStore) {
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_millis(300))
        .build()
        .unwrap();
    let key = Key::new("functions", "order-1").unwrap();
    let first = idem
        .execute(&key, Fingerprint::of_bytes("x"), |ctx| async move {
            let charged = ctx
                .step("charge", || async { Ok::<_, WorkError<()>>(41) })
                .await?;
            // Longer than a third of the lease: the heartbeat renews it.
            tokio::time::sleep(Duration::from_millis(150)).await;
            Ok::<_, WorkError<()>>(charged + 1)
        })
        .await
        .expect("a fresh execution");
    assert_eq!(
        first,
        Outcome::Completed {
            value: 42,
            replayed: false
        }
    );
    let again = idem
        .execute(&key, Fingerprint::of_bytes("x"), |_ctx| async {
            Ok::<_, WorkError<()>>(0)
        })
        .await
        .expect("a replay");
    assert_eq!(
        again,
        Outcome::Completed {
            value: 42,
            replayed: true
        }
    );
    use idem_core::Store;
    let record = store.get(&key).await.expect("a read").expect("the record");
    assert!(record.response.is_some());
    assert!(
        record.steps.contains_key("charge"),
        "{:?}",
        record.steps.keys()
    );
    let failed = Key::new("functions", "order-2").unwrap();
    let outcome = idem
        .execute(&failed, Fingerprint::of_bytes("y"), |_ctx| async {
            Err::<(), _>(WorkError::Permanent("declined".to_owned()))
        })
        .await
        .expect("a stored failure");
    assert!(matches!(outcome, Outcome::Failed { .. }), "{outcome:?}");
    // A retryable failure releases the lease: the next execution runs the work.
    let released = Key::new("functions", "order-3").unwrap();
    let retried = idem
        .execute(&released, Fingerprint::of_bytes("z"), |_ctx| async {
            Err::<(), _>(WorkError::Retryable("try again".to_owned()))
        })
        .await;
    assert!(matches!(retried, Ok(Outcome::Retryable(_))), "{retried:?}");
    let rerun = idem
        .execute(&released, Fingerprint::of_bytes("z"), |_ctx| async {
            Ok::<_, WorkError<String>>(7)
        })
        .await
        .expect("the work runs again after a release");
    assert_eq!(
        rerun,
        Outcome::Completed {
            value: 7,
            replayed: false
        }
    );
}

#[tokio::test]
async fn transitions_run_as_functions_where_the_server_has_them() {
    let Some(url) = idem_testkit::service_url(common::STANDALONE) else {
        return;
    };
    let name = format!("idem-functions-only-{}", std::process::id());
    let as_user = common::user_without(&url, &name, "~*", &["eval", "evalsha", "script"]).await;
    every_transition(common::standalone(&as_user).await).await;
    common::drop_user(&url, &name).await;
}

#[tokio::test]
async fn a_server_that_refuses_functions_gets_scripts() {
    let Some(url) = idem_testkit::service_url(common::STANDALONE) else {
        return;
    };
    let name = format!("idem-scripts-only-{}", std::process::id());
    let as_user = common::user_without(&url, &name, "~*", &["fcall", "fcall_ro", "function"]).await;
    every_transition(common::standalone(&as_user).await).await;
    common::drop_user(&url, &name).await;
}
