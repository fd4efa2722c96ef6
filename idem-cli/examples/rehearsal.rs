//! Fills a store with the situations RUNBOOK.md walks through, so that an operator can
//! rehearse each one with the `idem` command before meeting it at 3 a.m.:
//!
//! - `acct_17/charge`: 40 completed payments (business as usual);
//! - `acct_17/refund`: 2 failed refunds;
//! - `acct_42/charge`: 3 payments stuck in progress (leases ended), one of them after its
//!   `charge` step was checkpointed with the provider's charge id;
//! - `acct_42/charge`: 1 payment in progress with a live lease (a worker still on it);
//! - `acct_99/charge`: 500 payments from one tenant (key flooding);
//! - `acct_17/charge`: 120 expired records awaiting purge.
//!
//! ```sh
//! cargo run -p idem-cli --example rehearsal -- --sqlite /tmp/rehearsal.db
//! cargo run -p idem-cli --example rehearsal -- --postgres postgres://... --table idem_rehearsal
//! ```

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use idem_core::{
    Fingerprint, Key, Store, key::StepName, record::Lease, store::ClaimOutcome,
    store::ClaimRequest, store::WriteOutcome,
};
use idem_postgres::PostgresStore;
use idem_postgres::sqlx::postgres::PgPoolOptions;
use idem_sqlite::SqliteStore;

/// Fills a store with the runbook's situations.
#[derive(Parser)]
struct Args {
    /// A SQLite file to fill (created when missing).
    #[arg(long, conflicts_with = "postgres")]
    sqlite: Option<std::path::PathBuf>,
    /// A PostgreSQL URL to fill.
    #[arg(long, requires = "table")]
    postgres: Option<String>,
    /// The PostgreSQL table (created when missing).
    #[arg(long)]
    table: Option<String>,
}

const DAY: Duration = Duration::from_secs(24 * 3600);

async fn claim(
    store: &dyn Store,
    scope: &str,
    key: &str,
    lease: Duration,
    retention: Duration,
) -> Lease {
    let request = ClaimRequest::new(
        Key::new(scope, key).expect("valid key"),
        Fingerprint::of_bytes(key),
        lease,
        retention,
    );
    match store.claim(&request).await.expect("claim") {
        ClaimOutcome::Claimed { lease, .. } => lease,
        _ => panic!("{scope}/{key} was already there: fill an empty store"),
    }
}

async fn complete(store: &dyn Store, scope: &str, key: &str, retention: Duration, response: &str) {
    let lease = claim(store, scope, key, Duration::from_secs(30), retention).await;
    let done = store
        .complete(&lease, response.as_bytes())
        .await
        .expect("complete");
    assert_eq!(done, WriteOutcome::Applied);
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let store: Arc<dyn Store> = match (&args.sqlite, &args.postgres, &args.table) {
        (Some(path), None, _) => Arc::new(SqliteStore::open(path)?),
        (None, Some(url), Some(table)) => {
            let pool = PgPoolOptions::new().max_connections(4).connect(url).await?;
            let store = PostgresStore::builder(pool).table(table)?.build();
            store.migrate().await?;
            Arc::new(store)
        }
        _ => return Err("pass --sqlite PATH, or --postgres URL --table NAME".into()),
    };
    let store = &*store;
    for n in 0..40 {
        let receipt = format!("{{\"status\":\"paid\",\"charge\":\"ch_{n:04}\"}}");
        complete(
            store,
            "acct_17/charge",
            &format!("order-{n:04}"),
            DAY,
            &receipt,
        )
        .await;
    }
    for n in 0..2 {
        let lease = claim(
            store,
            "acct_17/refund",
            &format!("refund-{n}"),
            Duration::from_secs(30),
            DAY,
        )
        .await;
        let failed = store.fail(&lease, b"{\"error\":\"card_declined\"}").await?;
        assert_eq!(failed, WriteOutcome::Applied);
    }
    // Stuck: leases of 1 ms, their workers gone.
    let stuck = Duration::from_millis(1);
    claim(store, "acct_42/charge", "order-7781", stuck, DAY).await;
    claim(store, "acct_42/charge", "order-7782", stuck, DAY).await;
    claim(store, "acct_42/charge", "order-7783", stuck, DAY).await;
    // A worker still on it.
    claim(
        store,
        "acct_42/charge",
        "order-7790",
        Duration::from_secs(600),
        DAY,
    )
    .await;
    // order-7781 again: a retry took it over, checkpointed the provider's charge, and died
    // too (lease of 50 ms).
    tokio::time::sleep(Duration::from_millis(5)).await;
    let step = StepName::new("charge")?;
    let request = ClaimRequest::new(
        Key::new("acct_42/charge", "order-7781")?,
        Fingerprint::of_bytes("order-7781"),
        Duration::from_millis(50),
        DAY,
    );
    if let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await? {
        let written = store
            .checkpoint(&lease, &step, b"{\"provider_charge_id\":\"ch_3PzL\"}")
            .await?;
        assert_eq!(written, WriteOutcome::Applied);
    }
    for n in 0..500 {
        complete(
            store,
            "acct_99/charge",
            &format!("flood-{n:05}"),
            DAY,
            "{\"status\":\"paid\"}",
        )
        .await;
    }
    for n in 0..120 {
        complete(
            store,
            "acct_17/charge",
            &format!("old-{n:04}"),
            Duration::from_millis(1),
            "{}",
        )
        .await;
    }
    println!("filled: 40 completed, 2 failed, 3 stuck, 1 live, 500 from acct_99, 120 expired");
    Ok(())
}
