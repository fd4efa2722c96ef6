-- Extend the lease from now, fenced. $1 scope, $2 key, $3 token, $4 attempt, $5 extend (ms)
UPDATE {table}
SET lease_until = now() + $5::bigint * interval '1 millisecond'
WHERE scope = $1 AND key = $2 AND token = $3 AND attempt = $4
  AND state = 'in_progress' AND {present}
RETURNING floor(extract(epoch FROM lease_until) * 1000)::bigint AS lease_until_ms
