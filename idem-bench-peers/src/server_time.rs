//! What Redis itself spent: `INFO commandstats` (microseconds inside each command) and
//! `INFO cpu` (the server process's CPU), read before and after a segment; and the CPU of
//! this process (clients, library, client library) from `/proc/self/stat`.

use redis::aio::ConnectionManager;

use crate::systems::BoxError;

/// The commands a client sends at the top level in this comparison. A script's own calls
/// (`HSET`, `INFO`, `TIME` ...) are counted inside the script's line and again on their
/// own, so only these are added up.
const TOP_LEVEL: [&str; 7] = [
    "evalsha",
    "eval",
    "fcall",
    "fcall_ro",
    "set",
    "script|load",
    "function|load",
];

/// A reading of the server's counters.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// Microseconds inside top-level commands.
    pub command_micros: f64,
    /// Top-level calls.
    pub calls: u64,
    /// CPU seconds of the server process (user + system).
    pub cpu_seconds: f64,
    /// CPU seconds of this process (user + system; 10 ms ticks).
    pub client_cpu_seconds: f64,
}

impl Counters {
    pub async fn read(connection: &ConnectionManager) -> Result<Self, BoxError> {
        let mut conn = connection.clone();
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await?;
        let cpu: String = redis::cmd("INFO").arg("cpu").query_async(&mut conn).await?;
        let mut counters = Self::default();
        for line in stats.lines() {
            let Some((name, fields)) = line
                .strip_prefix("cmdstat_")
                .and_then(|rest| rest.split_once(':'))
            else {
                continue;
            };
            if !TOP_LEVEL.contains(&name) {
                continue;
            }
            counters.calls += field(fields, "calls") as u64;
            counters.command_micros += field(fields, "usec");
        }
        for line in cpu.lines() {
            if let Some(value) = line
                .strip_prefix("used_cpu_user:")
                .or_else(|| line.strip_prefix("used_cpu_sys:"))
            {
                counters.cpu_seconds += value.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
        counters.client_cpu_seconds = own_cpu_seconds();
        Ok(counters)
    }

    /// What was spent between `before` and `self`.
    pub fn since(&self, before: &Self) -> Self {
        Self {
            command_micros: self.command_micros - before.command_micros,
            calls: self.calls.saturating_sub(before.calls),
            cpu_seconds: self.cpu_seconds - before.cpu_seconds,
            client_cpu_seconds: self.client_cpu_seconds - before.client_cpu_seconds,
        }
    }
}

/// `calls=3,usec=40,usec_per_call=13.33,...`: the named field, or 0.
fn field(fields: &str, wanted: &str) -> f64 {
    fields
        .split(',')
        .find_map(|pair| pair.strip_prefix(wanted)?.strip_prefix('='))
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

/// utime + stime of this process, from `/proc/self/stat` (0 where there is no `/proc`).
fn own_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // The command name may hold spaces; the fields after its closing parenthesis do not.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
        .sum();
    ticks / 100.0
}
