-- Delete one batch of expired records, never one whose lease is live. SKIP LOCKED lets
-- several purgers run at once without waiting on each other or on claims. $1 batch size
DELETE FROM {table}
WHERE ctid IN (
    SELECT ctid FROM {table}
    WHERE expires_at <= now()
      AND NOT (state = 'in_progress' AND lease_until > now())
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
