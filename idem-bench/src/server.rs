//! Server time per operation, read from the server itself: the figure that survives a
//! noisy shared machine best, because it leaves out the client, the scheduler and the
//! wire. PostgreSQL: `pg_stat_statements` (execution plus planning time of every
//! statement); Redis: `INFO commandstats` (microseconds inside each command); DynamoDB
//! Local, which reports nothing of the kind: the CPU time of its Java process from
//! `/proc` (10 ms ticks, so only long segments mean anything).

use async_trait::async_trait;
use serde::Serialize;

use crate::target::BoxError;

/// Time the server spent, summed over what it ran, and the commands or statements behind it.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct ServerReading {
    /// Microseconds of server time.
    pub(crate) micros: f64,
    /// The largest parts: (command or statement, calls, microseconds).
    pub(crate) parts: Vec<(String, u64, f64)>,
}

/// A server whose own accounting the harness can reset and read.
#[async_trait]
pub(crate) trait ServerClock: Send + Sync {
    /// What the figure is, for the report.
    fn source(&self) -> &'static str;
    /// Starts a new segment.
    async fn reset(&self) -> Result<(), BoxError>;
    /// What the server spent since the last reset.
    async fn read(&self) -> Result<ServerReading, BoxError>;
}

/// Redis `INFO commandstats`, less the harness's own `INFO` and `CONFIG` calls.
pub(crate) struct RedisClock {
    pub(crate) connection: redis::aio::ConnectionManager,
}

#[async_trait]
impl ServerClock for RedisClock {
    fn source(&self) -> &'static str {
        "INFO commandstats"
    }

    async fn reset(&self) -> Result<(), BoxError> {
        let mut conn = self.connection.clone();
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    async fn read(&self) -> Result<ServerReading, BoxError> {
        let mut conn = self.connection.clone();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await?;
        Ok(parse_commandstats(&info))
    }
}

/// Commands a script runs: commandstats counts them on their own line as well as inside
/// the script's, so where scripts ran they are shown but not added again.
const INSIDE_SCRIPTS: [&str; 9] = [
    "hmget",
    "hset",
    "hgetall",
    "hdel",
    "pexpireat",
    "time",
    "del",
    "exists",
    "hget",
];

/// `cmdstat_evalsha:calls=3,usec=40,usec_per_call=13.33,...` lines, summed.
fn parse_commandstats(info: &str) -> ServerReading {
    let mut reading = ServerReading::default();
    for line in info.lines() {
        let Some((name, fields)) = line
            .strip_prefix("cmdstat_")
            .and_then(|rest| rest.split_once(':'))
        else {
            continue;
        };
        if name == "info" || name.starts_with("config") {
            continue;
        }
        let field = |wanted: &str| -> f64 {
            fields
                .split(',')
                .find_map(|pair| pair.strip_prefix(wanted)?.strip_prefix('='))
                .and_then(|value| value.parse().ok())
                .unwrap_or(0.0)
        };
        let (calls, usec) = (field("calls"), field("usec"));
        reading.parts.push((name.to_owned(), calls as u64, usec));
    }
    let scripted = reading
        .parts
        .iter()
        .any(|(name, _, _)| name.starts_with("eval") || name.starts_with("fcall"));
    reading.micros = reading
        .parts
        .iter()
        .filter(|(name, _, _)| !(scripted && INSIDE_SCRIPTS.contains(&name.as_str())))
        .map(|(_, _, usec)| usec)
        .sum();
    reading.parts.sort_by(|a, b| b.2.total_cmp(&a.2));
    reading
}

/// PostgreSQL `pg_stat_statements` with `track_planning` on (`scripts/services.sh`).
pub(crate) struct PostgresClock {
    pub(crate) pool: sqlx::PgPool,
}

impl PostgresClock {
    /// `None` when the extension is not loaded (a server not started by
    /// `scripts/services.sh`): the run goes on without server time.
    pub(crate) async fn new(pool: sqlx::PgPool) -> Option<Self> {
        let created = sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&pool)
            .await;
        let readable = sqlx::query("SELECT count(*) FROM pg_stat_statements")
            .fetch_one(&pool)
            .await;
        match (created, readable) {
            (Ok(_), Ok(_)) => Some(Self { pool }),
            _ => {
                eprintln!(
                    "  (no pg_stat_statements on this server: start it with scripts/services.sh for server time)"
                );
                None
            }
        }
    }
}

