//! The comparison's table (markdown, for BENCHMARKS.md) and its JSON.

use crate::rounds::{Segment, Workload};
use crate::server_time::Counters;

/// One segment with what the server spent on it, per execution.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Measured {
    pub segment: Segment,
    /// Microseconds inside top-level commands per execution.
    pub redis_micros: f64,
    /// Top-level commands per execution.
    pub calls: f64,
    /// Redis process CPU per execution, microseconds.
    pub cpu_micros: f64,
    /// This process's CPU per execution, microseconds: clients, library, client library.
    pub client_cpu_micros: f64,
}

impl Measured {
    pub fn new(segment: Segment, server: &Counters) -> Self {
        let ops = segment.ops.max(1) as f64;
        Self {
            redis_micros: server.command_micros / ops,
            calls: server.calls as f64 / ops,
            cpu_micros: server.cpu_seconds * 1e6 / ops,
            client_cpu_micros: server.client_cpu_seconds * 1e6 / ops,
            segment,
        }
    }
}

/// One workload at one client count: every system's segments.
#[derive(Debug, serde::Serialize)]
pub struct Cell {
    pub workload: Workload,
    pub clients: usize,
    pub segments: Vec<(&'static str, usize, Measured)>,
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

impl Cell {
    pub fn new(workload: Workload, clients: usize) -> Self {
        Self {
            workload,
            clients,
            segments: Vec::new(),
        }
    }

    pub fn push(&mut self, system: &'static str, round: usize, measured: Measured) {
        self.segments.push((system, round, measured));
    }

    fn of(&self, system: &str, f: impl Fn(&Measured) -> f64) -> f64 {
        median(
            self.segments
                .iter()
                .filter(|(name, _, _)| *name == system)
                .map(|(_, _, m)| f(m))
                .collect(),
        )
    }

    fn throughput(&self, system: &str) -> f64 {
        self.of(system, |m| m.segment.ops_per_sec())
    }

    fn ratio(&self, system: &str) -> f64 {
        self.throughput(system) / self.throughput("raw")
    }

    /// Rounds in which idem's throughput was above the peer's.
    fn idem_ahead(&self) -> (usize, usize) {
        let rounds: std::collections::BTreeSet<usize> =
            self.segments.iter().map(|(_, round, _)| *round).collect();
        let at = |system: &str, round: usize| {
            self.segments
                .iter()
                .find(|(name, r, _)| *name == system && *r == round)
                .map_or(0.0, |(_, _, m)| m.segment.ops_per_sec())
        };
        let ahead = rounds
            .iter()
            .filter(|&&round| at("idem", round) > at("idempotent", round))
            .count();
        (ahead, rounds.len())
    }

    /// A one-line summary for the progress log.
    pub fn line(&self) -> String {
        format!(
            "{} x{}: idem/raw {:.2}, idempotent/raw {:.2}; Redis µs per execution idem {:.1}, idempotent {:.1}",
            self.workload.name(),
            self.clients,
            self.ratio("idem"),
            self.ratio("idempotent"),
            self.of("idem", |m| m.redis_micros),
            self.of("idempotent", |m| m.redis_micros),
        )
    }
}

/// The markdown table: throughput against raw, then the server's time per execution.
pub fn table(cells: &[Cell]) -> String {
    let mut out = String::from(
        "| workload | clients | raw /s | idem /s | idem / raw | idempotent /s | idempotent / raw | rounds idem ahead | Redis µs per execution: idem | idempotent | raw | Redis CPU µs: idem | idempotent | raw | client CPU µs: idem | idempotent | raw |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for cell in cells {
        let (ahead, rounds) = cell.idem_ahead();
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {ahead} of {rounds} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
            cell.workload.name(),
            cell.clients,
            cell.throughput("raw"),
            cell.throughput("idem"),
            cell.ratio("idem"),
            cell.throughput("idempotent"),
            cell.ratio("idempotent"),
            cell.of("idem", |m| m.redis_micros),
            cell.of("idempotent", |m| m.redis_micros),
            cell.of("raw", |m| m.redis_micros),
            cell.of("idem", |m| m.cpu_micros),
            cell.of("idempotent", |m| m.cpu_micros),
            cell.of("raw", |m| m.cpu_micros),
            cell.of("idem", |m| m.client_cpu_micros),
            cell.of("idempotent", |m| m.client_cpu_micros),
            cell.of("raw", |m| m.client_cpu_micros),
        ));
    }
    out
}

/// Every segment, for the record.
pub fn json(version: &str, cells: &[Cell]) -> serde_json::Value {
    serde_json::json!({
        "redis_version": version,
        "cells": cells,
    })
}
