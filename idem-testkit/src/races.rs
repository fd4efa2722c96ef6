//! A reusable race for store authors' own tests: many concurrent `execute` calls per key.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::{Error, Fingerprint, Idempotency, Key, Outcome, Store, WorkError};
use tokio::sync::Barrier;

/// Races `tasks` concurrent [`Idempotency::execute`] calls on each of `keys` fresh keys,
/// one key after another, all calls on a key released together.
///
/// - The work is `effect(key)`; a store author makes it write a side effect somewhere only
///   the store's database can count (a row in a table), then checks that count after.
/// - Panics, naming the key, unless the work ran exactly once per key and every other call
///   was a replay or an in-flight answer.
/// - The driver's store is any store, `dyn Store` included.
///
/// ```
/// use std::sync::Arc;
/// use idem_core::{Idempotency, MemoryStore};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let idem = Arc::new(Idempotency::new(MemoryStore::new()));
/// idem_testkit::execute_races(idem, 10, 8, |_key| async { Ok(()) }).await;
/// # });
/// ```
pub async fn execute_races<S, F, Fut>(
    idem: Arc<Idempotency<S>>,
    keys: usize,
    tasks: usize,
    effect: F,
) where
    S: Store + ?Sized + 'static,
    F: Fn(Key) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let effect = Arc::new(effect);
    for n in 0..keys {
        let key = Key::new("race", format!("key-{n}")).expect("valid key");
        let runs = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(tasks));
        let racers: Vec<_> = (0..tasks)
            .map(|_| {
                let (idem, key, runs, barrier, effect) = (
                    Arc::clone(&idem),
                    key.clone(),
                    Arc::clone(&runs),
                    Arc::clone(&barrier),
                    Arc::clone(&effect),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    let work_key = key.clone();
                    idem.execute(&key, Fingerprint::of_bytes("race"), |_ctx| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        effect(work_key).await.map_err(WorkError::Retryable)
                    })
                    .await
                })
            })
            .collect();
        let mut executed = 0;
        for racer in racers {
            match racer.await.expect("a racing task panicked") {
                Ok(Outcome::Completed { replayed, .. }) => executed += usize::from(!replayed),
                Err(Error::InFlight { .. }) => {}
                Ok(other) => panic!("key-{n}: the work failed: {other:?}"),
                Err(other) => panic!("key-{n}: an execute failed: {other:?}"),
            }
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "key-{n}: the work ran this many times among {tasks} calls"
        );
        assert_eq!(executed, 1, "key-{n}: calls that reported an execution");
    }
}
