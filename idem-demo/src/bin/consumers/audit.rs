//! The audit: what the ledgers and the job's runs hold, the tables the demo prints, and
//! the check its exit code follows.

use std::fmt::Display;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_sqlite::rusqlite::Connection;

use crate::broker::Broker;
use crate::schedule::{JOB, PERIOD, SCHEDULERS, Schedule};
use crate::storm::Queue;

/// A ledger of orders, as the audit reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Orders {
    /// Rows: effects applied.
    pub(crate) effects: u64,
    /// Distinct orders applied at least once.
    pub(crate) applied: u64,
    /// Orders applied more than once.
    pub(crate) doubled: u64,
}

/// Reads a ledger of orders.
pub(crate) fn orders(conn: &Connection) -> Result<Orders, idem_sqlite::rusqlite::Error> {
    conn.query_row(
        "SELECT coalesce(sum(n), 0), count(*), coalesce(sum(n > 1), 0)
         FROM (SELECT count(*) AS n FROM ledger GROUP BY order_id)",
        [],
        |row| {
            Ok(Orders {
                effects: row.get::<_, i64>(0)? as u64,
                applied: row.get::<_, i64>(1)? as u64,
                doubled: row.get::<_, i64>(2)? as u64,
            })
        },
    )
}

/// The job's runs, as the audit reads them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Slots {
    /// Slots from the first run to the last.
    pub(crate) slots: u64,
    /// Slots run more than once.
    pub(crate) doubled: u64,
    /// Slots between the first and the last that never ran.
    pub(crate) gaps: u64,
}

/// Reads the job's runs.
pub(crate) fn slots(conn: &Connection) -> Result<Slots, idem_sqlite::rusqlite::Error> {
    let mut statement =
        conn.prepare("SELECT slot_ms, count(*) FROM runs GROUP BY slot_ms ORDER BY slot_ms")?;
    let runs: Vec<(i64, i64)> = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let (Some(first), Some(last)) = (runs.first(), runs.last()) else {
        return Ok(Slots::default());
    };
    let slots = ((last.0 - first.0) / PERIOD.as_millis() as i64 + 1) as u64;
    Ok(Slots {
        slots,
        doubled: runs.iter().filter(|(_, n)| *n > 1).count() as u64,
        gaps: slots - runs.len() as u64,
    })
}

/// One row of a table: a label and the figures with idem and without.
fn row(label: &str, with: impl Display, without: impl Display) {
    println!("  {label:<48} {with:>10} {without:>10}");
}

/// Kills as the tables show them: those that landed mid-work, and the others if any.
fn kills(landed: u64, kills: u64) -> String {
    if kills > landed {
        format!("{landed} (+{} idle)", kills - landed)
    } else {
        landed.to_string()
    }
}

/// What the audit found wrong; empty when the check passed.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    /// Each failure, in a sentence.
    pub(crate) failures: Vec<String>,
    /// Orders applied more than once without idem, per broker.
    pub(crate) doubles_without: Vec<(Broker, u64)>,
    /// Slots run more than once without idem.
    pub(crate) slots_doubled_without: u64,
    /// Slots without idem, from the first run to the last.
    pub(crate) slots_without: u64,
}

