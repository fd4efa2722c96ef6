//! A payment that is charged once whatever the retries, on SQLite.
//!
//! ```sh
//! cargo run -p idem-sqlite --example payment_sqlite              # a database in the temp directory
//! cargo run -p idem-sqlite --example payment_sqlite -- idem.db   # or a file of your own
//! ```

use std::sync::atomic::{AtomicU32, Ordering};

use idem_core::{Fingerprint, Idempotency, Key, Store, Timestamp, done};
use idem_sqlite::SqliteStore;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("idem-example.db"));
    // Opening creates the file and its tables when missing.
    let store = SqliteStore::open(&path)?;
    println!("store: SQLite database {}", path.display());
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
