-- Extend a live lease from now, fenced, keeping the record one retention past the new end.
-- A lease that has ended (released, or run out) is not renewed: its owner let go.
-- $1 scope, $2 key, $3 token, $4 attempt, $5 extend (ms), $6 the lease's retention (ms)
UPDATE {table}
SET lease_until = now() + $5::bigint * interval '1 millisecond',
    expires_at = GREATEST(expires_at,
                          now() + ($5::bigint + $6::bigint) * interval '1 millisecond')
WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
  AND {in_progress} AND lease_until > now()
RETURNING floor(extract(epoch FROM lease_until) * 1000)::bigint AS lease_until_ms
