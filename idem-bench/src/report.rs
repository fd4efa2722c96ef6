//! What a benchmark run measured, and how it is printed.

use serde::Serialize;

use crate::workload::Workload;
use crate::{codec, purge, scaling};

#[derive(Serialize)]
pub(crate) struct Measurement {
    pub(crate) backend: &'static str,
    pub(crate) workload: Workload,
    pub(crate) concurrency: usize,
    pub(crate) seconds_per_round: f64,
    /// Operations in the median round.
    pub(crate) ops: usize,
    pub(crate) rounds: usize,
    pub(crate) idem_ops_per_sec: f64,
    pub(crate) raw_ops_per_sec: f64,
    pub(crate) ratio: f64,
    pub(crate) idem_p50_us: f64,
    pub(crate) idem_p99_us: f64,
    pub(crate) raw_p50_us: f64,
    pub(crate) raw_p99_us: f64,
}

#[derive(Serialize)]
pub(crate) struct Trips {
    pub(crate) backend: &'static str,
    pub(crate) unit: &'static str,
    pub(crate) idem_fresh: f64,
    pub(crate) idem_replay: f64,
    pub(crate) raw_fresh: f64,
    pub(crate) raw_replay: f64,
    /// Bytes per operation on the wire, (client to server, server to client), when proxied.
    pub(crate) idem_fresh_bytes: Option<(f64, f64)>,
    pub(crate) idem_replay_bytes: Option<(f64, f64)>,
    pub(crate) raw_fresh_bytes: Option<(f64, f64)>,
    pub(crate) raw_replay_bytes: Option<(f64, f64)>,
}

/// Server time per operation, from the server's own accounting, 16 clients.
#[derive(Serialize)]
pub(crate) struct ServerRow {
    pub(crate) backend: &'static str,
    pub(crate) workload: Workload,
    pub(crate) side: &'static str,
    pub(crate) source: &'static str,
    pub(crate) ops: usize,
    /// From the engine's own accounting (None for DynamoDB Local, which has none).
    pub(crate) micros_per_op: Option<f64>,
    /// CPU of the server's processes per operation (10 ms ticks over the segment).
    pub(crate) server_cpu_micros_per_op: Option<f64>,
    /// CPU this process (clients, driver, client library) used per operation.
    pub(crate) client_cpu_micros_per_op: f64,
    /// The largest parts per operation: (command or statement, calls per op, µs per op).
    pub(crate) parts: Vec<(String, f64, f64)>,
}

/// The harness's raw replay at 16 clients against the same replay in a bare loop.
#[derive(Serialize)]
pub(crate) struct HarnessCheck {
    pub(crate) backend: &'static str,
    pub(crate) plain_ops_per_sec: f64,
    pub(crate) harness_raw_ops_per_sec: f64,
}

#[derive(Serialize)]
pub(crate) struct MemoryFloor {
    pub(crate) records_per_round: usize,
    pub(crate) pairs_per_sec_one_core: f64,
    pub(crate) pairs_per_sec_16_tasks: f64,
    pub(crate) threads: usize,
    /// What the fingerprint of one request costs, measured apart: the targets fingerprint
    /// no request inside the timed loop, as the raw baselines do not.
    pub(crate) fingerprint_ns: f64,
    /// The driver's cost per `execute` on the same store, one core.
    pub(crate) driver: crate::floor::DriverFloor,
}

#[derive(Serialize)]
pub(crate) struct Report {
    pub(crate) cores: usize,
    pub(crate) quick: bool,
    pub(crate) measurements: Vec<Measurement>,
    pub(crate) round_trips: Vec<Trips>,
    pub(crate) server_time: Vec<ServerRow>,
    pub(crate) harness_check: Vec<HarnessCheck>,
    pub(crate) memory_floor: Option<MemoryFloor>,
    pub(crate) purge: Vec<purge::PurgeRow>,
    pub(crate) codec: Vec<codec::CodecRow>,
    pub(crate) scaling: scaling::ScaleReport,
    pub(crate) reverse_proxy: Vec<crate::reverse_proxy::Row>,
    /// `idem proxy`'s memory under slow clients.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) slow_clients: Vec<crate::slow_clients::SlowRow>,
    pub(crate) dynamodb_capacity: Vec<crate::capacity::CapacityRow>,
    pub(crate) churn: Option<crate::churn::ChurnReport>,
}

