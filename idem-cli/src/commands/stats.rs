//! `idem stats`: what the store holds, as text, JSON or Prometheus text.

use std::fmt::Write as _;
use std::io::Write;

use idem_core::connect::Location;
use idem_core::key::scope_short_hash;
use idem_core::{admin::Stats, store::Expiry};
use serde::Serialize;

use super::Store;
use crate::cli::StatsArgs;
use crate::failure::Failure;
use crate::render;

pub(super) async fn run(
    store: &Store,
    target: &dyn Location,
    args: &StatsArgs,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let stats = store
        .stats(args.top)
        .await
        .map_err(Failure::store(target))?;
    let text = if args.prometheus {
        prometheus(&stats, args.raw_scope_labels)
    } else if args.json {
        let mut json = serde_json::to_string_pretty(&StatsJson::new(&stats, store.expiry()))
            .map_err(|err| Failure::Output(err.into()))?;
        json.push('\n');
        json
    } else {
        text(&stats, target, store.expiry())
    };
    out.write_all(text.as_bytes())?;
    Ok(())
}

/// In-progress records past their retention: counted in neither lease group.
fn past_retention(stats: &Stats) -> u64 {
    stats
        .in_progress
        .saturating_sub(stats.in_progress_live)
        .saturating_sub(stats.in_progress_lease_ended)
}

fn text(stats: &Stats, target: &dyn Location, expiry: Expiry) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{target}, counted at {}", render::time(stats.now));
    let _ = writeln!(s, "records                {:>12}", stats.total);
    let _ = writeln!(
        s,
        "  in progress          {:>12}   lease live {}, lease ended {}, past retention {}",
        stats.in_progress,
        stats.in_progress_live,
        stats.in_progress_lease_ended,
        past_retention(stats)
    );
    let _ = writeln!(s, "  completed            {:>12}", stats.completed);
    let _ = writeln!(s, "  failed               {:>12}", stats.failed);
    let backlog = match expiry {
        Expiry::Vanishes => "   (the store deletes them itself)",
        Expiry::Eventually => "   (TTL deletes them; `idem purge` sooner)",
        _ => "   (`idem purge` deletes them)",
    };
    let _ = writeln!(s, "expired, not yet gone  {:>12}{backlog}", stats.absent);
    if stats.unreadable > 0 {
        let _ = writeln!(
            s,
            "unreadable, skipped    {:>12}   (not records idem wrote; the warnings name their key hashes)",
            stats.unreadable
        );
    }
    match stats.oldest_in_progress {
        Some(created) => {
            let _ = writeln!(
                s,
                "oldest in progress     {:>12}   created {}",
                render::duration(stats.oldest_in_progress_age().unwrap_or_default()),
                render::time(created)
            );
        }
        None => {
            let _ = writeln!(s, "oldest in progress     {:>12}", "-");
        }
    }
    if !stats.top_scopes.is_empty() {
        // The hash is the scope's label in `--prometheus`: an alert names it, this finds it.
        let _ = writeln!(s, "largest scopes (label: scope)");
        for (scope, count) in &stats.top_scopes {
            let _ = writeln!(s, "  {count:>12}  {}  {scope}", scope_short_hash(scope));
        }
    }
    s
}

/// Prometheus text exposition format 0.0.4: gauges only, one family per name. Scopes are
/// labelled by their short hash unless `raw_scopes`.
fn prometheus(stats: &Stats, raw_scopes: bool) -> String {
    let mut s = String::new();
    let mut family = |name: &str, help: &str, samples: &[(String, String)]| {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} gauge");
        for (labels, value) in samples {
            let _ = writeln!(s, "{name}{labels} {value}");
        }
    };
    family(
        "idem_store_records",
        "Records the store holds, by state (expired ones not yet deleted included).",
        &[
            (
                "{state=\"in_progress\"}".into(),
                stats.in_progress.to_string(),
            ),
            ("{state=\"completed\"}".into(), stats.completed.to_string()),
            ("{state=\"failed\"}".into(), stats.failed.to_string()),
        ],
    );
    family(
        "idem_store_in_progress_records",
        "In-progress records by lease: live, ended (abandoned until a retry takes over), or past_retention (a retry starts afresh; a purge deletes them).",
        &[
            (
                "{lease=\"live\"}".into(),
                stats.in_progress_live.to_string(),
            ),
            (
                "{lease=\"ended\"}".into(),
                stats.in_progress_lease_ended.to_string(),
            ),
            (
                "{lease=\"past_retention\"}".into(),
                past_retention(stats).to_string(),
            ),
        ],
    );
    family(
        "idem_store_expired_records",
        "Expired records with no live lease not yet deleted: the cleanup backlog.",
        &[(String::new(), stats.absent.to_string())],
    );
    family(
        "idem_store_oldest_in_progress_age_seconds",
        "Age of the oldest in-progress record (0 when there is none).",
        &[(
            String::new(),
            format!(
                "{:.3}",
                stats
                    .oldest_in_progress_age()
                    .unwrap_or_default()
                    .as_secs_f64()
            ),
        )],
    );
    family(
        "idem_store_scope_records",
        "Records of the largest scopes, labelled by the scope's short hash (key flooding shows here).",
        &stats
            .top_scopes
            .iter()
            .map(|(scope, count)| {
                let scope = match raw_scopes {
                    true => label(scope),
                    false => scope_short_hash(scope).to_string(),
                };
                (format!("{{scope=\"{scope}\"}}"), count.to_string())
            })
            .collect::<Vec<_>>(),
    );
    family(
        "idem_store_stats_timestamp_seconds",
        "When the store counted, by its own clock.",
        &[(
            String::new(),
            format!("{:.3}", stats.now.as_unix_millis() as f64 / 1000.0),
        )],
    );
    s
}

