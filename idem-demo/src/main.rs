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

mod client;
mod progress;
mod shop;
mod storm;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use clap::Parser;
use tokio::sync::Semaphore;

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
}

/// Plays the whole storm against `shop`, `concurrency` orders at a time.
async fn run(shop: Arc<Shop>, orders: &[Order], concurrency: usize, label: &'static str) {
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
            client::play(&shop, &order).await;
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
        "idem demo: a checkout service on SQLite, {} orders, {} at a time (seed {})",
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

    let protected = Arc::new(Shop::protected(&protected_db)?);
    let started = Instant::now();
    run(
        Arc::clone(&protected),
        &orders,
        args.concurrency as usize,
        "with idem",
    )
    .await;
    let protected_time = started.elapsed();
    let unprotected = Arc::new(Shop::unprotected(&unprotected_db)?);
    let started = Instant::now();
    run(
        Arc::clone(&unprotected),
        &orders,
        args.concurrency as usize,
        "without",
    )
    .await;
    let unprotected_time = started.elapsed();

    let (with, without) = (&protected.counters, &unprotected.counters);
    let (paid, doubled, cents) = protected.audit()?;
    let (paid_raw, doubled_raw, cents_raw) = unprotected.audit()?;
    let expected: u64 = orders.iter().map(|o| o.cents).sum();
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let euros = |cents: u64| format!("{}.{:02}", cents / 100, cents % 100);

    println!();
    println!("  {:<34} {:>12} {:>12}", "", "with idem", "without");
    println!(
        "  {:<34} {:>12} {:>12}",
        "requests sent",
        n(&with.requests),
        n(&without.requests)
    );
    println!(
        "  {:<34} {:>12} {:>12}",
        "payments executed (ledger debits)",
        n(&with.executions),
        n(&without.executions)
    );
    println!(
        "  {:<34} {:>12} {:>12}",
        "replays of the first result",
        n(&with.replays),
        "-"
    );
    println!(
        "  {:<34} {:>12} {:>12}",
        "answered in flight, retried",
        n(&with.in_flight),
        "-"
    );
    println!(
        "  {:<34} {:>12} {:>12}",
        "changed amounts rejected",
        n(&with.conflicts),
        "-"
    );
    println!(
        "  {:<34} {:>12} {:>12}",
        "worker crashes",
        n(&with.crashes),
        n(&without.crashes)
    );
    println!(
        "  {:<34} {:>12} {:>12}",
        "takeovers after a crash",
        n(&with.takeovers),
        "-"
    );
    println!("  {:<34} {:>12} {:>12}", "orders debited", paid, paid_raw);
    println!(
        "  {:<34} {:>12} {:>12}",
        "orders debited more than once", doubled, doubled_raw
    );
    println!(
        "  {:<34} {:>12} {:>12}",
        "money taken (expected)",
        euros(cents),
        euros(cents_raw)
    );
    println!("  {:<34} {:>12} {:>12}", "", euros(expected), "");
    println!(
        "  {:<34} {:>11.2?} {:>11.2?}",
        "time", protected_time, unprotected_time
    );
    println!();
    let all_paid_once = paid == orders.len() as u64 && doubled == 0 && cents == expected;
    if all_paid_once {
        println!(
            "  ledger check: every order debited exactly once with idem; {doubled_raw} orders debited twice or more without it."
        );
    } else {
        println!(
            "  ledger check FAILED: {paid} orders debited, {doubled} more than once, {} taken of {} expected.",
            euros(cents),
            euros(expected)
        );
    }
    if keep {
        println!("  databases kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    if all_paid_once {
        Ok(())
    } else {
        Err("the ledger check failed".into())
    }
}
