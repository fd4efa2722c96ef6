//! # idem-demo
//!
//! A small checkout service debits a ledger in SQLite. Its clients behave like real ones:
//! they time out and resend, double-click, send concurrent duplicates, lose a worker
//! mid-payment, and resend with a changed amount under the same key. The same storm hits
//! the handler twice: once protected by idem, once not. Then the ledger is audited.
//!
//! ```sh
//! cargo run --release -p idem-demo -- --orders 2000 --concurrency 64
//! ```
//!
//! ## Where things live
//!
//! - `storm.rs`: what each order's client does; `client.rs`: sending and resending;
//!   `checkout.rs`: what the clients talk to and what the summary reads; `shop.rs`: the
//!   checkout service and its SQLite ledger; `http.rs`: the same storm over HTTP;
//!   `progress.rs`: the progress bar.
//! - `bin/consumers/`: the same storm for queue consumers on NATS JetStream and RabbitMQ
//!   and a scheduled job, their processes SIGKILLed mid-work
//!   (`cargo run --release -p idem-demo --bin consumers`).

mod checkout;
mod client;
mod http;
mod progress;
mod shop;
mod storm;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use clap::Parser;
use tokio::sync::Semaphore;

use crate::checkout::Checkout;
use crate::http::HttpShop;
use crate::progress::Progress;
use crate::shop::Shop;
use crate::storm::{Order, Pattern};

/// A checkout service protected by idem, hit by a storm of realistic retries.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// How many orders the clients place.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    orders: u64,
    /// How many orders are in flight at once.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    concurrency: u64,
    /// Seed for the storm: the same seed replays the same traffic.
    #[arg(long, default_value_t = 2026)]
    seed: u64,
    /// Keep the two SQLite files in this directory to inspect them (default: a temporary
    /// directory, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Play the storm over HTTP: the service behind axum on 127.0.0.1 with idem-http's
    /// layer (and without), clients with real timeouts that disconnect when they run out.
    #[arg(long)]
    http: bool,
}

