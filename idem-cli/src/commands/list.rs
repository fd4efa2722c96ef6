//! `idem list`: a page of records, oldest first, as a table or JSON.

use std::io::Write;

use comfy_table::presets::NOTHING;
use comfy_table::{CellAlignment, Table};
use idem_core::connect::Location;
use idem_core::{State, StoreError, admin::Cursor, admin::ListQuery};
use serde::Serialize;

use super::Store;
use crate::cli::{ListArgs, StateArg};
use crate::failure::Failure;
use crate::render::{self, RecordJson};

pub(super) async fn run(
    store: &Store,
    target: &dyn Location,
    args: &ListArgs,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let mut query = ListQuery::new().limit(usize::try_from(args.limit).unwrap_or(usize::MAX));
    if let Some(stuck) = args.stuck {
        query = query.stuck_for(stuck);
    }
    if let Some(state) = args.state {
        query = query.state(match state {
            StateArg::InProgress => State::InProgress,
            StateArg::Completed => State::Completed,
            StateArg::Failed => State::Failed,
        });
    }
    if let Some(prefix) = &args.scope_prefix {
        query = query.scope_prefix(prefix.clone());
    }
    if let Some(cursor) = &args.cursor {
        query = query.after(Cursor::new(cursor.clone()));
    }
    let page = store.list(&query).await.map_err(|err| match err {
        StoreError::InvalidCursor => Failure::Usage {
            what: "--cursor: not a cursor this store printed; start again without it".into(),
        },
        err => Failure::store(target)(err),
    })?;

    if args.json {
        let json = PageJson {
            now: render::time(page.now),
            records: page
                .records
                .iter()
                .map(|listed| {
                    RecordJson::new(
                        &listed.record,
                        listed.response_len,
                        args.show_keys,
                        page.now,
                    )
                })
                .collect(),
            next_cursor: page.next.as_ref().map(|c| c.as_str().to_owned()),
        };
        serde_json::to_writer_pretty(&mut *out, &json)
            .map_err(|err| Failure::Output(err.into()))?;
        writeln!(out)?;
        return Ok(());
    }

    let mut table = Table::new();
    table.load_preset(NOTHING).set_header([
        "CREATED", "STATE", "LEASE", "TOKEN", "SCOPE", "KEY", "RESPONSE", "EXPIRES",
    ]);
    for listed in &page.records {
        let record = &listed.record;
        let state = if record.is_absent(page.now) {
            format!("{} (expired)", record.state.as_str())
        } else {
            record.state.as_str().to_owned()
        };
        table.add_row([
            render::time(record.created_at),
            state,
            render::lease(record, page.now),
            record.token.to_string(),
            record.key.scope().to_owned(),
            render::key(&record.key, args.show_keys),
            listed
                .response_len
                .map_or_else(|| "-".to_owned(), |n| format!("{n} B")),
            render::relative(record.expires_at, page.now),
        ]);
    }
    if let Some(column) = table.column_mut(3) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    if page.records.is_empty() {
        writeln!(out, "no records match in {target}")?;
    } else {
        writeln!(out, "{table}")?;
    }
    if let Some(next) = &page.next {
        writeln!(out, "more records follow: add --cursor {}", next.as_str())?;
    }
    Ok(())
}

#[derive(Serialize)]
struct PageJson {
    now: String,
    records: Vec<RecordJson>,
    next_cursor: Option<String>,
}
