//! Listing for stores that read every record to list them.

use crate::admin::{Cursor, ListQuery, Listed, Page};
use crate::{Record, StoreError, Timestamp};

/// Selects one page from `records` (in any order) for `query` at `now`: for stores that
/// read every record to list them. Orders oldest first, then by scope and key.
///
/// # Errors
/// [`StoreError::InvalidCursor`] for a cursor made elsewhere.
pub fn select_page(
    records: impl IntoIterator<Item = Record>,
    query: &ListQuery,
    now: Timestamp,
) -> Result<Page, StoreError> {
    let after = query.after.as_ref().map(Cursor::position).transpose()?;
    let mut picked: Vec<Record> = records
        .into_iter()
        .filter(|record| query.matches(record, now))
        .filter(|record| {
            after
                .as_ref()
                .is_none_or(|(created, key)| (record.created_at, &record.key) > (*created, key))
        })
        .collect();
    picked.sort_by(|a, b| (a.created_at, &a.key).cmp(&(b.created_at, &b.key)));
    let size = query.page_size();
    let next = (picked.len() > size).then(|| Cursor::after_record(&picked[size - 1]));
    picked.truncate(size);
    let records = picked
        .into_iter()
        .map(|record| Listed::new(record, query.with_responses))
        .collect();
    Ok(Page::new(records, next, now))
}