/// Prints the table of one broker, its protected queue against its unprotected one.
pub(crate) fn queue_table(
    broker: Broker,
    protected: &Queue,
    unprotected: &Queue,
    published: u64,
    verdict: &mut Verdict,
) -> Result<(), idem_sqlite::rusqlite::Error> {
    let (with, without) = (orders(&protected.ledger)?, orders(&unprotected.ledger)?);
    let (a, b) = (&protected.fleet, &unprotected.fleet);
    println!();
    row(&broker.to_string(), "with idem", "without");
    row(
        "workers SIGKILLed mid-message",
        kills(a.landed, a.kills),
        kills(b.landed, b.kills),
    );
    let load = |queue: &Queue| {
        let tally = &queue.fleet.tally;
        let n = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let redeliveries = n(&tally.redeliveries);
        let (replayed, applied, retried) =
            (n(&tally.replayed), n(&tally.applied), n(&tally.retried));
        let cut = redeliveries.saturating_sub(replayed + applied + retried);
        (redeliveries, replayed, applied, retried, cut)
    };
    let (with_redelivered, replayed, with_applied, retried, with_cut) = load(protected);
    let (without_redelivered, _, without_applied, _, without_cut) = load(unprotected);
    row(
        "redeliveries, settled as follows:",
        with_redelivered,
        without_redelivered,
    );
    row("  acked as a replay of idem's stored result", replayed, "-");
    row(
        "  put back: another worker still held the order",
        retried,
        "-",
    );
    row(
        "  applied the order, then acked",
        with_applied,
        without_applied,
    );
    row(
        "  none: the worker was killed in turn",
        with_cut,
        without_cut,
    );
    row("effects in the ledger", with.effects, without.effects);
    row(
        "orders applied more than once",
        with.doubled,
        without.doubled,
    );
    let (missing, missing_without) = (published - with.applied, published - without.applied);
    row("orders missing", missing, missing_without);

    if with.doubled > 0 || missing > 0 || with.effects != published {
        verdict.failures.push(format!(
            "with idem on {broker}, {} orders were applied more than once and {missing} are missing ({} effects for {published} orders)",
            with.doubled, with.effects
        ));
    }
    if without.doubled == 0 && b.landed == 0 {
        verdict.failures.push(format!(
            "without idem on {broker}, no kill landed mid-message and no order was applied twice: the storm did not happen"
        ));
    }
    // A protected side no kill reached proves nothing about idem.
    if a.landed == 0 {
        verdict.failures.push(format!(
            "with idem on {broker}, no kill landed mid-message: the storm did not test idem"
        ));
    }
    verdict.doubles_without.push((broker, without.doubled));
    Ok(())
}

/// Prints the scheduled job's table.
pub(crate) fn schedule_table(
    protected: &Schedule,
    unprotected: &Schedule,
    verdict: &mut Verdict,
) -> Result<(), idem_sqlite::rusqlite::Error> {
    let (with, without) = (slots(&protected.runs)?, slots(&unprotected.runs)?);
    let (a, b) = (&protected.fleet, &unprotected.fleet);
    println!();
    row(
        &format!(
            "job \"{JOB}\", every {} ms, {SCHEDULERS} schedulers",
            PERIOD.as_millis()
        ),
        "with idem",
        "without",
    );
    row(
        "schedulers SIGKILLed mid-slot",
        kills(a.landed, a.kills),
        kills(b.landed, b.kills),
    );
    row(
        "slots from the first run to the last",
        with.slots,
        without.slots,
    );
    row(
        "  taken over after a killed scheduler's lease",
        a.tally.takeovers.load(Ordering::Relaxed),
        "-",
    );
    row("slots run more than once", with.doubled, without.doubled);
    row("slots never run", with.gaps, without.gaps);

    if with.doubled > 0 || with.gaps > 0 || with.slots < 5 {
        verdict.failures.push(format!(
            "with idem, the job ran {} slots, {} of them more than once and {} never",
            with.slots, with.doubled, with.gaps
        ));
    }
    if without.doubled == 0 && b.landed == 0 {
        verdict.failures.push(
            "without idem, no scheduler was killed mid-slot and no slot ran twice: the storm did not happen"
                .to_owned(),
        );
    }
    if a.landed == 0 {
        verdict.failures.push(
            "with idem, no scheduler was killed mid-slot: the storm did not test idem".to_owned(),
        );
    }
    for schedule in [protected, unprotected] {
        if !schedule.stopped_cleanly {
            verdict.failures.push(format!(
                "the schedulers {} did not stop cleanly when asked",
                schedule.mode.label()
            ));
        }
    }
    verdict.slots_doubled_without = without.doubled;
    verdict.slots_without = without.slots;
    Ok(())
}