#[async_trait]
impl ServerClock for PostgresClock {
    fn source(&self) -> &'static str {
        "pg_stat_statements (execution + planning)"
    }

    async fn reset(&self) -> Result<(), BoxError> {
        sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn read(&self) -> Result<ServerReading, BoxError> {
        let rows: Vec<(String, i64, i64, f64)> = sqlx::query_as(
            "SELECT query, calls, plans, (total_exec_time + total_plan_time) * 1000.0
             FROM pg_stat_statements
             WHERE query NOT LIKE '%pg_stat_statements%'
             ORDER BY 4 DESC",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut reading = ServerReading::default();
        for (query, calls, plans, micros) in rows {
            reading.micros += micros;
            let short: String = query.split_whitespace().collect::<Vec<_>>().join(" ");
            // Planned fewer times than called: the prepared statement's plan was reused.
            let short = format!(
                "{} (planned {plans}×)",
                short.chars().take(48).collect::<String>()
            );
            reading.parts.push((short, calls.max(0) as u64, micros));
        }
        Ok(reading)
    }
}

/// Linux reports CPU time in clock ticks of 1/100 s (USER_HZ) on every common platform.
const MICROS_PER_TICK: f64 = 10_000.0;

/// The parent's pid and the CPU ticks (user + system) in a `/proc/<pid>/stat` line.
fn parent_and_ticks(stat: &str) -> Option<(u32, u64)> {
    // Fields after the command name, which is in parentheses and may hold spaces: ppid,
    // utime and stime are the 4th, 14th and 15th fields of the whole line.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let number = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some((u32::try_from(number(1)?).ok()?, number(11)? + number(12)?))
}

/// CPU time (user + system) of the processes whose command line holds every marker, and
/// of their children.
pub(crate) struct ProcessClock {
    markers: Vec<String>,
}

impl ProcessClock {
    pub(crate) fn new(markers: Vec<String>) -> Self {
        Self { markers }
    }

    /// Microseconds of CPU the matching processes, and their children (PostgreSQL's
    /// backends), have used so far.
    pub(crate) fn cpu_micros(&self) -> Result<f64, BoxError> {
        // (pid, parent, command line, ticks) of every readable process.
        let mut processes = Vec::new();
        for entry in std::fs::read_dir("/proc")?.flatten() {
            let path = entry.path();
            let Some(pid) = path
                .file_name()
                .and_then(|name| name.to_str())
                .and_then(|name| name.parse::<u32>().ok())
            else {
                continue;
            };
            let (Ok(cmdline), Ok(stat)) = (
                std::fs::read(path.join("cmdline")),
                std::fs::read_to_string(path.join("stat")),
            ) else {
                continue;
            };
            let Some((parent, ticks)) = parent_and_ticks(&stat) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            processes.push((pid, parent, cmdline, ticks));
        }
        let roots: Vec<u32> = processes
            .iter()
            .filter(|(_, _, cmdline, _)| self.markers.iter().all(|m| cmdline.contains(m)))
            .map(|(pid, ..)| *pid)
            .collect();
        if roots.is_empty() {
            return Err(format!("no process with {:?} in its command line", self.markers).into());
        }
        let ticks: u64 = processes
            .iter()
            .filter(|(pid, parent, ..)| roots.contains(pid) || roots.contains(parent))
            .map(|(.., ticks)| ticks)
            .sum();
        Ok(ticks as f64 * MICROS_PER_TICK)
    }
}

/// CPU time (user + system) this process has used, in microseconds: the client side of
/// the same segments (the harness's clients, the driver, the client library).
pub(crate) fn own_cpu_micros() -> Result<f64, BoxError> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let (_, ticks) = parent_and_ticks(&stat).ok_or("unreadable /proc/self/stat")?;
    Ok(ticks as f64 * MICROS_PER_TICK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_lines_give_parent_and_cpu_ticks() {
        // A command name with spaces and a parenthesis, as a process may set.
        let line = "4242 (postgres: idle (x)) S 31 4242 4242 0 -1 4194560 10 0 0 0 7 5 0 0 20 0 1 0 100 0 0";
        assert_eq!(parent_and_ticks(line), Some((31, 12)));
        assert_eq!(parent_and_ticks("no parenthesis here"), None);
        assert_eq!(
            parent_and_ticks("1 (init) S"),
            None,
            "a cut line is not zero"
        );
    }

    #[test]
    fn commandstats_are_summed_without_the_harness_calls() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=52,usec_per_call=5.20,rejected_calls=0,failed_calls=0\r\ncmdstat_info:calls=1,usec=90,usec_per_call=90.00\r\ncmdstat_set:calls=4,usec=8,usec_per_call=2.00\r\ncmdstat_hmget:calls=10,usec=20,usec_per_call=2.00\r\n";
        let reading = parse_commandstats(info);
        // evalsha and set; the HMGETs ran inside the scripts and are in evalsha's figure.
        assert_eq!(reading.micros, 60.0);
        assert_eq!(reading.parts[0], ("evalsha".to_owned(), 10, 52.0));
        assert_eq!(reading.parts.len(), 3);
        let raw = parse_commandstats("cmdstat_hmget:calls=10,usec=20,usec_per_call=2.00\r\n");
        assert_eq!(
            raw.micros, 20.0,
            "without scripts, every command is the client's own"
        );
    }
}
