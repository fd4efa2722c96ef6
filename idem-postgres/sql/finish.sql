-- complete or fail, fenced: the owner's record, in progress and present, takes its result.
-- A result stored late (heartbeats or a takeover kept the work past the retention) is kept
-- one whole retention after now: expires_at moves to max(expires_at, now() + the lease's
-- retention). A row when it wrote; none otherwise, and then finished.sql tells a retry
-- whose first try landed from a fenced owner.
-- $1 scope, $2 key, $3 token, $4 attempt, $5 response, $6 terminal state,
-- $7 the lease's retention (ms)
UPDATE {table}
SET state = $6, response = $5,
    expires_at = GREATEST(expires_at, now() + $7::bigint * interval '1 millisecond')
WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
  AND {in_progress} AND {present}
RETURNING true AS applied
