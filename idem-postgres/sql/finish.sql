-- complete or fail, fenced. Applied when this call wrote, or when an earlier call by the
-- same owner already left the record in the same terminal state (a retry after a lost
-- answer). A result stored late (heartbeats or a takeover kept the work past the
-- retention) is kept one whole retention after now: expires_at moves to
-- max(expires_at, now() + the lease's retention).
-- $1 scope, $2 key, $3 token, $4 attempt, $5 response, $6 terminal state,
-- $7 the lease's retention (ms)
WITH locked AS (
    -- The owner's row as it is now. A retry waits (in the update below, or here) for the
    -- row lock its own first try holds; once that commits, a locking read returns the
    -- committed version, where a plain read would still see this statement's snapshot
    -- (in progress) and call the stored result fenced. It is read only when the update
    -- wrote nothing, and takes the lock the update takes anyway.
    SELECT state, expires_at
    FROM {table}
    WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
    FOR NO KEY UPDATE
),
finished AS (
    UPDATE {table}
    SET state = $6, response = $5,
        expires_at = GREATEST(expires_at, now() + $7::bigint * interval '1 millisecond')
    WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
      AND {in_progress} AND {present}
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM finished)
    OR EXISTS (SELECT 1 FROM locked WHERE state = $6 AND expires_at > now()) AS applied
