-- Delete one batch of absent records: expired, and held by no live lease. SKIP LOCKED lets
-- several purgers run at once without waiting on each other or on claims. $1 batch size
DELETE FROM {table}
WHERE ctid IN (
    SELECT ctid FROM {table}
    WHERE expires_at <= now() AND NOT {present}
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
