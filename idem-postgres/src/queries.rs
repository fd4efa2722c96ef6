//! The SQL, read from `sql/*.sql` and specialised once for the configured table.

use std::sync::Arc;

use idem_core::raw::MAX_TOKEN;

use crate::table::TableName;

const MIGRATE: &str = include_str!("../sql/migrate.sql");
const CREATE_SCHEMA: &str = include_str!("../sql/create_schema.sql");
/// Whether a schema exists (`$1`: its name).
pub(crate) const SCHEMA_EXISTS: &str = include_str!("../sql/schema_exists.sql");
const COLUMNS: &str = include_str!("../sql/columns.sql");
const CLAIM: &str = include_str!("../sql/claim.sql");
const CLAIM_UPDATE: &str = include_str!("../sql/claim_update.sql");
const SELECT: &str = include_str!("../sql/select.sql");
const FINISH: &str = include_str!("../sql/finish.sql");
const FINISHED: &str = include_str!("../sql/finished.sql");
const RELEASE: &str = include_str!("../sql/release.sql");
const END_LEASE: &str = include_str!("../sql/end_lease.sql");
const RENEW: &str = include_str!("../sql/renew.sql");
const CHECKPOINT: &str = include_str!("../sql/checkpoint.sql");
const PURGE: &str = include_str!("../sql/purge.sql");
const ADMIN_LIST: &str = include_str!("../sql/admin_list.sql");
const ADMIN_STATS: &str = include_str!("../sql/admin_stats.sql");
const ADMIN_RELEASE: &str = include_str!("../sql/admin_release.sql");
const ADMIN_DELETE: &str = include_str!("../sql/admin_delete.sql");
const ADMIN_RAW: &str = include_str!("../sql/admin_raw.sql");

/// When a row counts as present (docs/DESIGN.md §4): unexpired, or held by a live lease.
/// Every statement that decides between "there is a record" and "there is none" uses it,
/// as `{present}`, or `{r.present}` for the row aliased `r` (the claim's takeover, once
/// its condition holds, tests the expiry alone: claim.sql says why).
fn present(row: &str) -> String {
    format!(
        "({row}expires_at > now() OR ({row}state = 'in_progress' AND {row}lease_until > now()))"
    )
}

/// That the row holds values idem writes: a known state, a 32-byte fingerprint, a 16-byte
/// attempt and a token from 1 to `MAX_TOKEN`. The table has no `CHECK` constraints for
/// these (PostgreSQL prepares each one's expression again on every insert and update: a
/// fifth or more of a fresh key's engine time, BENCHMARKS.md). idem binds only such
/// values, every read refuses a row without them as corrupt, and the statements that
/// decide on a row without decoding it (the claim taking it for absent, the purge deleting
/// it, an operator's release, `stats` counting it absent) test this first, so that a row
/// written by hand is never taken for absent. As `{valid}`, or `{r.valid}` for the row
/// aliased `r`.
fn valid(row: &str) -> String {
    format!(
        "({row}state IN ('in_progress', 'completed', 'failed') \
         AND octet_length({row}fingerprint) = 32 AND octet_length({row}attempt) = 16 \
         AND {row}token BETWEEN 1 AND {MAX_TOKEN})"
    )
}

/// That the row is in progress, in the statements that find their row by key. Written so
/// that the planner cannot prove the stuck-work index's predicate (`state =
/// 'in_progress'`) from it: that index has no key column, so a lookup through it reads
/// every record in flight, and statistics gathered while little was in flight make it
/// look the cheaper path. The state is never NULL, so `IS TRUE` changes no answer.
const IN_PROGRESS: &str = "(state = 'in_progress') IS TRUE";

/// `sql` without its whole-line comments, for a fragment spliced into a statement.
fn without_comments(sql: &str) -> String {
    sql.lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every statement the store runs, for one table.
#[derive(Debug)]
pub(crate) struct Queries {
    pub(crate) migrate: Arc<str>,
    /// `CREATE SCHEMA IF NOT EXISTS` for a schema-qualified table.
    pub(crate) create_schema: Option<Arc<str>>,
    /// A claim that writes only a new row: every answer but a takeover or a replacement.
    pub(crate) claim: Arc<str>,
    /// A claim that also writes over an absent row or takes an ended lease over.
    pub(crate) claim_update: Arc<str>,
    pub(crate) select: Arc<str>,
    pub(crate) finish: Arc<str>,
    /// Whether a finish that wrote nothing finds its own result already stored.
    pub(crate) finished: Arc<str>,
    pub(crate) release: Arc<str>,
    /// Ends a lease and changes nothing else.
    pub(crate) end_lease: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) checkpoint: Arc<str>,
    pub(crate) purge: Arc<str>,
    pub(crate) admin_list: Arc<str>,
    pub(crate) admin_stats: Arc<str>,
    pub(crate) admin_release: Arc<str>,
    pub(crate) admin_delete: Arc<str>,
    pub(crate) admin_raw: Arc<str>,
}

impl Queries {
    pub(crate) fn for_table(table: &TableName) -> Self {
        // Only validated identifiers are spliced in; every value is a bind parameter.
        let render_with = |sql: &str, steps_when: &str, response: &str| -> Arc<str> {
            let columns = without_comments(COLUMNS);
            sql.replace("{columns}", columns.trim_end())
                .replace("{steps_when}", steps_when)
                .replace("{response}", response)
                .replace("{r.present}", &present("r."))
                .replace("{present}", &present(""))
                .replace("{r.valid}", &valid("r."))
                .replace("{valid}", &valid(""))
                .replace("{max_token}", &MAX_TOKEN.to_string())
                .replace("{in_progress}", IN_PROGRESS)
                .replace("{table}", table.qualified())
                .replace("{index_expires_at}", &table.index("expires_at"))
                .replace(
                    "{index_in_progress_lease}",
                    &table.index("in_progress_lease"),
                )
                .replace("{index_created}", &table.index("created"))
                .into()
        };
        let render = |sql: &str, steps_when: &str| render_with(sql, steps_when, "response");
        let claim = |on_conflict: &str| CLAIM.replace("{on_conflict}", on_conflict.trim_end());
        let claim_steps = "state = 'in_progress' AND steps <> '{}'::jsonb";
        let render_all = |sql: &str| render(sql, "true");
        Self {
            migrate: render_all(MIGRATE),
            create_schema: table
                .schema()
                .map(|schema| CREATE_SCHEMA.replace("{schema}", schema).into()),
            // A fresh claim's steps are empty, and a replay needs none: nothing to send.
            claim: render(&claim("DO NOTHING"), claim_steps),
            // Its own first line, so that the two forms' texts in pg_stat_statements read
            // apart at a glance (their query ids differ anyway).
            claim_update: render(
                &format!(
                    "-- The claim's second form: ON CONFLICT DO UPDATE.\n{}",
                    claim(&without_comments(CLAIM_UPDATE))
                ),
                claim_steps,
            ),
            select: render_all(SELECT),
            finish: render_all(FINISH),
            finished: render_all(FINISHED),
            release: render_all(RELEASE),
            end_lease: render_all(END_LEASE),
            renew: render_all(RENEW),
            checkpoint: render_all(CHECKPOINT),
            purge: render_all(PURGE),
            admin_list: render_with(ADMIN_LIST, "true", "CASE WHEN $8 THEN r.response END"),
            admin_stats: render_all(ADMIN_STATS),
            admin_release: render_all(ADMIN_RELEASE),
            admin_delete: render_all(ADMIN_DELETE),
            admin_raw: render_all(ADMIN_RAW),
        }
    }
}

#[cfg(test)]
mod tests;
