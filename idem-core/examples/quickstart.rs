//! A checkout handler protected by idem, hit by the retries real clients send: resends after
//! timeouts, double clicks, concurrent duplicates and a resend with a changed amount.
//!
//! Run it with `cargo run --example quickstart -p idem-core`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_core::{Error, Fingerprint, Idempotency, Key, MemoryStore, WorkError};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    payment_id: u64,
    amount_cents: u64,
}

/// The side effect idem protects: money leaving an account.
#[derive(Default)]
struct Ledger {
    next_id: AtomicU64,
    debits: Mutex<HashMap<String, Vec<u64>>>,
}

impl Ledger {
    async fn debit(&self, order: &str, amount_cents: u64) -> Receipt {
        self.debits
            .lock()
            .await
            .entry(order.to_owned())
            .or_default()
            .push(amount_cents);
        Receipt {
            payment_id: self.next_id.fetch_add(1, Ordering::SeqCst) + 1,
            amount_cents,
        }
    }
}

#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    executed: AtomicU64,
    replayed: AtomicU64,
    in_flight: AtomicU64,
    mismatched: AtomicU64,
}

async fn checkout(
    idem: &Idempotency<MemoryStore>,
    ledger: &Ledger,
    tally: &Tally,
    order: &str,
    amount_cents: u64,
) {
    tally.sent.fetch_add(1, Ordering::Relaxed);
    let key = Key::new("shop/checkout", order).expect("order ids are valid keys");
    let fingerprint = Fingerprint::builder()
        .field(order)
        .field(amount_cents.to_be_bytes())
        .finish();
    let result = idem
        .execute(&key, fingerprint, |_ctx| async move {
            tokio::task::yield_now().await; // the payment provider takes a moment
            Ok::<_, WorkError<String>>(ledger.debit(order, amount_cents).await)
        })
        .await;
    let counter = match result {
        Ok(done) if done.replayed => &tally.replayed,
        Ok(_) => &tally.executed,
        Err(Error::InFlight { .. }) => &tally.in_flight,
        Err(Error::Mismatch) => &tally.mismatched,
        Err(other) => panic!("unexpected: {other}"),
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

#[tokio::main]
async fn main() {
    let idem = Arc::new(Idempotency::new(MemoryStore::new()));
    let ledger = Arc::new(Ledger::default());
    let tally = Arc::new(Tally::default());
    let orders = 200;

    let mut tasks = Vec::new();
    for n in 0..orders {
        let order = format!("order-{n}");
        // Every order: a double click (two at once), then a resend after a "timeout",
        // and every tenth order a resend with a changed amount under the same key.
        for attempt in 0..4 {
            let (idem, ledger, tally, order) =
                (idem.clone(), ledger.clone(), tally.clone(), order.clone());
            let amount = if attempt == 3 && n % 10 == 0 {
                999
            } else {
                500
            };
            if attempt == 3 && amount == 500 {
                continue;
            }
            tasks.push(tokio::spawn(async move {
                if attempt == 2 {
                    tokio::task::yield_now().await;
                }
                checkout(&idem, &ledger, &tally, &order, amount).await;
            }));
        }
    }
    for task in tasks {
        task.await.expect("a checkout task panicked");
    }
    // Every client sends one last retry once the storm settled: each gets its receipt back.
    for n in 0..orders {
        checkout(&idem, &ledger, &tally, &format!("order-{n}"), 500).await;
    }

    let debits = ledger.debits.lock().await;
    let double = debits.values().filter(|d| d.len() > 1).count();
    println!("idem quickstart: {orders} orders, each retried like real clients do");
    println!(
        "  requests sent        {:>6}",
        tally.sent.load(Ordering::Relaxed)
    );
    println!(
        "  work executed        {:>6}",
        tally.executed.load(Ordering::Relaxed)
    );
    println!(
        "  replayed results     {:>6}",
        tally.replayed.load(Ordering::Relaxed)
    );
    println!(
        "  answered in-flight   {:>6}",
        tally.in_flight.load(Ordering::Relaxed)
    );
    println!(
        "  key reused for another amount, rejected {:>3}",
        tally.mismatched.load(Ordering::Relaxed)
    );
    println!("  orders debited       {:>6}", debits.len());
    println!("  double debits        {:>6}", double);
    assert_eq!(double, 0, "idem let an order be debited twice");
}
