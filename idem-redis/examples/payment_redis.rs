//! A payment that is charged once whatever the retries, on Redis.
//!
//! ```sh
//! eval "$(scripts/services.sh start redis)"   # or any server you can reach
//! cargo run -p idem-redis --example payment_redis -- "$IDEM_TEST_REDIS_URL"
//! ```

use std::sync::atomic::{AtomicU32, Ordering};

use idem_core::{Fingerprint, Idempotency, Key, Store, Timestamp, done};
use idem_redis::RedisStore;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("IDEM_TEST_REDIS_URL").ok())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    // Keys live under a prefix of their own; records vanish when they expire.
    let store = RedisStore::standalone(&url)
        .await?
        .with_prefix("example:idem:")?;
    println!("store: Redis prefix \"example:idem:\"");
    pay_with_retries(store).await
}

/// Charges once, whatever the retries: the first attempt runs the work, the others get
/// its result back.
async fn pay_with_retries<S: Store + 'static>(store: S) -> Result<(), Box<dyn std::error::Error>> {
    let idem = Idempotency::new(store);
    // One key per logical operation; unique per run here so the example charges each time.
    let order = format!(
        "order-{}-{}",
        std::process::id(),
        Timestamp::now().as_unix_millis()
    );
    let key = Key::new("acct_42/payments.create", order)?;
    let request = Fingerprint::of_bytes("amount=500&currency=EUR");
    let charges = AtomicU32::new(0);
    for attempt in 1..=3 {
        let charges = &charges;
        let outcome = idem
            .execute(&key, request, |ctx| async move {
                charges.fetch_add(1, Ordering::SeqCst);
                // Charge the card here; ctx.token() fences the writes downstream.
                done(format!("ch_{}", ctx.token()))
            })
            .await?;
        let replayed = outcome.replayed();
        println!(
            "attempt {attempt}: {:?}, replayed: {replayed}",
            outcome.value()
        );
    }
    assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");
    println!("charged once for three attempts");
    Ok(())
}