/// A label value with `\`, `"` and newlines escaped, as the text format requires.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[derive(Serialize)]
struct StatsJson {
    now: String,
    total: u64,
    in_progress: u64,
    in_progress_live: u64,
    in_progress_lease_ended: u64,
    in_progress_past_retention: u64,
    completed: u64,
    failed: u64,
    expired_not_deleted: u64,
    unreadable: u64,
    oldest_in_progress_created: Option<String>,
    oldest_in_progress_age_seconds: Option<f64>,
    top_scopes: Vec<ScopeJson>,
    expiry: &'static str,
}

#[derive(Serialize)]
struct ScopeJson {
    scope: String,
    records: u64,
}

impl StatsJson {
    fn new(stats: &Stats, expiry: Expiry) -> Self {
        Self {
            now: render::time(stats.now),
            total: stats.total,
            in_progress: stats.in_progress,
            in_progress_live: stats.in_progress_live,
            in_progress_lease_ended: stats.in_progress_lease_ended,
            in_progress_past_retention: past_retention(stats),
            completed: stats.completed,
            failed: stats.failed,
            expired_not_deleted: stats.absent,
            unreadable: stats.unreadable,
            oldest_in_progress_created: stats.oldest_in_progress.map(render::time),
            oldest_in_progress_age_seconds: stats.oldest_in_progress_age().map(|d| d.as_secs_f64()),
            top_scopes: stats
                .top_scopes
                .iter()
                .map(|(scope, records)| ScopeJson {
                    scope: scope.clone(),
                    records: *records,
                })
                .collect(),
            expiry: match expiry {
                Expiry::Vanishes => "vanishes",
                Expiry::Eventually => "eventually",
                _ => "purge",
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use idem_core::Timestamp;

    use super::*;

    #[test]
    fn scopes_are_labelled_by_their_short_hash_unless_asked() {
        let mut stats = Stats::default();
        stats.top_scopes = vec![("acct_42/POST /payments".into(), 9)];
        let text = prometheus(&stats, false);
        let hash = scope_short_hash("acct_42/POST /payments").to_string();
        assert!(
            text.contains(&format!("idem_store_scope_records{{scope=\"{hash}\"}} 9\n")),
            "{text}"
        );
        assert!(!text.contains("acct_42"), "a raw scope in a label: {text}");
        assert!(prometheus(&stats, true).contains("scope=\"acct_42/POST /payments\""));
    }

    #[test]
    fn prometheus_text_is_well_formed() {
        let mut stats = Stats::default();
        stats.in_progress = 4;
        stats.in_progress_live = 1;
        stats.in_progress_lease_ended = 2;
        stats.absent = 7;
        stats.now = Timestamp::from_unix_millis(10_000);
        stats.oldest_in_progress = Some(Timestamp::from_unix_millis(4_500));
        stats.top_scopes = vec![("tenant \"a\"\\b\n".into(), 9)];
        let text = prometheus(&stats, true);
        assert!(
            text.contains("idem_store_records{state=\"in_progress\"} 4\n"),
            "{text}"
        );
        assert!(
            text.contains("idem_store_in_progress_records{lease=\"ended\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("idem_store_in_progress_records{lease=\"past_retention\"} 1\n"),
            "the one in progress in neither lease group: {text}"
        );
        assert!(text.contains("idem_store_expired_records 7\n"), "{text}");
        assert!(
            text.contains("idem_store_oldest_in_progress_age_seconds 5.500\n"),
            "{text}"
        );
        assert!(
            text.contains("idem_store_scope_records{scope=\"tenant \\\"a\\\"\\\\b\\n\"} 9\n"),
            "{text}"
        );
        // Every sample line belongs to a family declared just before it.
        let mut declared = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                declared = rest.split(' ').next().map(str::to_owned);
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                assert_eq!(Some(name), declared.as_deref(), "{line}");
            }
        }
    }
}
