//! What the storm's clients talk to, in process or over HTTP, and what the summary reads.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_sqlite::rusqlite::Connection;

/// A checkout service as the clients see it.
pub(crate) trait Checkout: Send + Sync + 'static {
    /// One request for `order`. With `crash`, the worker handling it dies after calling the
    /// provider and before the debit commits.
    fn request(&self, order: &str, cents: u64, crash: bool) -> impl Future<Output = Answer> + Send;
    /// How the requests were answered.
    fn counters(&self) -> &Counters;
    /// Second debits of one execution that a unique key in the ledger refused, where the
    /// ledger has one (over HTTP).
    fn refused_by_the_ledger(&self) -> Option<u64> {
        None
    }
    /// What the ledger holds.
    fn audit(&self) -> Result<Audit, Box<dyn std::error::Error>>;
}

/// What one request got back.
#[derive(Debug)]
pub(crate) enum Answer {
    Paid,
    InFlight(Duration),
    Conflict,
    /// The worker died mid-payment; the client saw a timeout.
    Crashed,
    /// The client gave up waiting (the request may still finish on the server).
    TimedOut,
    /// The server says: try again.
    Retry,
}

/// How the requests were answered: every request sent is counted in exactly one of these.
#[derive(Default, Debug)]
pub(crate) struct Counters {
    /// Paid, by the payment this request made.
    pub(crate) paid_now: AtomicU64,
    /// Paid, by replaying the payment an earlier request made.
    pub(crate) paid_replayed: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) conflicts: AtomicU64,
    pub(crate) retry: AtomicU64,
    /// The simulated crashes: the worker died mid-payment.
    pub(crate) crashed: AtomicU64,
    /// The client's timeout ran out on a worker that had not crashed.
    pub(crate) timed_out: AtomicU64,
    /// Not an answer: how many executions took over a key an earlier request abandoned.
    pub(crate) takeovers: AtomicU64,
}

impl Counters {
    /// Every request sent: the sum of the answers.
    pub(crate) fn requests(&self) -> u64 {
        [
            &self.paid_now,
            &self.paid_replayed,
            &self.in_flight,
            &self.conflicts,
            &self.retry,
            &self.crashed,
            &self.timed_out,
        ]
        .iter()
        .map(|n| n.load(Ordering::Relaxed))
        .sum()
    }

    pub(crate) fn count(&self, answer: &Answer, replayed: bool) {
        let counter = match answer {
            Answer::Paid if replayed => &self.paid_replayed,
            Answer::Paid => &self.paid_now,
            Answer::InFlight(_) => &self.in_flight,
            Answer::Conflict => &self.conflicts,
            Answer::Crashed => &self.crashed,
            Answer::TimedOut => &self.timed_out,
            Answer::Retry => &self.retry,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The ledger, as the audit reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Audit {
    /// Debit rows: payments that took money.
    pub(crate) debits: u64,
    /// Orders with at least one debit.
    pub(crate) orders: u64,
    /// Orders with more than one debit.
    pub(crate) orders_debited_twice: u64,
    /// Money taken, in cents.
    pub(crate) cents: u64,
}

/// Opens (creating when missing) the ledger at `path`, shared by the in-process shop and
/// the HTTP service.
pub(crate) fn open_ledger(path: &Path) -> Result<Connection, idem_sqlite::rusqlite::Error> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.execute_batch(include_str!("../sql/ledger.sql"))?;
    Ok(conn)
}

/// Reads the ledger: debits, orders, orders debited more than once, money taken.
pub(crate) fn audit(conn: &Connection) -> Result<Audit, idem_sqlite::rusqlite::Error> {
    conn.query_row(include_str!("../sql/audit.sql"), [], |row| {
        Ok(Audit {
            debits: row.get::<_, i64>(0)? as u64,
            orders: row.get::<_, i64>(1)? as u64,
            orders_debited_twice: row.get::<_, i64>(2)? as u64,
            cents: row.get::<_, i64>(3)? as u64,
        })
    })
}
