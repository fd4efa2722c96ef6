-- End the lease now, fenced. $1 scope, $2 key, $3 token, $4 attempt
-- Without a step nothing took effect, so the record's lifetime ends too: absent at once,
-- and the next claim is fresh under any fingerprint. With steps it is kept for a
-- takeover, with its expiry as it is: its checkpoints kept it one retention past the
-- lease's end, and a lease that ran out already keeps its end.
UPDATE {table}
SET lease_until = LEAST(lease_until, now()),
    expires_at = CASE WHEN steps = '{}'::jsonb THEN now() ELSE expires_at END
WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
  AND {in_progress} AND {present}