pub(crate) fn print(report: &Report) {
    println!(
        "\nidem-bench: {} cores{}",
        report.cores,
        if report.quick {
            ", quick mode (smoke run, not a measurement)"
        } else {
            ""
        }
    );
    println!(
        "\n| backend | workload | clients | idem ops/s | raw ops/s | idem / raw | idem p50 / p99 (µs) | raw p50 / p99 (µs) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for m in &report.measurements {
        println!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.0} / {:.0} | {:.0} / {:.0} |",
            m.backend,
            m.workload.name(),
            m.concurrency,
            m.idem_ops_per_sec,
            m.raw_ops_per_sec,
            m.ratio,
            m.idem_p50_us,
            m.idem_p99_us,
            m.raw_p50_us,
            m.raw_p99_us
        );
    }
    println!("\n| backend | counted as | idem fresh | idem replay | raw fresh | raw replay |");
    println!("|---|---|---:|---:|---:|---:|");
    for t in &report.round_trips {
        println!(
            "| {} | {} per op | {:.2} | {:.2} | {:.2} | {:.2} |",
            t.backend, t.unit, t.idem_fresh, t.idem_replay, t.raw_fresh, t.raw_replay
        );
    }
    let bytes = |b: Option<(f64, f64)>| {
        b.map_or("-".to_owned(), |(up, down)| format!("{up:.0} / {down:.0}"))
    };
    if report
        .round_trips
        .iter()
        .any(|t| t.idem_fresh_bytes.is_some())
    {
        println!(
            "\n| backend | bytes per op (sent / received) | idem fresh | idem replay | raw fresh | raw replay |"
        );
        println!("|---|---|---:|---:|---:|---:|");
        for t in report
            .round_trips
            .iter()
            .filter(|t| t.idem_fresh_bytes.is_some())
        {
            println!(
                "| {} | on the wire | {} | {} | {} | {} |",
                t.backend,
                bytes(t.idem_fresh_bytes),
                bytes(t.idem_replay_bytes),
                bytes(t.raw_fresh_bytes),
                bytes(t.raw_replay_bytes)
            );
        }
    }
    if !report.server_time.is_empty() {
        println!(
            "\n| backend | workload | side | server µs per op (engine) | server CPU µs per op | client CPU µs per op | ops | largest parts (calls per op, µs per op) |"
        );
        println!("|---|---|---|---:|---:|---:|---:|---|");
        for row in &report.server_time {
            let parts: Vec<String> = row
                .parts
                .iter()
                .map(|(name, calls, micros)| format!("`{name}` {calls:.2} × → {micros:.1}"))
                .collect();
            let figure = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
            println!(
                "| {} | {} | {} | {} | {} | {:.1} | {} | {} |",
                row.backend,
                row.workload.name(),
                row.side,
                figure(row.micros_per_op),
                figure(row.server_cpu_micros_per_op),
                row.client_cpu_micros_per_op,
                row.ops,
                parts.join("; "),
            );
        }
    }
    if !report.harness_check.is_empty() {
        println!(
            "\n| backend | plain loop replays/s (16 clients) | harness raw replays/s | harness / plain |"
        );
        println!("|---|---:|---:|---:|");
        for check in &report.harness_check {
            println!(
                "| {} | {:.0} | {:.0} | {:.2} |",
                check.backend,
                check.plain_ops_per_sec,
                check.harness_raw_ops_per_sec,
                check.harness_raw_ops_per_sec / check.plain_ops_per_sec.max(1e-9)
            );
        }
    }
    if let Some(floor) = &report.memory_floor {
        println!(
            "\nmemory store, Store level: {:.0} claim+complete pairs/s on one core; {:.0} pairs/s with 16 tasks on distinct keys over {} threads",
            floor.pairs_per_sec_one_core, floor.pairs_per_sec_16_tasks, floor.threads
        );
        println!(
            "fingerprint of a {}-byte request (Fingerprint::of_bytes, SHA-256): {:.0} ns",
            crate::target::REQUEST.len(),
            floor.fingerprint_ns
        );
        crate::floor::print_driver(&floor.driver);
    }
}
