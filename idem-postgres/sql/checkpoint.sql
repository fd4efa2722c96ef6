-- Set one step, fenced, keeping the record one retention past its lease's end.
-- $1 scope, $2 key, $3 token, $4 attempt, $5 step, $6 value, $7 the lease's retention (ms)
UPDATE {table}
SET steps = steps || jsonb_build_object($5::text, encode($6::bytea, 'base64')),
    expires_at = GREATEST(expires_at, lease_until + $7::bigint * interval '1 millisecond')
WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
  AND {in_progress} AND {present}
