-- Delete one batch of absent records: expired, and held by no live lease. A row idem did not
-- write (`valid` in queries.rs) stays for an operator to read: its state cannot say whether a
-- lease holds it. SKIP LOCKED lets several purgers run at once without waiting on each
-- other or on claims. $1 batch size
--
-- ORDER BY expiry keeps the plan on the expiry index, oldest first: without it, once the
-- statistics say many rows have expired (they are gathered before the rows were purged),
-- the planner may prefer reading the table from its start until the batch is full, and
-- on a table whose early pages hold new records that read can run through millions of
-- live rows.
DELETE FROM {table}
WHERE ctid IN (
    SELECT ctid FROM {table}
    WHERE expires_at <= now() AND NOT {present} AND {valid}
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