/// Plays the whole storm against `shop`, `concurrency` orders at a time.
async fn run<C: Checkout>(shop: Arc<C>, orders: &[Order], concurrency: usize, label: &'static str) {
    let progress = Arc::new(Progress::new(label, orders.len()));
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut tasks = Vec::with_capacity(orders.len());
    for order in orders {
        let order = order.clone();
        let permit = Arc::clone(&permits)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let (shop, progress) = (Arc::clone(&shop), Arc::clone(&progress));
        tasks.push(tokio::spawn(async move {
            client::play(shop.as_ref(), &order).await;
            progress.tick();
            drop(permit);
        }));
    }
    for task in tasks {
        task.await.expect("a client task panicked");
    }
    progress.finish();
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let keep = args.dir.is_some();
    let dir = match args.dir {
        Some(dir) => dir,
        None => std::env::temp_dir().join(format!("idem-demo-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    let (protected_db, unprotected_db) = (dir.join("protected.db"), dir.join("unprotected.db"));
    for path in [&protected_db, &unprotected_db] {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }

    let orders = storm::script(args.orders as usize, args.seed);
    let count = |wanted: fn(&Pattern) -> bool| orders.iter().filter(|o| wanted(&o.pattern)).count();
    println!(
        "idem demo: a checkout service on SQLite{}, {} orders, {} at a time (seed {})",
        if args.http {
            ", over HTTP on 127.0.0.1 (axum, idem-http; clients time out after 50 ms)"
        } else {
            ""
        },
        orders.len(),
        args.concurrency,
        args.seed
    );
    println!(
        "  storm: {} timeout-resends, {} double clicks, {} bursts of 3-6 duplicates, {} worker crashes mid-payment, {} resends with a changed amount",
        count(|p| *p == Pattern::TimeoutResend),
        count(|p| *p == Pattern::DoubleClick),
        count(|p| matches!(p, Pattern::Burst(_))),
        count(|p| *p == Pattern::CrashThenRetry),
        count(|p| *p == Pattern::ChangedAmount),
    );

    let summary = if args.http {
        storm(
            HttpShop::protected(&protected_db).await?,
            HttpShop::unprotected(&unprotected_db).await?,
            &orders,
            args.concurrency as usize,
        )
        .await?
    } else {
        storm(
            Shop::protected(&protected_db)?,
            Shop::unprotected(&unprotected_db)?,
            &orders,
            args.concurrency as usize,
        )
        .await?
    };
    if keep {
        println!("  databases kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if summary {
        Ok(())
    } else {
        Err("the ledger check failed".into())
    }
}

/// Plays the storm against the protected service, then the unprotected one, prints the
/// summary, and answers whether the ledger check passed.
async fn storm<C: Checkout>(
    protected: C,
    unprotected: C,
    orders: &[Order],
    concurrency: usize,
) -> Result<bool, Box<dyn std::error::Error>> {
    let protected = Arc::new(protected);
    let started = Instant::now();
    run(Arc::clone(&protected), orders, concurrency, "with idem").await;
    let protected_time = started.elapsed();
    let unprotected = Arc::new(unprotected);
    let started = Instant::now();
    run(Arc::clone(&unprotected), orders, concurrency, "without").await;
    let unprotected_time = started.elapsed();

    let (with, without) = (protected.counters(), unprotected.counters());
    let (ledger, ledger_raw) = (protected.audit()?, unprotected.audit()?);
    let expected: u64 = orders.iter().map(|o| o.cents).sum();
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed).to_string();
    let euros = |cents: u64| format!("{}.{:02}", cents / 100, cents % 100);
    let row = |label: &str, with: String, without: String| {
        println!("  {label:<46} {with:>10} {without:>10}");
    };
    let none = || "-".to_string();

    println!();
    row("", "with idem".into(), "without".into());
    row(
        "requests sent, answered as follows:",
        with.requests().to_string(),
        without.requests().to_string(),
    );
    row(
        "  paid, by a payment this request made",
        n(&with.paid_now),
        n(&without.paid_now),
    );
    row(
        "  paid, replaying the order's first payment",
        n(&with.paid_replayed),
        none(),
    );
    row(
        "  \"in flight\": the client sent it again",
        n(&with.in_flight),
        none(),
    );
    row(
        "  refused: same key, changed amount",
        n(&with.conflicts),
        none(),
    );
    row(
        "  \"try again\": the server failed",
        n(&with.retry),
        n(&without.retry),
    );
    row(
        "  no answer: the worker crashed (simulated)",
        n(&with.crashed),
        n(&without.crashed),
    );
    row(
        "  no answer: the client's 50 ms timeout ran out",
        n(&with.timed_out),
        n(&without.timed_out),
    );
    row(
        "takeovers of a key a request had abandoned",
        n(&with.takeovers),
        none(),
    );
    row(
        "ledger: debits (payments that took money)",
        ledger.debits.to_string(),
        ledger_raw.debits.to_string(),
    );
    row(
        "ledger: orders debited",
        ledger.orders.to_string(),
        ledger_raw.orders.to_string(),
    );
    row(
        "ledger: orders debited more than once",
        ledger.orders_debited_twice.to_string(),
        ledger_raw.orders_debited_twice.to_string(),
    );
    let refused = protected.refused_by_the_ledger();
    if let Some(refused) = refused {
        row(
            "ledger: second debits its unique key refused",
            refused.to_string(),
            none(),
        );
    }
    row("money taken", euros(ledger.cents), euros(ledger_raw.cents));
    row(
        "money owed (one debit per order)",
        euros(expected),
        euros(expected),
    );
    row(
        "time",
        format!("{protected_time:.2?}"),
        format!("{unprotected_time:.2?}"),
    );
    println!(
        "  Each request sent is counted in one answer row. Debits exceed \"paid, by a payment this\n  \
         request made\" only by requests whose client timed out after the payment went through."
    );
    println!();
    let all_paid_once = ledger.orders == orders.len() as u64
        && ledger.debits == ledger.orders
        && ledger.cents == expected
        && refused.unwrap_or(0) == 0;
    if all_paid_once {
        println!(
            "  ledger check: every order debited exactly once with idem (by idem alone); {} orders debited twice or more without it.",
            ledger_raw.orders_debited_twice
        );
    } else {
        println!(
            "  ledger check FAILED: {} debits for {} orders, {} orders more than once, {} taken of {} owed, {} second debits refused by the ledger.",
            ledger.debits,
            ledger.orders,
            ledger.orders_debited_twice,
            euros(ledger.cents),
            euros(expected),
            refused.unwrap_or(0)
        );
    }
    Ok(all_paid_once)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The summary once printed "payments executed 491" beside "orders debited 500",
    /// and 65 "worker crashes" for a storm of 40. Every figure must mean one thing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_figure_of_the_summary_means_one_thing() {
        let dir = std::env::temp_dir().join(format!("idem-demo-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let orders = storm::script(120, 7);
        let crashes = orders
            .iter()
            .filter(|o| o.pattern == Pattern::CrashThenRetry)
            .count() as u64;
        for (shop, path) in [
            (Shop::protected as fn(&std::path::Path) -> _, "protected.db"),
            (Shop::unprotected, "unprotected.db"),
        ] {
            let shop = Arc::new(shop(&dir.join(path)).unwrap());
            run(Arc::clone(&shop), &orders, 16, "test").await;
            let c = &shop.counters;
            let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
            assert_eq!(
                load(&c.crashed),
                crashes,
                "{path}: one crash per crashing order"
            );
            let audit = shop.audit().unwrap();
            assert_eq!(
                audit.orders,
                orders.len() as u64,
                "{path}: every order paid"
            );
            // Debits are payments that answered "paid now", plus those whose client gave
            // up after the payment went through.
            assert!(
                audit.debits >= load(&c.paid_now)
                    && audit.debits <= load(&c.paid_now) + load(&c.timed_out),
                "{path}: {} debits, {} paid now, {} timed out",
                audit.debits,
                load(&c.paid_now),
                load(&c.timed_out)
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The same storm over HTTP, with real timeouts: one debit per order with idem, by
    /// idem alone (the ledger's unique key refused nothing), and the figures add up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_http_every_order_is_debited_once() {
        let dir = std::env::temp_dir().join(format!("idem-demo-http-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let orders = storm::script(120, 11);
        let shop = Arc::new(
            HttpShop::protected(&dir.join("protected.db"))
                .await
                .unwrap(),
        );
        run(Arc::clone(&shop), &orders, 16, "test").await;
        let audit = shop.audit().unwrap();
        assert_eq!(audit.orders, orders.len() as u64);
        assert_eq!(audit.debits, audit.orders, "one debit per order");
        assert_eq!(audit.orders_debited_twice, 0);
        assert_eq!(shop.refused_by_the_ledger(), Some(0));
        let c = shop.counters();
        let crashes = orders
            .iter()
            .filter(|o| o.pattern == Pattern::CrashThenRetry)
            .count() as u64;
        assert_eq!(c.crashed.load(Ordering::Relaxed), crashes);
        assert!(
            c.takeovers.load(Ordering::Relaxed) >= crashes,
            "each crashed order was taken over"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
