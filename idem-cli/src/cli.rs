//! The command line: what `idem --help` shows.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The exit codes, as `idem --help` lists them.
const AFTER_HELP: &str = "\
Store URLs:
  sqlite:///var/lib/app/idem.db          a database file (absolute path after sqlite://)
  postgres://user@host:5432/db           with --table (default idem_records)
  redis://host:6379/0                    with --prefix (default idem:)
  redis+cluster://host:7001,host:7002    any nodes of a Redis Cluster, with --prefix
  dynamodb://TABLE?region=eu-west-1      with --prefix; &endpoint=http://127.0.0.1:8000
                                         for DynamoDB Local; credentials from
                                         AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
                                         (/ AWS_SESSION_TOKEN)

Exit codes:
  0  done
  1  the store failed in a way a retry may fix (unreachable, busy, throttled)
  2  bad usage: an unknown flag, a bad URL, scope or key
  3  no such record
  4  refused (release): the record is completed or failed, or at the last
     fencing token; nothing changed
  5  not confirmed: answered no, or no terminal to ask and no --yes
  6  the store failed in a way a retry will not fix (a missing table, bad
     credentials, a corrupt record): fix the setup first";

/// Operates an idem store: what it holds, stuck keys, an operator's release, deletion,
/// purging and migration. The same commands on every backend.
#[derive(Debug, Parser)]
#[command(name = "idem", version, after_help = AFTER_HELP)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Which store to operate on.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// The store's URL (see "Store URLs" below).
    #[arg(
        long,
        global = true,
        env = "IDEM_STORE",
        value_name = "URL",
        hide_env_values = true
    )]
    pub(crate) store: Option<String>,
    /// The PostgreSQL table (optionally schema-qualified), for postgres:// URLs.
    #[arg(
        long,
        global = true,
        env = "IDEM_TABLE",
        value_name = "NAME",
        hide_env_values = true
    )]
    pub(crate) table: Option<String>,
    /// The key prefix, for redis://, redis+cluster:// and dynamodb:// URLs.
    #[arg(
        long,
        global = true,
        env = "IDEM_PREFIX",
        value_name = "PREFIX",
        hide_env_values = true
    )]
    pub(crate) prefix: Option<String>,
    /// The secret the service passes to `idem_core::key::set_log_hash_secret`, so the short
    /// key hashes shown here match its logs.
    #[arg(
        long,
        global = true,
        env = "IDEM_LOG_HASH_SECRET",
        value_name = "SECRET",
        hide_env_values = true
    )]
    pub(crate) log_hash_secret: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Creates or upgrades the schema or table (DynamoDB: creates the table and turns TTL
    /// on). Safe to run again, and from many machines at once.
    Migrate,
    /// Counts records by state, stuck work, the purge backlog and the largest scopes.
    Stats(StatsArgs),
    /// Lists records, oldest first, a page at a time.
    List(ListArgs),
    /// Shows one record: state, token, lease, times, steps and response size.
    Inspect(InspectArgs),
    /// Releases an in-progress key on the operator's behalf: the attempt that held it is
    /// fenced (it can no longer write), and the next retry runs the work, resuming from its
    /// checkpoints.
    Release(ChangeArgs),
    /// Deletes one record, whatever its state: the next request with that key runs the
    /// work again.
    Delete(ChangeArgs),
    /// Deletes expired records (retention over, no live lease) in batches.
    Purge(PurgeArgs),
    /// Runs a reverse proxy that makes an HTTP service idempotent: the Idempotency-Key
    /// header in front of any upstream, on this store (idem-proxy; see its README for the
    /// configuration file). Stops gracefully on SIGTERM or Ctrl-C.
    Proxy(ProxyArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ProxyArgs {
    /// The configuration file (TOML).
    #[arg(long, short = 'c', value_name = "FILE", env = "IDEM_PROXY_CONFIG")]
    pub(crate) config: std::path::PathBuf,
    /// Where clients connect, over the file's `listen`.
    #[arg(long, value_name = "ADDR")]
    pub(crate) listen: Option<std::net::SocketAddr>,
    /// Where /metrics, /healthz and /readyz are served, over the file's `admin_listen`.
    #[arg(long, value_name = "ADDR")]
    pub(crate) admin_listen: Option<std::net::SocketAddr>,
    /// Check the file, open the store (migrating it first when the file says `migrate =
    /// true`) and bind the ports, then exit without serving.
    #[arg(long)]
    pub(crate) check: bool,
    /// Worker threads serving requests (default: one per core).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub(crate) threads: Option<u16>,
    /// What is logged to stderr: error, warn, info (the default: start, shutdown, upstream
    /// failures), debug or trace. Keys, tokens and bodies are never logged whole.
    #[arg(long, value_name = "LEVEL", default_value = "info", env = "IDEM_LOG")]
    pub(crate) log: tracing_subscriber::filter::LevelFilter,
}

#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    /// How many of the largest scopes to show.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub(crate) top: usize,
    /// Prometheus text exposition (for a textfile collector or a pushgateway). Scopes are
    /// labelled by their short hash, as `idem stats` shows beside each scope: a scope often
    /// holds an account id, which has no place in a metrics system.
    #[arg(long, conflicts_with = "json")]
    pub(crate) prometheus: bool,
    /// With --prometheus: label scopes with the scopes themselves, for stores whose scopes
    /// name operations only (no account or user ids).
    #[arg(long, requires = "prometheus")]
    pub(crate) raw_scope_labels: bool,
    /// JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The states a listing can select.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum StateArg {
    /// In progress.
    #[value(name = "in_progress", alias = "in-progress")]
    InProgress,
    /// Completed.
    Completed,
    /// Failed.
    Failed,
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only in-progress records whose lease ended at least this long ago ("5m", "1h 30m").
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) stuck: Option<Duration>,
    /// Only records in this state.
    #[arg(long, value_enum)]
    pub(crate) state: Option<StateArg>,
    /// Only scopes that start with this.
    #[arg(long, value_name = "PREFIX")]
    pub(crate) scope_prefix: Option<String>,
    /// The most records to show.
    #[arg(long, default_value_t = 50, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub(crate) limit: u64,
    /// Where to resume: the cursor a previous page printed.
    #[arg(long, value_name = "CURSOR")]
    pub(crate) cursor: Option<String>,
    /// Show keys in full (by default a short hash stands in for each key, as in logs).
    #[arg(long)]
    pub(crate) show_keys: bool,
    /// JSON lines: one record per line, then the cursor when there is more.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// The record's scope.
    pub(crate) scope: String,
    /// The record's key.
    pub(crate) key: String,
    /// Print the stored response too (as text when it is UTF-8, else base64; base64 in
    /// `--json`).
    #[arg(long)]
    pub(crate) show_response: bool,
    /// Print each checkpoint's value too (as text when it is UTF-8, else base64).
    #[arg(long)]
    pub(crate) show_steps: bool,
    /// Also print the downstream idempotency key the work derived for LABEL
    /// (`ctx.derive(LABEL)`), to find what it did at a provider. Repeatable.
    #[arg(long, value_name = "LABEL")]
    pub(crate) derive: Vec<String>,
    /// JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ChangeArgs {
    /// The record's scope.
    pub(crate) scope: String,
    /// The record's key.
    pub(crate) key: String,
    /// Do not ask for confirmation (for scripts).
    #[arg(long, short = 'y')]
    pub(crate) yes: bool,
}

#[derive(Debug, Args)]
pub(crate) struct PurgeArgs {
    /// Records deleted per store call.
    #[arg(long, default_value_t = 1_000, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub(crate) batch: u64,
    /// Stop after deleting this many (default: until none is left).
    #[arg(long, value_name = "N")]
    pub(crate) max: Option<u64>,
}

fn parse_duration(text: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(text)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_read_as_people_write_them() {
        let cli = Cli::try_parse_from(["idem", "list", "--stuck", "1h 30m"]).unwrap();
        let Command::List(list) = cli.command else {
            panic!("not list")
        };
        assert_eq!(list.stuck, Some(Duration::from_secs(5400)));
        assert!(Cli::try_parse_from(["idem", "list", "--stuck", "soon"]).is_err());
    }

    #[test]
    fn limits_are_bounded() {
        assert!(Cli::try_parse_from(["idem", "list", "--limit", "0"]).is_err());
        assert!(Cli::try_parse_from(["idem", "purge", "--batch", "100000"]).is_err());
    }
}
